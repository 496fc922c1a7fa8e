"""The leader's decisions about its workers, without I/O."""

from __future__ import annotations

from orchestrator.decisions import (
    Beat,
    WorkerInfo,
    claim_refused,
    drifted,
    judge_beat,
    registered,
    revoke_stamps,
    silent_workers,
)
from orchestrator.rows import Ownership
from runplane.basics.stamps import ZERO, LogicalClock, Stamp
from runplane.v1 import bus_pb2

INTERVAL = 1.0
DEAD_AFTER = 6.0


def _silent(workers: dict[str, WorkerInfo], now: float, *, late_tick: bool = False, hearing: bool = True) -> list[str]:
    return silent_workers(
        workers, now=now, late_tick=late_tick, hearing=hearing, interval=INTERVAL, dead_after=DEAD_AFTER
    )


def test_a_worker_silent_past_its_deadline_while_others_beat_is_dead() -> None:
    workers = {"w1": WorkerInfo(True, 100.0, 0.0), "w2": WorkerInfo(True, 92.0, 0.0), "w3": WorkerInfo(False, 0.0, 0.0)}
    assert _silent(workers, 100.5) == ["w2"]


def test_when_the_leader_hears_nobody_nobody_dies_and_deadlines_start_again() -> None:
    for hearing, late_tick, beat in ((False, False, 100.0), (True, True, 100.0), (True, False, 97.0)):
        workers = {"w1": WorkerInfo(True, beat, 0.0), "w2": WorkerInfo(True, 90.0, 0.0)}
        assert _silent(workers, 100.5, late_tick=late_tick, hearing=hearing) == []
        assert [w.last_seen for w in workers.values()] == [100.5, 100.5]


def _beat(*, registering: bool, dropped: Stamp = ZERO) -> bus_pb2.Heartbeat:
    return bus_pb2.Heartbeat(worker_id="w1", registering=registering, dropped=dropped.to_proto())


def test_a_buried_worker_registers_again_only_after_dropping_as_told() -> None:
    assert judge_beat(WorkerInfo(True, 0.0, 0.0), _beat(registering=False)) is Beat.LIVE
    assert judge_beat(None, _beat(registering=True)) is Beat.REGISTER
    assert judge_beat(None, _beat(registering=False)) is Beat.DROP_ALL
    buried = WorkerInfo(False, 0.0, 0.0, buried=True, drop_stamp=Stamp(2, 7))
    assert judge_beat(buried, _beat(registering=True, dropped=Stamp(2, 6))) is Beat.DROP_ALL
    assert judge_beat(buried, _beat(registering=True, dropped=Stamp(2, 7))) is Beat.REGISTER
    no_drop_sent_yet = WorkerInfo(False, 0.0, 0.0, buried=True)
    assert judge_beat(no_drop_sent_yet, _beat(registering=True, dropped=Stamp(2, 7))) is Beat.DROP_ALL


def test_registering_keeps_the_floor_and_revokes_refused_claims_oldest_first() -> None:
    dead = WorkerInfo(False, 0.0, 0.0, floor=Stamp(2, 7), refused={5: Stamp(2, 9), 3: Stamp(2, 8), 4: Stamp(2, 9)})
    info, revokes = registered(dead, 50.0)
    assert (info.alive, info.last_seen, info.floor, info.refused) == (True, 50.0, Stamp(2, 7), {})
    assert revokes == [(Stamp(2, 8), [3]), (Stamp(2, 9), [4, 5])]


def test_a_claim_from_under_a_drop_everything_or_from_the_dead_is_refused() -> None:
    info = WorkerInfo(True, 0.0, 0.0, floor=Stamp(2, 7))
    assert claim_refused(info, Stamp(2, 7))
    assert not claim_refused(info, Stamp(2, 8))
    assert claim_refused(WorkerInfo(False, 0.0, 0.0), Stamp(3, 1))
    assert claim_refused(None, Stamp(3, 1))


def test_a_revoke_of_a_job_given_out_again_is_stamped_just_below_its_new_assign() -> None:
    clock = LogicalClock(2, clock=20)
    rows = [
        Ownership(1, None, "pending", 2, 15, 1, 1),  # resent since
        Ownership(2, "w9", "claimed", 2, 12, 1, 1),
    ]
    plan = revoke_stamps(rows, [1, 2, 3], Stamp(2, 10), clock)
    assert plan == {Stamp(2, 14): [1], Stamp(2, 21): [2, 3]}


def test_drift_counts_only_when_it_lasts_a_claim_timeout_with_nothing_on_its_way() -> None:
    info = WorkerInfo(True, 0.0, 0.0, owned_digest=1)
    assert not drifted(info, 2, now=10.0, timeout=15.0, pending=False, shared_pending=None)  # starts
    assert not drifted(info, 2, now=20.0, timeout=15.0, pending=False, shared_pending=None)
    assert not drifted(info, 2, now=26.0, timeout=15.0, pending=True, shared_pending=None)  # starts again
    assert info.drifted_since is None
    assert not drifted(info, 2, now=27.0, timeout=15.0, pending=False, shared_pending=None)
    assert drifted(info, 2, now=42.0, timeout=15.0, pending=False, shared_pending=None)
    assert info.drifted_since is None
    info.heard, info.told, info.told_at = Stamp(2, 3), Stamp(2, 4), 50.0  # told something not heard yet
    assert not drifted(info, 2, now=51.0, timeout=15.0, pending=False, shared_pending=None)
    assert info.drifted_since is None
    assert not drifted(info, 1, now=52.0, timeout=15.0, pending=False, shared_pending=None)  # no difference
