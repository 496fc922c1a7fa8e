"""The forecast of demand: what a worker publishes is what its heap fires, minute by minute and kind
by kind, over random cron sets and time zones on days the clocks change; readers sum the fresh
workers' forecasts and add API triggers' recent rate."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queuer_worker.forecast import Counts, Forecaster, fires_by_minute, window
from queuer_worker.heap import CronHeap, Definition
from runplane.adapters.db import open_pool
from runplane.basics.settings import ForecastSettings
from runplane.demand.forecast import MINUTE, Forecast, RunnerKind, minute_of, read_forecast
from tests.support.records import Conn, create_account, create_environment, create_job, queue_run

ZONES = (
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # a half-hour change
    "America/Santiago",  # changes at local midnight
    "Asia/Kolkata",  # a half-hour offset, no change
    "Pacific/Chatham",  # a 45-minute offset
)
KINDS = (RunnerKind("", 1024), RunnerKind("1.10", 1024), RunnerKind("1.10", 4096))


@cache
def transitions() -> tuple[int, ...]:
    """Every instant of 2026 at which one of ``ZONES`` changes its offset (to the second)."""
    found: set[int] = set()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for name in ZONES:
        tz = ZoneInfo(name)
        for hour in range(365 * 24):
            a, b = start + timedelta(hours=hour), start + timedelta(hours=hour + 1)
            if a.astimezone(tz).utcoffset() == b.astimezone(tz).utcoffset():
                continue
            lo, hi = int(a.timestamp()), int(b.timestamp())
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if datetime.fromtimestamp(mid, tz).utcoffset() == a.astimezone(tz).utcoffset():
                    lo = mid
                else:
                    hi = mid
            found.add(hi)
    return tuple(sorted(found))


minute_field = st.one_of(
    st.just("*"),
    st.sampled_from(["*/2", "*/5", "*/15", "*/7"]),
    st.integers(0, 59).map(str),
    st.lists(st.integers(0, 59), min_size=2, max_size=4, unique=True).map(lambda ms: ",".join(map(str, sorted(ms)))),
    st.integers(0, 50).map(lambda m: f"{m}-{m + 9}"),
)
hour_field = st.one_of(
    st.just("*"), st.integers(0, 23).map(str), st.sampled_from(["*/2", "1-3", "2", "0,1,2,3", "22-23"])
)
weekday_field = st.sampled_from(["*", "*", "1-5", "0,6"])
crons = st.builds(lambda m, h, w: f"{m} {h} * * {w}", minute_field, hour_field, weekday_field)
jobs = st.lists(
    st.tuples(crons, st.sampled_from(ZONES), st.sampled_from(KINDS), st.sampled_from([0, 120, 3600])),
    min_size=1,
    max_size=25,
)


def drained(heap: CronHeap, kind_of: dict[int, RunnerKind], *, now: float, minutes: int) -> Counts:
    """What the heap really fires in the forecast's window, tick by tick as the worker fires it."""
    start, end = window(now, minutes)
    counts: Counts = Counter()
    while (head := heap.next_due()) is not None and head < end:
        due = heap.pop_due(head)
        for job_id, fire, _, _, offset in due:
            counts[kind_of[job_id], max(start, minute_of(fire + offset))] += 1
        heap.reschedule(due)
    return counts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=jobs,
    around=st.integers(0, 10_000),
    offset=st.integers(-3 * 3600, 3 * 3600),
    minutes=st.integers(1, 10),
    last_fire_back=st.integers(0, 7200),
    jitter=st.sampled_from([0, 0, 30, 60, 600]),
)
def test_the_forecast_is_what_the_heap_fires(  # noqa: PLR0917
    jobs: list[tuple[str, str, RunnerKind, int]],
    around: int,
    offset: int,
    minutes: int,
    last_fire_back: int,
    jitter: int,
) -> None:
    moments = transitions()
    now = moments[around % len(moments)] + offset + 0.25  # near a change of some zone's clock
    heap = CronHeap()
    kind_of: dict[int, RunnerKind] = {}
    for job_id, (cron, zone, kind, grace) in enumerate(jobs, start=1):
        # Every other job jittered: a fire counts in the minute it is due, as the heap fires it.
        defn = Definition(job_id, 1, cron, zone, grace, jitter if job_id % 2 else 0)
        heap.assign(defn, last_fire_ts=int(now) - last_fire_back, now=now)
        kind_of[job_id] = kind

    forecast = fires_by_minute(list(heap.jobs()), kind_of, now=now, minutes=minutes)

    assert forecast == drained(heap, kind_of, now=now, minutes=minutes)


