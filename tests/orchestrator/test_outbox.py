"""The leader's outbox alone: every message stamped, ownership recorded before it goes out."""

from __future__ import annotations

from orchestrator.outbox import Outbox
from runplane.basics.stamps import Stamp
from runplane.v1 import bus_pb2
from tests.orchestrator.sections import sections


async def test_an_assign_is_recorded_pending_before_it_is_published() -> None:
    s = sections()
    outbox = Outbox(s.state)
    job_ids = [s.job(), s.job()]
    rows = [r.definition() for r in await s.state.store.job_states(job_ids)]
    outgoing = await outbox.record_assigns(rows, worker_id=None, fires_after={job_ids[0]: 123})
    assert [(o.job_id, o.state, o.worker_id) for o in await s.state.store.ownership(job_ids)] == [
        (job_ids[0], "pending", None),
        (job_ids[1], "pending", None),
    ]
    assert s.queued(s.state.topology.assign) == []  # recorded, not sent yet
    await outbox.publish_assigns(outgoing)
    [assign] = await s.received(s.state.topology.assign, 1)
    assert isinstance(assign, bus_pb2.Assign)
    assert [j.job.job_id for j in assign.jobs] == job_ids
    assert [j.last_fire_ts for j in assign.jobs] == [123, 0]
    assert Stamp.from_proto(assign.stamp) == Stamp(1, 1)


async def test_assigns_are_cut_into_batches_each_with_its_own_stamp() -> None:
    s = sections(assign_batch_size=2)
    outbox = Outbox(s.state)
    job_ids = [s.job() for _ in range(5)]
    rows = [r.definition() for r in await s.state.store.job_states(job_ids)]
    await outbox.assign(rows, worker_id=None, fires_after={})
    assigns = await s.received(s.state.topology.assign, 3)
    assert [[j.job.job_id for j in a.jobs] for a in assigns if isinstance(a, bus_pb2.Assign)] == [
        job_ids[:2],
        job_ids[2:4],
        job_ids[4:],
    ]
    assert [Stamp.from_proto(a.stamp).clock for a in assigns if isinstance(a, bus_pb2.Assign)] == [1, 2, 3]


async def test_a_revoke_goes_only_to_a_live_worker_and_is_noted_as_told() -> None:
    s = sections()
    outbox = Outbox(s.state)
    live = s.worker("w1")
    s.worker("w2", alive=False)
    await outbox.revoke("w1", [7])
    await outbox.revoke("w2", [8])
    await outbox.revoke("unknown", [9])
    [revoke] = await s.received(s.state.topology.worker("w1"), 1)
    assert isinstance(revoke, bus_pb2.Revoke)
    assert list(revoke.job_ids) == [7]
    assert live.told == Stamp.from_proto(revoke.stamp)
    assert s.queued(s.state.topology.worker("w2")) == []


async def test_a_move_is_recorded_then_revoked_from_the_donor_under_an_older_stamp_then_assigned() -> None:
    s = sections()
    outbox = Outbox(s.state)
    s.worker("donor")
    s.worker("target")
    job_id = s.job()
    [row] = [r.definition() for r in await s.state.store.job_states([job_id])]
    await outbox.move([row], "donor", to="target", fires_after={job_id: 5})
    [own] = await s.state.store.ownership([job_id])
    assert (own.worker_id, own.state) == ("target", "pending")
    [revoke] = await s.received(s.state.topology.worker("donor"), 1)
    [assign] = await s.received(s.state.topology.worker("target"), 1)
    assert isinstance(revoke, bus_pb2.Revoke) and isinstance(assign, bus_pb2.Assign)
    assert Stamp.from_proto(revoke.stamp) < Stamp.from_proto(assign.stamp) == Stamp(own.term, own.clock)


async def test_an_update_goes_to_each_live_owner_and_its_version_is_noted_as_sent() -> None:
    s = sections()
    outbox = Outbox(s.state)
    s.worker("w1")
    owned, orphan = s.job(), s.job()
    for job_id, owner in ((owned, "w1"), (orphan, "gone")):
        await s.state.store.upsert_pending([job_id], [1], owner, s.state.clock.tick(), 0)
    s.db.change_job(owned, cron="*/7 * * * *")
    await outbox.send_updates(await s.state.store.job_states([owned, orphan]))
    [update] = await s.received(s.state.topology.worker("w1"), 1)
    assert isinstance(update, bus_pb2.Update)
    assert (update.job.job.job_id, update.job.job.cron, update.job.job.version) == (owned, "*/7 * * * *", 2)
    assert s.db.ownership[owned].version == 2
    assert s.db.ownership[orphan].version == 1
