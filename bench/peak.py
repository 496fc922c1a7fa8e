"""``python -m bench.peak``: the top of the hour on real runners, pools cold, reactive and
forecast-warmed side by side.

N runs are due at one second (the start of a minute). At that second the queuer's own code queues
the tick and sends its Pickups (``queuer_worker.firing``, as in ``bench.top_of_hour``); before it, in
the forecast-warmed case, the queuer's own forecaster publishes what a heap holding the N jobs will
fire (``queuer_worker.forecast``), every ``forecast.interval`` as a worker does.

``local``: the API (runner API), one dispatcher with the local launcher and the scheduler loop as
real ``runplane`` processes; each run is a real runner forked from the fork server, running one
``true`` step as a uid of its own. Cases: ``one-spare`` (the fork server keeps one started runner:
a peak waits for forks), ``reactive`` (the spares follow the due queue, up to ``--spares-max``),
``forecast`` (they follow the forecast, ready ``local_lead_seconds`` before the minute). A run is
counted warm when a started runner was waiting for it at the due second (the spares then, at most N).

``fleet``: two real control planes of ``--nodes`` kubemark hollow nodes each (default 50), one
``kubernetes`` dispatcher per cluster on one pickup queue, runs claimed when their Pod is Running
(``bench.peak_fleet``); ``--n`` runs (default 10,000). Adds Pod create → Running and runs per cluster.

``node``: the real Kubernetes node of the tests (``tests/support/kubernetes_cluster.py``), runs of
``--n`` (default: as many Pods as the node holds, measured from its allocatable pods, CPU and
memory against a run Pod's requests). Cases: ``cold`` (no pool: a Pod per run), ``reactive`` (a warm
pool sized from the queue, up to N), ``forecast`` (the same pool sized from the forecast). A run is
warm when it went to a pool Pod.

Each case reports prep time (started − dispatched) and run delay (started − scheduled)
p50/p99/max, the on-time split (≤ 25 s / 25–60 s / > 60 s) and the share served warm, with the
load average at its end; the pgbench ceiling (``bench.ceiling``) is measured once per invocation.
Prints JSON and a table; writes ``bench/results/peak_<part>.json``. Nothing is asserted.

    python -m bench.peak local --n 1000 5000
    python -m bench.peak node
    python -m bench.peak fleet --n 2000 --nodes 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg.conninfo import make_conninfo

from bench.ceiling import measure_ceiling
from bench.cpu_profile import CpuProfile
from bench.dispatch_throughput import Processes, _cleanup_prefix, _env, _wait_for_dispatchers, _wait_for_runner_api
from bench.sandbox import temporary_database
from queuer_worker.firing import prepare_chunks, queue_runs
from queuer_worker.forecast import Forecaster
from queuer_worker.heap import CronHeap, Definition, Due
from runplane.adapters.bus import AmqpBus, Topology
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings
from runplane.demand.forecast import MINUTE, minute_of
from runplane.runs.pickups import send_pickups

RESULTS = Path(__file__).parent / "results"
CRON = "0 * * * *"  # the jobs' schedule in the database; the forecast's heap holds them due at the picked minute
RUN_SLOTS = 10
LOCAL_LEAD_SECONDS = 20.0
CEILING_SECONDS = 10
LOCAL_CASES = ("one-spare", "reactive", "forecast")
BENCH_UIDS = 400_000


def _seed(conn: psycopg.Connection[Any], n: int, memory_mb: int = 1024) -> list[int]:
    """N jobs of one ``true`` step, ten to an account with ten run slots."""
    accounts = max(1, n // RUN_SLOTS)
    conn.execute(
        "INSERT INTO accounts (name, run_slots, memory_mb) SELECT 'peak ' || i, %s, %s FROM generate_series(1, %s) i",
        (RUN_SLOTS, memory_mb, accounts),
    )
    conn.execute(
        """INSERT INTO jobs (account_id, name, job_type, steps, cron, timezone)
           SELECT (SELECT min(id) FROM accounts) + (j %% %s), 'job ' || j, 'deploy', ARRAY['true'], %s, 'UTC'
             FROM generate_series(0, %s - 1) AS j""",
        (accounts, CRON, n),
    )
    conn.execute("ANALYZE")
    return [int(row[0]) for row in conn.execute("SELECT id FROM jobs ORDER BY id").fetchall()]


def due_minute(lead: float) -> int:
    """The first minute that leaves the forecast ``lead`` seconds and a few to publish before it."""
    return minute_of(time.time() + lead + 10) + MINUTE


async def forecast_until(settings: Settings, url: str, job_ids: list[int], fire: int) -> None:
    """Publish, as a queuer worker holding ``job_ids`` does, until the due second."""
    heap = CronHeap()
    now = time.time()
    at = time.gmtime(fire)
    cron = f"{at.tm_min} {at.tm_hour} * * *"  # the jobs' schedule, as the heap holds it: due at ``fire``
    for job_id in job_ids:
        heap.assign(Definition(job_id, 1, cron, "UTC", 0), last_fire_ts=0, now=now)
    pool = await open_pool(url, min_size=1, max_size=2, name="bench-forecast")
    forecaster = Forecaster(settings.forecast, pool, "bench-queuer")
    try:
        while time.time() < fire:
            await forecaster.publish(heap.jobs(), time.time())
            await asyncio.sleep(min(settings.forecast.interval, max(0.0, fire - time.time())))
    finally:
        await pool.close()


async def fire_tick(settings: Settings, url: str, job_ids: list[int], fire: int, *, pickups: bool = True) -> list[int]:
    """At the due second: the queuer's INSERTs of the tick, each chunk's Pickups sent as it commits;
    returns the accounts with runs queued."""
    ticks = prepare_chunks([Due(job_id, fire, CRON, "UTC") for job_id in job_ids], settings.queuer.insert_chunk)
    pool = await open_pool(make_conninfo(url, application_name="queuer"), min_size=1, max_size=2, name="bench-queuer")
    bus = await AmqpBus.connect(settings.amqp_url) if pickups else None
    accounts: list[int] = []
    try:
        await asyncio.sleep(max(0.0, fire - time.time()))
        for tick in ticks:
            result = await queue_runs(pool, tick)
            accounts.extend(result.accounts)
            if bus is not None:
                await send_pickups(bus, Topology(settings.bus_prefix), result.accounts, source="queuer")
    finally:
        if bus is not None:
            await bus.close()
        await pool.close()
    return accounts


def wait_until_claimed(conn: psycopg.Connection[Any], n: int, timeout: float) -> bool:
    """Poll until ``n`` runs have started (or ended) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute("SELECT count(started_at) FROM runs").fetchone()
        if row is not None and int(row[0]) >= n:
            return True
        time.sleep(0.2)
    return False