def test_a_job_of_unknown_kind_is_left_out_and_every_minute_counts() -> None:
    now = datetime(2026, 11, 1, 5, 58, 30, tzinfo=UTC).timestamp()  # New York falls back at 06:00 UTC
    heap = CronHeap()
    heap.assign(Definition(1, 1, "* * * * *", "America/New_York", 0), last_fire_ts=0, now=now)
    heap.assign(Definition(2, 1, "0 * * * *", "America/New_York", 0), last_fire_ts=0, now=now)
    heap.assign(Definition(3, 1, "0 * * * *", "UTC", 0), last_fire_ts=0, now=now)
    kind = RunnerKind("", 1024)
    got = fires_by_minute(list(heap.jobs()), {1: kind, 2: kind}, now=now, minutes=3)
    start = minute_of(now)
    # 06:00 UTC is 01:00 EST, a wall time New York already had at 05:00 UTC (01:00 EDT); a repeated
    # wall time fires once, at its first occurrence: neither job fires at 06:00 or 06:01 UTC. Job 1
    # fires at 05:59 only. Job 3 (UTC, at 06:00) has no known kind.
    assert got == {(kind, start + MINUTE): 1}


def test_ahead_holds_a_minute_from_the_lead_time_before_it_until_it_is_over() -> None:
    kind = RunnerKind("", 1024)
    peak = 1_800_000_000 // MINUTE * MINUTE
    forecast = Forecast({kind: {peak: 40, peak + MINUTE: 3}})
    fits = lambda k: k == kind  # noqa: E731
    assert forecast.ahead(peak - 61, 60, fits) == 0
    assert forecast.ahead(peak - 60, 60, fits) == 40
    assert forecast.ahead(peak + 59, 60, fits) == 40
    assert forecast.ahead(peak + 60, 0, fits) == 3
    assert forecast.ahead(peak + 120, 60, fits) == 0
    assert forecast.ahead(peak - 60, 60, lambda k: False) == 0


async def test_workers_publish_and_readers_sum_the_fresh_ones_with_the_api_rate(database_url: str, db: Conn) -> None:
    small = create_account(db, memory_mb=1024)
    big = create_account(db, name="big", memory_mb=4096)
    plain = create_job(db, small)
    dbt = create_job(db, big)
    db.execute("UPDATE jobs SET environment_id = %s WHERE id = %s", (create_environment(db, big, "1.10"), dbt))
    for _ in range(20):  # 20 API runs over the 600 s window: 2 a minute
        queue_run(db, dbt, trigger="api")
    queue_run(db, plain, trigger="manual")  # not an API trigger
    start = minute_of(time.time())
    now = start + 30.5
    heap = CronHeap()
    heap.assign(Definition(plain, 1, "* * * * *", "UTC", 0), last_fire_ts=0, now=now)
    heap.assign(Definition(dbt, 1, "*/2 * * * *", "Europe/Berlin", 0), last_fire_ts=0, now=now)
    pool = await open_pool(database_url, max_size=2)
    try:
        config = ForecastSettings(minutes=4)
        one, two = Forecaster(config, pool, "worker-1"), Forecaster(config, pool, "worker-2")
        published = await one.publish(heap.jobs(), now)
        await two.publish(heap.jobs(), now)  # the same jobs (a hand-over under way): counted twice
        await one.publish(heap.jobs(), now)  # replaces its own rows, never adds to them
        async with pool.connection() as conn:
            forecast = await read_forecast(conn, now=now, stale_after=30, api_window=600)
            db.execute(
                "UPDATE demand_forecast SET published_at = now() - interval '1 minute' WHERE worker_id = 'worker-2'"
            )
            fresh = await read_forecast(conn, now=now, stale_after=30, api_window=600)
            await one.publish([], now + MINUTE)  # a minute on, its heap empty: the minutes after are withdrawn
            later = await read_forecast(conn, now=now + MINUTE, stale_after=30, api_window=600)
    finally:
        await pool.close()

    plain_kind, dbt_kind = RunnerKind("", 1024), RunnerKind("1.10", 4096)
    assert {kind for kind, _ in published} == {
        plain_kind,
        dbt_kind,
    }  # kinds read from the job's environment and account
    minutes = range(start, start + 4 * MINUTE, MINUTE)
    every_minute = {m: 2 for m in minutes if m > now}
    assert forecast.fires[plain_kind] == every_minute
    assert fresh.fires[plain_kind] == {m: 1 for m in minutes if m > now}  # worker-2 went stale
    # The minute under way keeps what was forecast before it began; the minutes after it are gone.
    assert later.fires[plain_kind] == {start + MINUTE: 1}
    assert forecast.api_per_minute == pytest.approx({dbt_kind: 2.0})
    even = [m for m in minutes if m > now and m % 120 == 0]
    assert all(fresh.due(m, lambda k: k == dbt_kind) == 1 + 2 for m in even)  # its fire plus the API rate
