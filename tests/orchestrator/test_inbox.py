"""The leader's inbox alone: heartbeats register workers or tell them to drop everything, claims
are accepted, or refused and their Assign sent out again."""

from __future__ import annotations

from google.protobuf.message import Message

from orchestrator.inbox import Inbox
from orchestrator.job_sync import JobSync
from orchestrator.outbox import Outbox
from runplane.adapters.bus import Delivery
from runplane.basics.stamps import Stamp
from runplane.v1 import bus_pb2
from tests.orchestrator.sections import Sections, sections

DELIVERY = Delivery(redelivered=False, headers={})


def _inbox(s: Sections) -> Inbox:
    outbox = Outbox(s.state)
    return Inbox(s.state, outbox, JobSync(s.state, outbox))


async def _deliver(inbox: Inbox, message: Message) -> None:
    await inbox.on_message(message, DELIVERY)


async def test_a_registering_beat_registers_a_new_worker() -> None:
    s = sections()
    inbox = _inbox(s)
    await _deliver(inbox, bus_pb2.Heartbeat(worker_id="w1", registering=True, jobs_owned=0))
    assert s.state.is_alive("w1")
    assert s.db.workers["w1"].state == "alive"
    await _deliver(inbox, bus_pb2.Heartbeat(worker_id="w1", jobs_owned=4, owned_digest=99))
    assert (s.state.workers["w1"].jobs_owned, s.db.workers["w1"].owned_digest) == (4, 99)


async def test_a_worker_not_known_alive_is_told_to_drop_everything_under_one_stamp_per_death() -> None:
    s = sections()
    inbox = _inbox(s)
    s.broker.declare(s.state.topology.worker("w1"))
    for _ in range(2):
        await _deliver(inbox, bus_pb2.Heartbeat(worker_id="w1", jobs_owned=3))
    first, second = await s.received(s.state.topology.worker("w1"), 2)
    assert isinstance(first, bus_pb2.Revoke) and isinstance(second, bus_pb2.Revoke)
    assert first.drop_all and second.drop_all
    assert first.stamp == second.stamp
    assert not s.state.is_alive("w1")


async def test_a_claim_of_a_pending_assign_makes_the_claimer_the_owner() -> None:
    s = sections()
    inbox = _inbox(s)
    s.worker("w1")
    job_ids = [s.job(), s.job()]
    stamp = s.state.clock.tick()
    await s.state.store.upsert_pending(job_ids, [1, 1], None, stamp, 0)
    await _deliver(inbox, bus_pb2.Claimed(worker_id="w1", stamp=stamp.to_proto(), job_ids=job_ids))
    assert {(o.worker_id, o.state) for o in await s.state.store.ownership(job_ids)} == {("w1", "claimed")}
    assert s.queued(s.state.topology.worker("w1")) == []


async def test_a_job_changed_while_its_assign_was_pending_is_sent_to_the_claimer_as_an_update() -> None:
    s = sections()
    inbox = _inbox(s)
    s.worker("w1")
    job_id = s.job()
    stamp = s.state.clock.tick()
    await s.state.store.upsert_pending([job_id], [1], None, stamp, 0)
    s.db.change_job(job_id, cron="*/9 * * * *")
    await _deliver(inbox, bus_pb2.Claimed(worker_id="w1", stamp=stamp.to_proto(), job_ids=[job_id]))
    [update] = await s.received(s.state.topology.worker("w1"), 1)
    assert isinstance(update, bus_pb2.Update)
    assert (update.job.job.job_id, update.job.job.version) == (job_id, 2)


async def test_a_dead_workers_claim_is_refused_and_its_assign_goes_out_again() -> None:
    s = sections()
    inbox = _inbox(s)
    s.worker("w1")
    dead = s.worker("dead", alive=False)
    job_id = s.job()
    stamp = s.state.clock.tick()
    await s.state.store.upsert_pending([job_id], [1], None, stamp, 0)
    await _deliver(inbox, bus_pb2.Claimed(worker_id="dead", stamp=stamp.to_proto(), job_ids=[job_id]))
    [own] = await s.state.store.ownership([job_id])
    assert (own.worker_id, own.state) == (None, "pending")
    assert Stamp(own.term, own.clock) > stamp  # sent again under a new stamp
    [assign] = await s.received(s.state.topology.assign, 1)
    assert isinstance(assign, bus_pb2.Assign) and [j.job.job_id for j in assign.jobs] == [job_id]
    # Its Revoke waits until it registers again, stamped before the new Assign.
    assert dead.refused == {job_id: dead.refused[job_id]}
    assert stamp < dead.refused[job_id] < Stamp(own.term, own.clock)
    assert s.queued(s.state.topology.worker("dead")) == []