def run_figures(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Prep time and run delay p50/p99/max and the on-time split, from the runs' own stamps."""
    row = conn.execute(
        """SELECT count(*), count(started_at),
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY prep), percentile_cont(0.99) WITHIN GROUP (ORDER BY prep),
                  max(prep),
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY delay),
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY delay), max(delay),
                  count(*) FILTER (WHERE delay <= 25), count(*) FILTER (WHERE delay > 25 AND delay <= 60),
                  count(*) FILTER (WHERE delay > 60 OR delay IS NULL),
                  count(*) FILTER (WHERE status = 10),
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY wait), percentile_cont(0.99) WITHIN GROUP (ORDER BY wait),
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY lag),
                  count(*) FILTER (WHERE launch_attempts > 1)
             FROM (SELECT status, started_at, launch_attempts,
                          extract(epoch FROM started_at - dispatched_at)::float8 AS prep,
                          extract(epoch FROM started_at - scheduled_at)::float8 AS delay,
                          extract(epoch FROM dispatched_at - queued_at)::float8 AS wait,
                          extract(epoch FROM queued_at - scheduled_at)::float8 AS lag FROM runs) AS r"""
    ).fetchone()
    assert row is not None
    runs = int(row[0]) or 1

    def seconds(value: object) -> float | None:
        return None if value is None else round(float(str(value)), 3)

    unstarted = conn.execute(
        "SELECT status, left(status_message, 120), count(*) FROM runs WHERE started_at IS NULL GROUP BY 1, 2"
    ).fetchall()
    relaunched = conn.execute(
        "SELECT left(status_message, 120), count(*) FROM runs WHERE launch_attempts > 1 GROUP BY 1"
    ).fetchall()
    failed = conn.execute(
        "SELECT status, left(status_message, 160), count(*) FROM runs WHERE started_at IS NOT NULL AND status <> 10"
        " GROUP BY 1, 2"
    ).fetchall()
    return {
        "not_started": [{"status": r[0], "message": r[1], "runs": r[2]} for r in unstarted],
        "not_succeeded": [{"status": r[0], "message": r[1], "runs": r[2]} for r in failed],
        "relaunch_messages": [{"message": r[0], "runs": r[1]} for r in relaunched],
        "runs": int(row[0]),
        "started": int(row[1]),
        "succeeded": int(row[11]),
        "relaunched": int(row[15]),  # launched more than once: a launch failed or its Pod did before the runner
        "prep_p50_s": seconds(row[2]),
        "prep_p99_s": seconds(row[3]),
        "prep_max_s": seconds(row[4]),
        "delay_p50_s": seconds(row[5]),
        "delay_p99_s": seconds(row[6]),
        "delay_max_s": seconds(row[7]),
        "wait_p50_s": seconds(row[12]),
        "wait_p99_s": seconds(row[13]),
        "trigger_lag_p99_s": seconds(row[14]),
        "on_time_le_25s": round(int(row[8]) / runs, 4),
        "on_time_25_60s": round(int(row[9]) / runs, 4),
        "late_gt_60s": round(int(row[10]) / runs, 4),
    }


def announce(case: dict[str, Any]) -> dict[str, Any]:
    """Print a case's figures as soon as it is done (stderr), and pass them on."""
    print(json.dumps({k: v for k, v in case.items() if k != "cpu_profile"}), file=sys.stderr, flush=True)
    return case


def ceiling() -> dict[str, Any]:
    """The pgbench one-row ceiling of this machine now, with the load average it was measured at."""
    value = measure_ceiling(CEILING_SECONDS)[0].value
    if not value:
        raise RuntimeError("the pgbench ceiling could not be measured")
    return {
        "ceiling_run_inserts_per_s": round(value, 1),
        "ceiling_load_average": [round(x, 2) for x in os.getloadavg()],
    }


# -- local ----------------------------------------------------------------------------------------


def _waiting_runners(dispatcher_pid: int, runner_api_port: int) -> int:
    """Started runners waiting in the dispatcher's fork server: its children connected to the runner API
    (each spare's cache keeper, also a child, is not)."""
    try:
        children = psutil.Process(dispatcher_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    waiting = 0
    for child in children:
        try:
            connections = child.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        waiting += any(c.raddr and c.raddr.port == runner_api_port for c in connections)
    return waiting


def local_case(
    case: str, n: int, spares_max: int, timeout: float, *, capacity: int = 0, profile: bool = False
) -> dict[str, Any]:
    base = Settings()
    prefix = f"bpeak{uuid.uuid4().hex[:10]}"
    with temporary_database() as url, tempfile.TemporaryDirectory() as logs:
        with psycopg.connect(url, autocommit=True) as conn:
            job_ids = _seed(conn, n)
        env = _env(base, url, prefix, "local")
        env.update(
            RUNPLANE_DISPATCHER__LOCAL_SPARES_MAX=str(1 if case == "one-spare" else spares_max),
            RUNPLANE_DISPATCHER__LOCAL_LEAD_SECONDS=str(LOCAL_LEAD_SECONDS),
            # A uid range of its own: the tests on this machine lease theirs from the default one.
            RUNPLANE_RUNNER__LOCAL_UID=str(BENCH_UIDS),
            RUNPLANE_DISPATCHER__LOCAL_CAPACITY=str(capacity),
        )
        settings = base.model_copy(update={"database_url": url, "bus_prefix": prefix, "redis_prefix": prefix})
        processes = Processes(env, Path(logs))
        try:
            processes.start("api", "api")
            processes.start("dispatcher", "dispatcher")
            processes.start("scheduler", "scheduler")
            _wait_for_dispatchers(url, 1)
            _wait_for_runner_api(env["RUNPLANE_RUNNER__API_ADDRESS"])
            fire = due_minute(LOCAL_LEAD_SECONDS)

            async def peak() -> int:
                forecast = (
                    asyncio.create_task(forecast_until(settings, url, job_ids, fire)) if case == "forecast" else None
                )
                await asyncio.sleep(max(0.0, fire - 0.3 - time.time()))
                port = int(env["RUNPLANE_RUNNER__API_ADDRESS"].rpartition(":")[2])
                waiting = _waiting_runners(processes.pids["dispatcher"], port)
                await fire_tick(settings, url, job_ids, fire)
                if forecast is not None:
                    await forecast
                return waiting

            sampler = CpuProfile(url, dict(processes.pids), interval=0.5) if profile else None
            if sampler is not None:
                sampler.start()
            waiting = asyncio.run(peak())
            with psycopg.connect(url, autocommit=True) as conn:
                wait_until_claimed(conn, n, timeout)
                cpu = sampler.stop() if sampler is not None else None
                figures = run_figures(conn)
        finally:
            processes.stop()
            _cleanup_prefix(base, prefix)
    return {
        "case": case,
        "n": n,
        "local_capacity": capacity or None,  # None: the default, per CPU
        **figures,
        "served_warm": round(min(waiting, n) / n, 4),
        "spares_at_due_second": waiting,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        **({"cpu_profile": cpu} if cpu is not None else {}),
    }


def local(
    ns: Sequence[int],
    cases: Sequence[str],
    spares_max: int,
    timeout: float,
    *,
    capacities: Sequence[int] = (0,),
    profile: bool = False,
) -> dict[str, Any]:
    results: dict[str, Any] = {"part": "local", "spares_max": spares_max, "lead_seconds": LOCAL_LEAD_SECONDS}
    results |= ceiling()
    results["cases"] = [
        announce(local_case(case, n, spares_max, timeout, capacity=capacity, profile=profile))
        for n in ns
        for capacity in capacities
        for case in cases
    ]
    return results


# -- report ---------------------------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    head = (
        f"{'part':<6}{'case':<11}{'N':>6}{'cap':>5}{'prep p50':>9}{'p99':>7}{'max':>7}"
        f"{'delay p50':>10}{'p99':>7}{'max':>7}"
        f"{'≤25s':>7}{'25-60':>7}{'>60s':>7}{'warm':>7}{'load 1m':>8}"
    )
    lines = [head]
    for c in results["cases"]:
        lines.append(
            f"{results['part']:<6}{c['case']:<11}{c['n']:>6}{c.get('local_capacity') or '-'!s:>5}"
            f"{c['prep_p50_s']!s:>9}{c['prep_p99_s']!s:>7}"
            f"{c['prep_max_s']!s:>7}{c['delay_p50_s']!s:>10}{c['delay_p99_s']!s:>7}{c['delay_max_s']!s:>7}"
            f"{c['on_time_le_25s']:>7.1%}{c['on_time_25_60s']:>7.1%}{c['late_gt_60s']:>7.1%}{c['served_warm']:>7.1%}"
            f"{c['load_average'][0]:>8}"
        )
    lines.append(f"pgbench one-row ceiling: {results['ceiling_run_inserts_per_s']} rows/s")
    for c in results["cases"]:
        if "pod_running_p50_s" in c:
            lines.append(
                f"Pod create → Running, {c['n']}: p50 {c['pod_running_p50_s']} s, p99 {c['pod_running_p99_s']} s,"
                f" max {c['pod_running_max_s']} s; runs per cluster {c['runs_by_cluster']}"
            )
    for c in results["cases"]:
        cpu = c.get("cpu_profile")
        if cpu:
            lines.append(f"CPU, {c['case']} {c['n']}: {cpu['seconds']} s window, machine {cpu['machine_cpu_s']} CPU s")
            lines.extend(f"  {seconds:>7.2f} s  {name}" for name, seconds in cpu["by_process"].items())
            lines.extend(f"  {seconds:>7.2f} s  {name}" for name, seconds in cpu["postgres_by_statement"].items())
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peak", description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["local", "node", "fleet"])
    parser.add_argument("--n", type=int, nargs="+", help="runs due at the one second (local: 1000 5000)")
    parser.add_argument("--cases", nargs="+", help="cases to run, in order (default: all of the part)")
    parser.add_argument("--spares-max", type=int, default=200, help="local: most spares the fork server keeps")
    parser.add_argument(
        "--capacity",
        type=int,
        nargs="+",
        default=[0],
        help="local: dispatcher.local_capacity of each case, side by side (0: the default, 16 per CPU)",
    )
    parser.add_argument("--nodes", type=int, default=50, help="fleet: hollow nodes per cluster")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a case may take to start its runs")
    parser.add_argument("--profile", action="store_true", help="CPU per service from the due second to the last start")
    args = parser.parse_args(argv)
    if args.part == "local":
        results = local(
            args.n or [1000, 5000],
            args.cases or LOCAL_CASES,
            args.spares_max,
            args.timeout,
            capacities=args.capacity,
            profile=args.profile,
        )
    elif args.part == "fleet":
        from bench.peak_fleet import fleet

        results = fleet(args.n[0] if args.n else 10_000, args.nodes, args.timeout)
    else:
        from bench.peak_node import node

        results = node(args.n[0] if args.n else None, args.cases, args.timeout)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"peak_{args.part}.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
