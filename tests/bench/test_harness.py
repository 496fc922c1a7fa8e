"""The benchmark harness: aggregation, the records' shape, the table, the plots, and the single-loop
baseline really queuing every due run once. No timing is asserted: figures are printed, not tested."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from bench.burst_jobs import insert_burst_jobs, plan_burst
from bench.harness import ALIGN_SLACK, finish, next_case, run_cases, with_ceiling_ratio
from bench.records import Measurement, Sample, Unavailable, aggregate, lag_measurements, percentile
from bench.report import markdown_table
from bench.runplane_scenarios import DISPATCH_METRICS, QUEUER_BURST_METRICS, to_measurements
from bench.scenarios import Case, Mode, plan
from bench.single_loop import SingleLoopQueuer

RECORD_KEYS = {"scenario", "system", "n", "metric", "value", "unit", "min", "max", "runs"}


def _sample(metric: str, value: float | None, system: str = "apscheduler", unit: str = "s", note: str = "") -> Sample:
    return Sample("burst", system, 2000, metric, value, unit, note)


def test_aggregate_reports_median_min_max_per_metric() -> None:
    samples = [_sample("lag_p99", v) for v in (0.9, 0.2, 0.4)] + [_sample("lag_p99", 7.0, system="celery_beat")]
    records = aggregate(samples)
    assert len(records) == 2
    aps = records[0]
    assert (aps["system"], aps["value"], aps["min"], aps["max"], aps["runs"]) == ("apscheduler", 0.4, 0.2, 0.9, 3)
    assert records[1]["system"] == "celery_beat"
    assert records[1]["value"] == records[1]["min"] == records[1]["max"] == 7.0


def test_aggregate_even_count_median_and_timed_out_sum() -> None:
    records = aggregate([_sample("all_done", v) for v in (1.0, 2.0, 4.0, 10.0)])
    assert records[0]["value"] == 3.0
    timed = aggregate([_sample("timed_out", 1.0, unit="runs", note=f"{k} of 2000") for k in (5, 9)])
    assert timed[0]["value"] == 2.0  # how many runs hit the cap, not a median of ones
    assert timed[0]["note"] == "5 of 2000; 9 of 2000"


def test_records_without_a_value_keep_the_reason() -> None:
    records = aggregate([_sample("unavailable", None, system="runplane", unit="", note="bench.queuer_burst missing")])
    assert records[0]["value"] is None and records[0]["runs"] == 0
    assert records[0]["note"] == "bench.queuer_burst missing"


def test_percentiles_and_lag_measurements() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.5
    assert abs(percentile(values, 99) - 99.01) < 1e-9
    assert percentile([3.0], 99) == 3.0
    complete = {m.metric: m.value for m in lag_measurements([0.1, 0.3, 0.2], expected=3, cap=30.0)}
    assert (complete["completed"], complete["lag_p50"], complete["lag_max"]) == (3.0, 0.2, 0.3)
    assert "timed_out" not in complete and complete["all_done"] == 0.3
    partial = lag_measurements([0.1, 0.3, 0.2, 31.0], expected=5, cap=30.0)  # 31 s: after it gave up
    figures = {m.metric: m.value for m in partial}
    assert figures["completed"] == 3.0
    assert figures["timed_out"] == 1.0  # 3 of 5: reported, not hidden
    assert "all_done" not in figures
    # The two that never happened count at the cap, so the percentiles are honest lower bounds.
    assert figures["lag_p50"] == 0.3 and figures["lag_max"] == 30.0
    assert all("lower bound" in m.note for m in partial if m.metric.startswith("lag_"))


def test_scenario_dicts_become_measurements_with_units() -> None:
    burst = to_measurements(
        {
            "n": 2000,
            "workers": 2,
            "trigger_lag_p99_s": 0.4,
            "all_queued_seconds": 1.5,
            "bytes_per_owned_job": 700,
            "jobs_owned": {"w-1": 1000, "w-2": 1000},
            "worker_rss_after_mib": [80.0, 81.0],
            "lag_p99_ms": 40,
            "memory": {"value": 0.7, "unit": "KiB"},
            "target_p99_s": 2.0,
            "label": "not a metric",
        },
        QUEUER_BURST_METRICS,
    )
    assert [(m.metric, m.value, m.unit) for m in burst] == [
        ("lag_p99", 0.4, "s"),  # named as the other systems' figures, so they share rows and plots
        ("all_done", 1.5, "s"),
        ("memory_per_job", 700.0, "B"),
        ("lag_p99_ms", 40.0, "ms"),  # unknown keys keep their name, the unit read from the suffix
        ("memory", 0.7, "KiB"),
    ]
    dispatch = to_measurements(
        {
            "throughput_noop": {"accounts": 1000, "seconds": 1.5, "runs_per_second": 2400.0, "extra_s": 3},
            "prep_time_local": {"rate_per_second": 10, "prep_time_p99": 0.8},
        },
        DISPATCH_METRICS,
    )
    assert [(m.scenario, m.metric, m.unit) for m in dispatch] == [
        ("throughput", "duration", "s"),
        ("throughput", "runs_per_s", "1/s"),
        ("", "throughput_noop.extra_s", "s"),
        ("prep_time", "prep_time_p99", "s"),
    ]


def test_harness_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    calls: list[str] = []

    def burst(system: str, p99: list[float]) -> Case:
        runs = iter(p99)

        def measure() -> list[Measurement]:
            calls.append(system)
            value = next(runs)
            return [Measurement("lag_p99", value, "s"), Measurement("all_done", value * 2, "s")]

        return Case("burst", system, 2000, measure, repeats=len(p99), estimate=0.0)

    def missing() -> None:
        raise Unavailable("bench.queuer_burst does not exist yet")

    def never() -> list[Measurement]:
        raise AssertionError("an unavailable case must not be measured")

    def slow() -> list[Measurement]:
        calls.append("celery_beat")
        return [Measurement("completed", 10.0, "jobs"), Measurement("timed_out", 1.0, "runs", note="10 of 2000")]

    def ceiling() -> list[Measurement]:
        return [Measurement("run_inserts_per_s", 2000.0, "1/s")]

    def throughput() -> list[Measurement]:
        return [Measurement("runs_per_s", 500.0, "1/s", scenario="throughput")]

    cases = [
        Case("ceiling", "postgres", 1, ceiling, repeats=3, estimate=0.0),
        Case("burst", "runplane", 2000, never, repeats=3, estimate=0.0, check=missing),
        burst("single_loop", [1.2, 0.8, 1.0]),
        burst("apscheduler", [0.3, 0.1, 0.2]),
        Case("burst", "celery_beat", 2000, slow, repeats=3, estimate=0.0),
        Case("throughput", "runplane", 1000, throughput, repeats=1, estimate=0.0),
        Case("scale", "runplane", 100_000, ceiling, repeats=3, estimate=1e9),  # cannot fit the budget
    ]
    printed: list[str] = []
    outcome = run_cases(cases, budget=60.0, say=printed.append)
    assert calls.count("celery_beat") == 1  # a run that hit its cap is not repeated
    assert calls.count("single_loop") == 3
    records = finish(outcome, quick=True, started=datetime.now(UTC), out_dir=tmp_path, say=printed.append)

    written = json.loads((tmp_path / "latest.json").read_text())
    assert written == records
    assert all(set(r) >= RECORD_KEYS for r in written)
    by_key = {(r["scenario"], r["system"], r["metric"]): r for r in written}
    single = by_key[("burst", "single_loop", "lag_p99")]
    assert (single["value"], single["min"], single["max"], single["runs"]) == (1.0, 0.8, 1.2, 3)
    assert by_key[("burst", "runplane", "unavailable")]["value"] is None
    assert by_key[("burst", "celery_beat", "timed_out")]["value"] == 1.0
    assert by_key[("scale", "runplane", "skipped")]["value"] is None
    assert by_key[("throughput", "runplane", "runs_per_s_vs_ceiling")]["value"] == 0.25

    # Records follow the plan, not the order things ran in (rounds, availability checked first).
    assert list(dict.fromkeys((r["scenario"], r["system"]) for r in written)) == [
        ("ceiling", "postgres"),
        ("burst", "runplane"),
        ("burst", "single_loop"),
        ("burst", "apscheduler"),
        ("burst", "celery_beat"),
        ("throughput", "runplane"),
        ("scale", "runplane"),
    ]
    table = (tmp_path / "latest.md").read_text()
    assert "| scenario | system | n | metric | median | min | max | unit |" in table
    assert "| burst | single_loop | 2,000 | lag_p99 | 1 | 0.8 | 1.2 | s | 3 |" in table
    assert "bench.queuer_burst does not exist yet" in table
    assert any("| burst | apscheduler | 2,000 | all_done | 0.4 | 0.2 | 0.6 | s |" in line for line in printed)

    for name in ("burst_lag_p99.png", "burst_all_done.png", "throughput_vs_ceiling.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_repetitions_run_in_rounds_and_the_budget_drops_the_last_ones() -> None:
    calls: list[str] = []

    def case(system: str, repeats: int, estimate: float, sleep: float = 0.0, late: bool = False) -> Case:
        def measure() -> list[Measurement]:
            calls.append(system)
            time.sleep(sleep)
            return [Measurement("lag_p99", 1.0, "s")]

        return Case("burst", system, 10, measure, repeats=repeats, estimate=estimate, late=late)

    outcome = run_cases([case("a", 2, 0.0, late=True), case("b", 3, 0.0)], budget=60.0, say=lambda _: None)
    assert calls == ["b", "a", "b", "a", "b"]  # every case once before any twice; "late" last in a round
    assert [s.system for s in outcome.samples] == ["a", "a", "b", "b", "b"]  # records keep the plan's order
    calls.clear()
    # After the first round at most 0.5 s of the budget is left: "b" fits no second run, "a" does.
    outcome = run_cases([case("a", 2, 0.0), case("b", 2, 1.0, sleep=1.5)], budget=2.0, say=lambda _: None)
    assert calls == ["a", "b", "a"]
    calls.clear()
    # A first run shows what the next one needs: 1.5 s, though the estimate said nothing...
    metrics = [s.metric for s in run_cases([case("c", 2, 0.0, sleep=1.5)], budget=3.0, say=lambda _: None).samples]
    assert calls == ["c"]  # ...so with ~1.5 s left the second run (~1.65 s) is skipped
    assert metrics == ["lag_p99", "skipped"]
    calls.clear()
    run_cases([case("d", 3, 50.0)], budget=60.0, say=lambda _: None)
    assert calls == ["d", "d", "d"]  # and a quick case is not held back by a pessimistic estimate
    skipped = [s for s in outcome.samples if s.metric == "skipped"]
    assert [(s.system, s.value) for s in skipped] == [("b", None)]
    assert "run 2 of 2 skipped" in skipped[0].note


def test_a_case_at_a_minute_boundary_starts_its_lead_before_one_and_others_fill_the_wait() -> None:
    def case(system: str, estimate: float, lead: float | None = None) -> Case:
        return Case("burst", system, 10, lambda: [], repeats=1, estimate=estimate, minute_lead=lead)

    aligned, short, long = case("aligned", 40.0, lead=25.0), case("short", 10.0), case("long", 100.0)
    queue = [aligned, long, short]

    def at(second: float) -> float:  # a wall clock `second` s past some minute
        return 1_800_000_000.0 + second

    def needs(c: Case) -> float:
        return c.estimate

    # 35 s past: its boundary is 25 s away, its lead: it starts now.
    assert next_case(queue, needs, now=lambda: at(35.0)) is aligned
    assert next_case(queue, needs, now=lambda: at(35.0 - ALIGN_SLACK + 0.5)) is aligned
    # 5 s past: 30 s to wait; the short case fits in them, the long one does not.
    assert next_case(queue, needs, now=lambda: at(5.0)) is short
    # 30 s to wait and only a long case left besides: it runs (better than waiting).
    assert next_case([aligned, long], needs, now=lambda: at(5.0)) is long
    # Nothing else left: it starts and waits for its boundary.
    assert next_case([aligned], needs, now=lambda: at(5.0)) is aligned
    # No aligned case: the queue's order.
    assert next_case([long, short], needs, now=lambda: at(5.0)) is long


def test_ceiling_ratio_needs_a_ceiling() -> None:
    records = aggregate([Sample("throughput", "runplane", 1000, "runs_per_s", 900.0, "1/s")])
    assert with_ceiling_ratio(records) == records
    assert markdown_table(records).count("\n") == 3


def test_plan_lists_every_scenario_and_honours_repeat() -> None:
    quick = plan(Mode(quick=True))
    assert {c.scenario for c in quick} == {"ceiling", "burst", "throughput", "prep_time", "scale", "failover"}
    assert {c.system for c in quick if c.scenario == "burst"} == {
        "runplane",
        "single_loop",
        "apscheduler",
        "celery_beat",
    }
    assert {c.n for c in quick if c.scenario == "burst"} == {2000}
    assert all(c.repeats >= 3 for c in quick if c.scenario in ("burst", "ceiling"))
    full = plan(Mode(quick=False), ["burst"])
    assert {c.n for c in full} == {10_000, 100_000}
    assert {c.repeats for c in plan(Mode(quick=False, repeat=5), ["burst", "scale"])} == {5}


def test_single_loop_queues_every_due_run_exactly_once(database_url: str) -> None:
    n = 50
    clock = plan_burst(lead=1.0)
    insert_burst_jobs(database_url, n, clock.cron)
    with psycopg.connect(database_url, autocommit=True) as conn:
        # Jobs that are not due at that minute must not be queued.
        conn.execute(
            "INSERT INTO jobs (account_id, name, job_type, steps, cron)"
            " SELECT min(account_id), 'later', 'deploy', '{true}', %s FROM jobs",
            (f"{(int(clock.cron.split()[0]) + 7) % 60} * * * *",),
        )
        queuer = SingleLoopQueuer(database_url, clock_offset=clock.offset, pass_interval=0.1)
        stop = threading.Event()
        thread = threading.Thread(target=queuer.run, args=(stop,), name="single-loop")
        thread.start()
        try:
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline and _count(conn) < n:
                time.sleep(0.05)
            passes_then = len(queuer.pass_seconds)
            while time.monotonic() < deadline and len(queuer.pass_seconds) < passes_then + 3:
                time.sleep(0.05)  # several more passes over the same minute must add nothing
        finally:
            stop.set()
            thread.join(10.0)
        assert not thread.is_alive()
        due_jobs = [row[0] for row in conn.execute("SELECT id FROM jobs WHERE name <> 'later'")]
        keys = [row[0] for row in conn.execute("SELECT idempotency_key FROM runs")]
        assert sorted(keys) == sorted(f"sched:{job_id}:{clock.fire_at}" for job_id in due_jobs)
        assert queuer.inserted == n
        assert queuer.attempted == n  # later passes did not even try the same fire again
        scheduled = conn.execute("SELECT DISTINCT extract(epoch FROM scheduled_at)::bigint FROM runs").fetchall()
        assert scheduled == [(clock.fire_at,)]


def _count(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute("SELECT count(*) FROM runs").fetchone()
    return int(str(row[0])) if row else 0
