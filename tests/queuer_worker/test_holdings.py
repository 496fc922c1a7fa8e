"""A queuer worker's decisions without I/O: message in, what to send out."""

from __future__ import annotations

from queuer_worker.holdings import REGISTERING_BEATS, Holdings
from runplane.basics.stamps import Stamp
from runplane.v1 import bus_pb2

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _job(job_id: int, cron: str = "* * * * *", *, version: int = 1, active: bool = True) -> bus_pb2.JobDefinition:
    return bus_pb2.JobDefinition(job_id=job_id, version=version, cron=cron, timezone="UTC", active=active)


def assign(stamp: Stamp, *jobs: bus_pb2.JobDefinition) -> bus_pb2.Assign:
    proto = stamp.to_proto()
    return bus_pb2.Assign(stamp=proto, jobs=[bus_pb2.JobAssignment(job=j, stamp=proto) for j in jobs])


def revoke(stamp: Stamp, *job_ids: int, drop_all: bool = False) -> bus_pb2.Revoke:
    return bus_pb2.Revoke(stamp=stamp.to_proto(), job_ids=job_ids, drop_all=drop_all)


def update(stamp: Stamp, job: bus_pb2.JobDefinition) -> bus_pb2.Update:
    return bus_pb2.Update(stamp=stamp.to_proto(), job=bus_pb2.JobAssignment(job=job, stamp=stamp.to_proto()))


def test_an_assign_is_held_and_claimed_and_an_inactive_job_is_not() -> None:
    holdings = Holdings("w1")
    taken = holdings.assign(assign(Stamp(1, 1), _job(1), _job(2, active=False)), NOW)
    assert taken.claimed is not None
    assert list(taken.claimed.job_ids) == [1]
    assert taken.claimed.worker_id == "w1"
    assert holdings.heap.job_ids() == [1]


def test_an_older_stamp_or_term_changes_nothing() -> None:
    holdings = Holdings("w1")
    holdings.assign(assign(Stamp(2, 5), _job(1)), NOW)
    holdings.revoke(revoke(Stamp(2, 4), 1))  # older than the Assign
    assert 1 in holdings.heap
    assert holdings.assign(assign(Stamp(1, 9), _job(2)), NOW).claimed is None  # an older term
    assert 2 not in holdings.heap
    holdings.revoke(revoke(Stamp(2, 6), 1))
    assert 1 not in holdings.heap


def test_after_drop_everything_an_older_assign_of_a_job_never_seen_is_refused() -> None:
    holdings = Holdings("w1")
    holdings.assign(assign(Stamp(1, 1), _job(1)), NOW)
    holdings.assign(assign(Stamp(1, 3), _job(2)), NOW)
    holdings.registering_beats = 0
    assert holdings.revoke(revoke(Stamp(1, 2), drop_all=True))
    assert holdings.heap.job_ids() == [2]  # taken after the drop-everything was stamped: kept
    assert holdings.registering_beats == REGISTERING_BEATS
    assert holdings.assign(assign(Stamp(1, 2), _job(3)), NOW).claimed is None
    assert holdings.assign(assign(Stamp(1, 4), _job(3)), NOW).claimed is not None


def test_the_same_assign_again_is_claimed_again() -> None:
    holdings = Holdings("w1")
    message = assign(Stamp(1, 1), _job(1))
    holdings.assign(message, NOW)
    again = holdings.assign(message, NOW)
    assert again.claimed is not None
    assert list(again.claimed.job_ids) == [1]


def test_a_claim_that_could_not_be_sent_lets_go_and_is_released_until_heard() -> None:
    holdings = Holdings("w1")
    message = assign(Stamp(1, 1), _job(1), _job(2))
    holdings.claim_failed(holdings.assign(message, NOW))
    assert len(holdings.heap) == 0
    release = holdings.next_release()
    assert release is not None
    assert release.released
    assert list(release.job_ids) == [1, 2]
    # The Assign comes back and job 1 is taken again under it: only job 2 is still let go.
    holdings.assign(assign(Stamp(1, 1), _job(1)), NOW)
    release = holdings.next_release()
    assert release is not None
    assert list(release.job_ids) == [2]
    holdings.release_sent()
    assert holdings.next_release() is None


def test_an_update_of_a_job_not_held_takes_it_and_a_schedule_that_never_fires_is_returned() -> None:
    holdings = Holdings("w1")
    assert holdings.update(update(Stamp(1, 1), _job(7)), NOW) == (True, None)
    assert 7 in holdings.heap
    applied, never = holdings.update(update(Stamp(1, 2), _job(7, "0 0 30 2 *", version=2)), NOW)
    assert applied
    assert never is not None
    assert never.job_id == 7
    assert 7 not in holdings.heap


def test_heartbeats_say_registering_until_three_are_sent_and_carry_what_was_applied() -> None:
    holdings = Holdings("w1")
    holdings.assign(assign(Stamp(3, 4), _job(1)), NOW)
    beats = [holdings.heartbeat(NOW) for _ in range(REGISTERING_BEATS + 1)]
    assert all(b.registering for b in beats)  # none sent yet
    for _ in range(REGISTERING_BEATS):
        holdings.beat_sent(holdings.heartbeat(NOW))
    beat = holdings.heartbeat(NOW)
    assert not beat.registering
    assert (beat.newest_term, beat.jobs_owned, beat.owned_digest) == (3, 1, holdings.heap.digest)
    assert Stamp.from_proto(beat.applied) == Stamp(3, 4)
