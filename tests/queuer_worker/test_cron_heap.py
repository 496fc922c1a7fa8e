"""The cron heap and cron maths: fire order, missed-fire grace, DST in a non-UTC zone."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from queuer_worker.heap import CronHeap, Definition, Due, catchup_fire, given_up, missed_fire
from runplane.basics.cron import next_fire, previous_fire
from runplane.basics.ownership import job_digest

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def ts(year: int, month: int, day: int, hour: int, minute: int, tz: ZoneInfo = BERLIN, fold: int = 0) -> int:  # noqa: PLR0917
    return int(datetime(year, month, day, hour, minute, tzinfo=tz, fold=fold).timestamp())


def utc(year: int, month: int, day: int, hour: int, minute: int) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp())


def fires(expr: str, zone: str, start: int, count: int) -> list[int]:
    out, t = [], start
    for _ in range(count):
        t = next_fire(expr, zone, t)
        out.append(t)
    return out


def drain(heap: CronHeap, until: int) -> list[tuple[int, int]]:
    """Everything the heap fires up to ``until``, tick by tick as the worker would."""
    fired: list[tuple[int, int]] = []
    while (head := heap.next_due()) is not None and head <= until:
        due = heap.pop_due(head)
        fired.extend((d.job_id, d.fire_ts) for d in due)
        heap.reschedule(due)
    return fired


# -- DST -------------------------------------------------------------------------------------------


def test_spring_forward_hourly_job_skips_the_missing_hour_only() -> None:
    # Europe/Berlin 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that night.
    got = fires("30 * * * *", "Europe/Berlin", ts(2026, 3, 29, 0, 45), 3)
    assert got == [ts(2026, 3, 29, 1, 30), ts(2026, 3, 29, 3, 30), ts(2026, 3, 29, 4, 30)]
    # An hour of real time apart: nothing lost, nothing doubled.
    assert got[1] - got[0] == 3600


def test_spring_forward_daily_job_in_the_gap_does_not_fire_that_day() -> None:
    got = fires("30 2 * * *", "Europe/Berlin", ts(2026, 3, 28, 3, 0), 2)
    assert got == [ts(2026, 3, 30, 2, 30), ts(2026, 3, 31, 2, 30)]
    assert previous_fire("30 2 * * *", "Europe/Berlin", ts(2026, 3, 29, 12, 0)) == ts(2026, 3, 28, 2, 30)


def test_fall_back_repeated_hour_fires_once() -> None:
    # Europe/Berlin 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    got = fires("30 * * * *", "Europe/Berlin", ts(2026, 10, 25, 1, 0), 3)
    assert got == [ts(2026, 10, 25, 1, 30), ts(2026, 10, 25, 2, 30, fold=0), ts(2026, 10, 25, 3, 30)]
    assert got[1] == utc(2026, 10, 25, 0, 30)
    assert got[2] == utc(2026, 10, 25, 2, 30)
    daily = fires("30 2 * * *", "Europe/Berlin", ts(2026, 10, 24, 12, 0), 3)
    assert daily == [ts(2026, 10, 25, 2, 30, fold=0), ts(2026, 10, 26, 2, 30), ts(2026, 10, 27, 2, 30)]


def test_fall_back_from_inside_the_second_pass_moves_on() -> None:
    # 02:40 CET (second pass): the 02:45 wall time already fired in the first pass.
    second_pass = ts(2026, 10, 25, 2, 40, fold=1)
    assert next_fire("*/15 * * * *", "Europe/Berlin", second_pass) == ts(2026, 10, 25, 3, 0)
    assert previous_fire("*/15 * * * *", "Europe/Berlin", second_pass) == ts(2026, 10, 25, 2, 45, fold=0)


def test_heap_across_both_transitions_in_new_york() -> None:
    heap = CronHeap()
    heap.assign(Definition(1, 1, "0 * * * *", "America/New_York", 0), last_fire_ts=0, now=utc(2026, 3, 7, 0, 0))
    heap.assign(Definition(2, 1, "30 1 * * *", "America/New_York", 0), last_fire_ts=0, now=utc(2026, 3, 7, 0, 0))
    fired = drain(heap, utc(2026, 3, 10, 0, 0))
    hourly = [t for job, t in fired if job == 1]
    # 2026-03-08 02:00 EST -> 03:00 EDT: one hour of wall time is missing, real time is hourly throughout.
    assert all(b - a == 3600 for a, b in itertools.pairwise(hourly))
    assert len(hourly) == len(set(hourly))
    daily = [datetime.fromtimestamp(t, NEW_YORK).strftime("%m-%d %H:%M") for job, t in fired if job == 2]
    assert daily == ["03-07 01:30", "03-08 01:30", "03-09 01:30"]

    heap = CronHeap()
    heap.assign(Definition(3, 1, "30 1 * * *", "America/New_York", 0), last_fire_ts=0, now=utc(2026, 10, 31, 0, 0))
    fired = drain(heap, utc(2026, 11, 3, 12, 0))
    # 2026-11-01 01:30 happens twice (EDT, then EST): one run, at the first.
    assert [t for _, t in fired] == [
        ts(2026, 10, 31, 1, 30, NEW_YORK),
        ts(2026, 11, 1, 1, 30, NEW_YORK, fold=0),
        ts(2026, 11, 2, 1, 30, NEW_YORK),
        ts(2026, 11, 3, 1, 30, NEW_YORK),
    ]


# -- heap ------------------------------------------------------------------------------------------


def test_due_jobs_come_out_together_and_reschedule() -> None:
    heap = CronHeap()
    now = utc(2026, 5, 1, 12, 0) + 10
    for job_id in range(1, 6):
        heap.assign(Definition(job_id, 1, "* * * * *", "UTC", 0), last_fire_ts=0, now=now)
    heap.assign(Definition(9, 1, "*/5 * * * *", "UTC", 0), last_fire_ts=0, now=now)
    assert heap.next_due() == utc(2026, 5, 1, 12, 1)
    due = heap.pop_due(utc(2026, 5, 1, 12, 1))
    assert sorted(due) == [Due(j, utc(2026, 5, 1, 12, 1), "* * * * *", "UTC") for j in range(1, 6)]
    heap.reschedule(due)
    assert heap.next_due() == utc(2026, 5, 1, 12, 2)
    assert heap.pop_due(utc(2026, 5, 1, 12, 1)) == []


def test_update_and_revoke_take_effect_without_stale_fires() -> None:
    heap = CronHeap()
    now = utc(2026, 5, 1, 12, 0) + 10
    heap.assign(Definition(1, 1, "* * * * *", "UTC", 0), last_fire_ts=0, now=now)
    heap.assign(Definition(2, 1, "* * * * *", "UTC", 0), last_fire_ts=0, now=now)
    heap.update(Definition(1, 2, "0 0 * * *", "UTC", 0), now=now)  # now daily
    heap.remove(2)
    assert drain(heap, utc(2026, 5, 1, 23, 0)) == []
    assert drain(heap, utc(2026, 5, 2, 0, 0)) == [(1, utc(2026, 5, 2, 0, 0))]
    # A changed priority (same schedule) keeps the pending fire.
    before = heap.next_due()
    heap.update(Definition(1, 3, "0 0 * * *", "UTC", 0), now=utc(2026, 5, 2, 0, 0) + 5)
    assert heap.next_due() == before


def test_digest_tracks_the_held_versions() -> None:
    heap = CronHeap()
    heap.assign(Definition(1, 1, "* * * * *", "UTC", 0), last_fire_ts=0, now=0)
    heap.assign(Definition(2, 4, "* * * * *", "UTC", 0), last_fire_ts=0, now=0)
    heap.update(Definition(1, 2, "* * * * *", "UTC", 0), now=0)
    assert heap.digest == job_digest(1, 2) ^ job_digest(2, 4)
    heap.remove(2)
    assert heap.digest == job_digest(1, 2)
    heap.clear()
    assert heap.digest == 0 and len(heap) == 0


# -- missed fires ----------------------------------------------------------------------------------


def test_missed_fire_inside_grace_is_queued_once() -> None:
    # Every minute; the worker takes the job 4 minutes into an outage with a 5 minute grace: only the
    # newest missed occurrence comes back, never the backlog.
    defn = Definition(1, 1, "* * * * *", "UTC", 300)
    now = utc(2026, 5, 1, 12, 4) + 20
    heap = CronHeap()
    first = heap.assign(defn, last_fire_ts=utc(2026, 5, 1, 12, 0), now=now)
    assert first == utc(2026, 5, 1, 12, 4)
    due = heap.pop_due(now)
    assert due == [Due(1, utc(2026, 5, 1, 12, 4), "* * * * *", "UTC")]
    heap.reschedule(due)
    assert heap.next_due() == utc(2026, 5, 1, 12, 5)


def test_missed_fire_outside_grace_or_already_queued_is_skipped() -> None:
    hourly = Definition(1, 1, "0 * * * *", "UTC", 300)
    assert missed_fire(hourly, last_fire_ts=0, now=utc(2026, 5, 1, 12, 6)) is None  # 6 min ago > 5 min
    assert missed_fire(hourly, last_fire_ts=0, now=utc(2026, 5, 1, 12, 4)) == utc(2026, 5, 1, 12, 0)
    # Known queued (or the job did not exist yet) at that time: nothing missed.
    assert missed_fire(hourly, last_fire_ts=utc(2026, 5, 1, 12, 0), now=utc(2026, 5, 1, 12, 4)) is None
    # Grace 0 skips missed fires altogether.
    assert missed_fire(Definition(1, 1, "0 * * * *", "UTC", 0), last_fire_ts=0, now=utc(2026, 5, 1, 12, 1)) is None
    heap = CronHeap()
    assert heap.assign(hourly, last_fire_ts=0, now=utc(2026, 5, 1, 12, 6)) == utc(2026, 5, 1, 13, 0)


def test_a_fire_whose_schedule_changed_after_it_was_taken_is_taken_again_under_the_new_one() -> None:
    """A new cron may keep the same next fire: the fire taken under the old one is no longer due as
    it was (Postgres would refuse it), and stays on the heap to be taken under the new one."""
    heap = CronHeap()
    now = utc(2026, 5, 1, 12, 1) + 10
    heap.assign(Definition(1, 1, "* * * * *", "UTC", 0), last_fire_ts=0, now=now)
    taken = heap.pop_due(utc(2026, 5, 1, 12, 2))
    assert taken == [Due(1, utc(2026, 5, 1, 12, 2), "* * * * *", "UTC")]
    heap.update(Definition(1, 2, "*/2 * * * *", "UTC", 0), now=now + 5)
    assert heap.still_due(taken) == []
    assert heap.reschedule(taken) == []
    assert heap.pop_due(utc(2026, 5, 1, 12, 2)) == [Due(1, utc(2026, 5, 1, 12, 2), "*/2 * * * *", "UTC")]


def test_an_update_after_a_late_fire_takes_the_new_schedules_occurrence_at_it_again() -> None:
    """The worker stood still across 12:02 holding "* * * * *", and fired it late, after the cron had
    become "*/2 * * * *" (Postgres refused that fire: its schedule was no longer in force); the Update
    applied after it brings 12:02 back, under the new cron, not 12:04."""
    heap = CronHeap()
    heap.assign(
        Definition(1, 1, "* * * * *", "UTC", 300), last_fire_ts=utc(2026, 5, 1, 12, 1), now=utc(2026, 5, 1, 12, 1) + 10
    )
    late = heap.pop_due(utc(2026, 5, 1, 12, 2) + 8)
    assert late == [Due(1, utc(2026, 5, 1, 12, 2), "* * * * *", "UTC")]
    heap.reschedule(late)
    assert heap.update(Definition(1, 2, "*/2 * * * *", "UTC", 300), now=utc(2026, 5, 1, 12, 2) + 9) == utc(
        2026, 5, 1, 12, 2
    )
    # Without a grace there is no looking back.
    heap.reschedule(heap.pop_due(utc(2026, 5, 1, 12, 2) + 9))
    assert heap.update(Definition(1, 3, "* * * * *", "UTC", 0), now=utc(2026, 5, 1, 12, 2) + 10) == utc(
        2026, 5, 1, 12, 3
    )


def test_a_jittered_job_fires_its_fixed_offset_after_each_instant_keeping_the_instant_as_its_key() -> None:
    from runplane.basics.jitter import jitter_offset

    now = utc(2026, 5, 1, 11, 59) + 30
    offsets = {job_id: jitter_offset(job_id, 60) for job_id in range(1, 200)}
    assert all(0 <= o <= 60 for o in offsets.values()) and len(set(offsets.values())) > 30  # spread, bounded
    assert offsets == {job_id: jitter_offset(job_id, 60) for job_id in range(1, 200)}  # the same every time
    heap = CronHeap()
    plain, jittered = 1, next(j for j, o in offsets.items() if o >= 10 and j != 1)
    heap.assign(Definition(plain, 1, "0 * * * *", "UTC", 0), last_fire_ts=0, now=now)
    heap.assign(Definition(jittered, 1, "0 * * * *", "UTC", 0, jitter_seconds=60), last_fire_ts=0, now=now)
    noon, offset = utc(2026, 5, 1, 12, 0), offsets[jittered]
    assert heap.next_due() == noon
    assert heap.pop_due(noon) == [Due(plain, noon, "0 * * * *", "UTC", 0)]
    heap.reschedule([Due(plain, noon, "0 * * * *", "UTC", 0)])
    assert heap.next_due() == noon + offset
    assert heap.pop_due(noon + offset - 1) == []
    due = heap.pop_due(noon + offset)
    assert due == [Due(jittered, noon, "0 * * * *", "UTC", offset)]  # the instant stays the fire (its key)
    heap.reschedule(due)
    assert heap.next_due() == utc(2026, 5, 1, 13, 0)  # the plain job's next hour; the jittered one after
    assert heap.pop_due(utc(2026, 5, 1, 13, 0) + offset) == [
        Due(plain, utc(2026, 5, 1, 13, 0), "0 * * * *", "UTC", 0),
        Due(jittered, utc(2026, 5, 1, 13, 0), "0 * * * *", "UTC", offset),
    ]


def test_a_job_taken_over_between_its_instant_and_its_offset_still_fires_that_instant() -> None:
    from runplane.basics.jitter import jitter_offset

    job = next(j for j in range(1, 1000) if jitter_offset(j, 60) >= 20)
    offset = jitter_offset(job, 60)
    noon = utc(2026, 5, 1, 12, 0)
    heap = CronHeap()
    # Grace 0 (no missed fire): the noon fire is not missed yet at noon + 10 s, its run is due later.
    heap.assign(Definition(job, 1, "0 * * * *", "UTC", 0, jitter_seconds=60), last_fire_ts=0, now=noon + 10)
    assert heap.next_due() == noon + offset
    # A changed jitter moves the pending fire's due time, not the fire.
    heap.update(Definition(job, 2, "0 * * * *", "UTC", 0, jitter_seconds=0), now=noon + 11)
    assert heap.pop_due(noon + 11) == [Due(job, noon, "0 * * * *", "UTC", 0)]


def test_a_catchup_window_reaches_past_the_grace_to_the_newest_or_every_missed_fire() -> None:
    start = utc(2026, 3, 2, 12, 0)  # the last fire known queued; nobody held the job for 5.5 minutes
    now = start + 330
    missed = [start + 60 * i for i in range(1, 6)]
    grace_only = Definition(1, 1, "* * * * *", "UTC", 10)
    # No window: as before, the grace alone (nothing within 10 s), and every missed fire is given up.
    assert catchup_fire(grace_only, last_fire_ts=start, upcoming=start + 360, now=now) is None
    assert CronHeap().assign(grace_only, last_fire_ts=start, now=now) == start + 360
    given = given_up(grace_only, last_fire_ts=start, first=start + 360, now=now)
    assert [m.fire_ts for m in given] == missed[::-1]
    assert "270 s late, beyond the job's catch-up window (0 s)" in given[-1].detail
    # A window, the newest only: one catch-up fire, the older ones given up.
    newest = Definition(1, 1, "* * * * *", "UTC", 10, catchup_window_seconds=3600)
    assert CronHeap().assign(newest, last_fire_ts=start, now=now) == missed[-1]
    given = given_up(newest, last_fire_ts=start, first=missed[-1], now=now)
    assert [m.fire_ts for m in given] == missed[-2::-1] and "newer missed occurrence" in given[0].detail
    # Every fire in a 120 s window: the oldest in reach first, then each following one, at once.
    every = Definition(1, 1, "* * * * *", "UTC", 10, catchup_window_seconds=120, catchup_all=True)
    heap = CronHeap()
    assert heap.assign(every, last_fire_ts=start, now=now) == missed[3]
    taken = heap.pop_due(now)
    assert [d.fire_ts for d in taken] == [missed[3]]
    heap.reschedule(taken)
    assert heap.next_due() == missed[4]
    assert [m.fire_ts for m in given_up(every, last_fire_ts=start, first=missed[3], now=now)] == missed[2::-1]
    # Nothing known queued (last fire 0): nothing is given up.
    assert given_up(every, last_fire_ts=0, first=missed[3], now=now) == []
