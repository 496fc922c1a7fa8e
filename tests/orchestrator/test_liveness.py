"""The leader's watch over time alone: silent workers buried and their jobs given to the live ones,
a heartbeat held by another consumer not taken for a death, loads rebalanced, drift healed."""

from __future__ import annotations

from orchestrator.liveness import Liveness
from orchestrator.outbox import Outbox
from runplane.basics.ownership import job_digest
from runplane.basics.stamps import Stamp
from runplane.v1 import bus_pb2
from tests.orchestrator.sections import HEARTBEAT, Sections, sections
from tests.simulation.twins import WorkerRow


async def _owned(s: Sections, worker_id: str, count: int) -> list[int]:
    """``count`` jobs claimed by ``worker_id``."""
    job_ids = [s.job() for _ in range(count)]
    stamp = s.state.clock.tick()
    await s.state.store.upsert_pending(job_ids, [1] * count, worker_id, stamp, 0)
    await s.state.store.claim(worker_id, job_ids, stamp)
    return job_ids


def _liveness(s: Sections) -> Liveness:
    return Liveness(s.state, Outbox(s.state))


async def test_a_silent_worker_is_buried_and_its_jobs_go_to_a_live_workers_queue() -> None:
    s = sections()
    liveness = _liveness(s)
    s.worker("quiet")
    s.worker("beating")
    s.db.workers["quiet"] = WorkerRow("alive", 3, 0)
    job_ids = await _owned(s, "quiet", 3)
    s.clock.at += HEARTBEAT / 2
    await liveness.declare_dead()
    assert s.state.is_alive("quiet")  # not silent long enough
    s.clock.at += 3 * HEARTBEAT  # past dead_after; the other one beat just now
    s.state.workers["beating"].last_seen = s.clock.at
    liveness._last_tick = s.clock.at - HEARTBEAT / 10  # its own loop has been running
    await liveness.declare_dead()
    assert not s.state.is_alive("quiet")
    assert s.state.workers["quiet"].buried
    assert s.db.workers["quiet"].state == "dead"
    assert s.state.topology.worker("quiet") not in s.broker.queues
    [assign] = await s.received(s.state.topology.worker("beating"), 1)
    assert isinstance(assign, bus_pb2.Assign)
    assert sorted(j.job.job_id for j in assign.jobs) == job_ids
    assert {(o.worker_id, o.state) for o in await s.state.store.ownership(job_ids)} == {("beating", "pending")}


async def test_nobody_is_declared_dead_while_another_consumer_holds_heartbeats() -> None:
    s = sections()
    liveness = _liveness(s)
    s.worker("quiet")
    s.worker("beating")
    s.broker.queues[s.state.topology.orchestrator].consumers = 2  # a frozen predecessor's, still attached
    await liveness.count_orchestrator_consumers()
    s.clock.at += 4 * HEARTBEAT
    s.state.workers["beating"].last_seen = s.clock.at
    liveness._last_tick = s.clock.at - HEARTBEAT / 10
    await liveness.declare_dead()
    assert s.state.is_alive("quiet")
    s.broker.queues[s.state.topology.orchestrator].consumers = 1
    await liveness.count_orchestrator_consumers()
    s.clock.at += 4 * HEARTBEAT
    s.state.workers["beating"].last_seen = s.clock.at
    liveness._last_tick = s.clock.at - HEARTBEAT / 10
    await liveness.declare_dead()
    assert not s.state.is_alive("quiet")


async def test_a_leader_that_did_not_run_for_an_interval_declares_nobody_dead() -> None:
    s = sections()
    liveness = _liveness(s)
    s.worker("quiet")
    s.worker("beating")
    s.clock.at += 4 * HEARTBEAT  # the leader itself stood still meanwhile: its last tick is that old
    s.state.workers["beating"].last_seen = s.clock.at
    await liveness.declare_dead()
    assert s.state.is_alive("quiet")
    assert s.state.workers["quiet"].last_seen == s.clock.at  # its deadline starts again


async def test_loads_out_of_tolerance_are_rebalanced_by_moves_to_the_lighter_worker() -> None:
    s = sections()
    liveness = _liveness(s)
    s.worker("heavy")
    s.worker("light")
    s.clock.at += 2 * HEARTBEAT  # both joined long enough ago
    moved = await _owned(s, "heavy", 10)
    await liveness.rebalance()
    assigns = await s.received(s.state.topology.worker("light"), 1)
    revokes = await s.received(s.state.topology.worker("heavy"), 1)
    [assign], [revoke] = assigns, revokes
    assert isinstance(assign, bus_pb2.Assign) and isinstance(revoke, bus_pb2.Revoke)
    given = [j.job.job_id for j in assign.jobs]
    assert len(given) == 5 and set(given) < set(moved)
    assert list(revoke.job_ids) == given
    assert Stamp.from_proto(revoke.stamp) < Stamp.from_proto(assign.stamp)


async def test_no_rebalance_while_an_assign_is_pending() -> None:
    s = sections()
    liveness = _liveness(s)
    s.worker("heavy")
    s.worker("light")
    s.clock.at += 2 * HEARTBEAT
    await _owned(s, "heavy", 10)
    await s.state.store.upsert_pending([s.job()], [1], None, s.state.clock.tick(), 0)
    await liveness.rebalance()
    assert s.queued(s.state.topology.worker("light")) == []


async def test_a_worker_that_does_not_hold_what_it_owns_for_a_claim_timeout_is_told_to_drop_and_reassigned() -> None:
    s = sections(claim_timeout=5.0)
    liveness = _liveness(s)
    info = s.worker("w1")
    job_ids = await _owned(s, "w1", 2)
    info.owned_digest = job_digest(job_ids[0], 1)  # it lost the second one
    await liveness.heal_drift()
    assert info.drifted_since == s.clock.at
    s.clock.at += 5.0
    await liveness.heal_drift()
    drop, assign = await s.received(s.state.topology.worker("w1"), 2)
    assert isinstance(drop, bus_pb2.Revoke) and drop.drop_all
    assert isinstance(assign, bus_pb2.Assign)
    assert sorted(j.job.job_id for j in assign.jobs) == job_ids
    assert info.floor == Stamp.from_proto(drop.stamp) < Stamp.from_proto(assign.stamp)


async def test_a_worker_whose_digest_matches_is_left_alone() -> None:
    s = sections(claim_timeout=5.0)
    liveness = _liveness(s)
    info = s.worker("w1")
    job_ids = await _owned(s, "w1", 2)
    info.owned_digest = job_digest(job_ids[0], 1) ^ job_digest(job_ids[1], 1)
    for _ in range(3):
        await liveness.heal_drift()
        s.clock.at += 5.0
    assert info.drifted_since is None
    assert s.queued(s.state.topology.worker("w1")) == []
