"""Top of the hour: N runs due at one second over A accounts, end to end from the due time.

Each account has run slots 10; its jobs (N / A of them) are deploy jobs with a schedule. Two
dispatcher processes (noop launcher) and a scheduler loop run as real ``runplane`` processes. At
the due second the queuer's own code queues the tick (``queuer_worker.firing.queue_runs``, in the
chunks of ``queuer.insert_chunk`` a queuer worker commits) and sends each chunk's Pickups
(``runplane.runs.pickups.send_pickups``), exactly what a queuer worker does once its heap says the
second is due; the orchestrator's assignment of N jobs to workers is left out, so that setting up
100,000 jobs takes seconds (``bench.queuer_burst`` measures the queuers on their own). From then
on everything is the real path: Pickups on RabbitMQ, dispatchers taking Redis locks and Postgres
rows, the noop launcher claiming each run (``started_at``).

Figures: run delay (``started_at - scheduled_at``) p50/p99/max, runs started per second (N over
the time from the due second to the last start), and the ratio of that to the pgbench one-row
ceiling measured in the same run (``bench.ceiling``). Beside it, pgqueuer's own benchmark
(``tools/benchmark.py`` of its repository, drain mode, its defaults) on the same Postgres, when a
copy of that file is given (``--pgqueuer-benchmark``; it is not part of pgqueuer's wheel).

With ``--jitter`` each case runs twice: as above, and with half of the jobs (every other one) given
``jitter_seconds`` 60, so that their runs are due their job's fixed offset after the second
(``runplane.basics.jitter``), queued as a worker's heap would: each due second's fires in ticks of
their own. Beside the run delay (from each run's due time) it then reports the delay from the
cron's instant and the peak: the most runs started in one second.

    python -m bench.top_of_hour --n 100000 --accounts 100000 [--pgqueuer-benchmark PATH] [--jitter]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from bench.ceiling import measure_ceiling
from bench.cpu_profile import CpuProfile
from bench.dispatch_throughput import (
    Processes,
    _cleanup_prefix,
    _env,
    _wait_for_dispatchers,
    wait_until_started,
)
from bench.sandbox import admin_url, temporary_database
from queuer_worker.firing import prepare_chunks, queue_runs
from queuer_worker.heap import Due
from runplane.adapters.bus import AmqpBus, Topology
from runplane.adapters.db import open_pool
from runplane.basics.jitter import jitter_offset
from runplane.basics.settings import Settings
from runplane.runs.pickups import send_pickups

RUN_SLOTS = 10
TARGET_P99_SECONDS = 10.0
DISPATCHERS = 2
CEILING_SECONDS = 10
JITTER_SECONDS = 60  # of the jittered half of the jobs, with --jitter


# The seeded jobs' schedule; the bench queues their runs at a second of its own choosing.
CRON = "0 * * * *"


def _seed(conn: psycopg.Connection[Any], n: int, accounts: int, jitter: int = 0) -> list[int]:
    """``accounts`` accounts with run slots 10 and ``n`` scheduled deploy jobs spread evenly over them;
    every other job with ``jitter`` seconds of jitter."""
    conn.execute(
        "INSERT INTO accounts (name, run_slots) SELECT 'bench ' || i, %s FROM generate_series(1, %s) AS i",
        (RUN_SLOTS, accounts),
    )
    conn.execute(
        """INSERT INTO jobs (account_id, name, job_type, steps, cron, timezone, jitter_seconds)
           SELECT (SELECT min(id) FROM accounts) + (j %% %s), 'job ' || j, 'deploy', ARRAY['true'], %s, 'UTC',
                  CASE WHEN j %% 2 = 1 THEN %s ELSE 0 END
             FROM generate_series(0, %s - 1) AS j""",
        (accounts, CRON, jitter, n),
    )
    conn.execute("ANALYZE")
    return [int(row[0]) for row in conn.execute("SELECT id FROM jobs ORDER BY id").fetchall()]


def _due(conn: psycopg.Connection[Any], fire: int) -> dict[int, list[Due]]:
    """The fires at ``fire`` by the second each is due (its job's jitter offset after it), as the heap
    orders them."""
    by_second: dict[int, list[Due]] = {}
    for job_id, jitter in conn.execute("SELECT id, jitter_seconds FROM jobs ORDER BY id").fetchall():
        offset = jitter_offset(int(job_id), int(jitter))
        by_second.setdefault(fire + offset, []).append(Due(int(job_id), fire, CRON, "UTC", offset))
    return dict(sorted(by_second.items()))


async def _fire(base: Settings, url: str, prefix: str, due: dict[int, list[Due]], fire: int) -> dict[str, float]:
    """At each due second: the queuer's INSERTs of its tick, each chunk's Pickups sent as it commits."""
    # Built before the second, as a worker does.
    seconds = [(second, prepare_chunks(fires, base.queuer.insert_chunk)) for second, fires in due.items()]
    # Named "queuer" in a profile, as the services are by their PGAPPNAME.
    pool = await open_pool(make_conninfo(url, application_name="queuer"), min_size=1, max_size=2, name="bench-queuer")
    bus = await AmqpBus.connect(base.amqp_url)
    first_pickups = 0.0
    try:
        for second, ticks in seconds:
            await asyncio.sleep(max(0.0, second - time.time()))
            for tick in ticks:
                result = await queue_runs(pool, tick)
                await send_pickups(bus, Topology(prefix), result.accounts, source="queuer")
                first_pickups = first_pickups or time.time()
        return {
            "first_pickups_sent_s": round(first_pickups - fire, 3),
            "pickups_sent_s": round(time.time() - fire, 3),
        }
    finally:
        await bus.close()
        await pool.close()


def runplane_case(n: int, accounts: int, timeout: float, profile: bool = False, jitter: int = 0) -> dict[str, Any]:
    base = Settings()
    prefix = f"btoh{uuid.uuid4().hex[:10]}"
    with temporary_database() as url, tempfile.TemporaryDirectory() as logs:
        with psycopg.connect(url, autocommit=True) as conn:
            _seed(conn, n, accounts, jitter)
        processes = Processes(_env(base, url, prefix, "noop"), Path(logs))
        try:
            for i in range(DISPATCHERS):
                processes.start("dispatcher", f"dispatcher-{i}")
            processes.start("scheduler", "scheduler")
            _wait_for_dispatchers(url, DISPATCHERS)
            fire = int(time.time()) + 2
            cpu: dict[str, Any] | None = None
            sampler = CpuProfile(url, {**processes.pids, "queuer (this process)": os.getpid()}) if profile else None
            if sampler is not None:
                sampler.start()
            with psycopg.connect(url, autocommit=True) as conn:
                due = _due(conn, fire)
            fired = asyncio.run(_fire(base, url, prefix, due, fire))
            with psycopg.connect(url, autocommit=True) as conn:
                wait_until_started(conn, timeout)
                cpu = sampler.stop() if sampler is not None else None
                row = conn.execute(
                    """SELECT count(*), count(started_at),
                              percentile_cont(0.5) WITHIN GROUP (ORDER BY delay),
                              percentile_cont(0.99) WITHIN GROUP (ORDER BY delay),
                              max(delay),
                              extract(epoch FROM max(started_at) - min(dispatched_at)),
                              count(*) FILTER (WHERE launch_attempts > 1),
                              percentile_cont(0.99) WITHIN GROUP (ORDER BY from_instant)
                         FROM (SELECT *, extract(epoch FROM started_at - scheduled_at) AS delay,
                                      extract(epoch FROM started_at) - split_part(idempotency_key, ':', 3)::bigint
                                        AS from_instant
                                 FROM runs) AS r"""
                ).fetchone()
                peak = conn.execute(
                    "SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM runs WHERE started_at IS NOT NULL"
                    " GROUP BY date_trunc('second', started_at)) AS s"
                ).fetchone()
        finally:
            processes.stop()
            _cleanup_prefix(base, prefix)
    assert row is not None and peak is not None
    queued, started = int(row[0]), int(row[1])
    last = float(row[4] or 0)
    return {
        "n": n,
        "accounts": accounts,
        "jittered": f"half of the jobs, up to {jitter} s" if jitter else "none",
        "runs_queued": queued,
        "runs_started": started,
        **fired,
        "run_delay_p50_s": round(float(row[2] or 0), 3),
        "run_delay_p99_s": round(float(row[3] or 0), 3),
        "run_delay_max_s": round(last, 3),
        "runs_per_s": round(started / last, 1) if last else None,
        "dispatch_runs_per_s": round(started / float(row[5]), 1) if row[5] else None,
        "relaunched": int(row[6]),
        "delay_from_instant_p99_s": round(float(row[7] or 0), 3),
        "peak_started_per_s": int(peak[0]),
        **({"cpu_profile": cpu} if cpu is not None else {}),
    }


def pgqueuer_drain(benchmark: Path) -> dict[str, Any]:
    """pgqueuer's own ``tools/benchmark.py --strategy drain`` with its defaults, on a database of its own."""
    base = Settings()
    name = f"rp_bench_pgq_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url(base.database_url), autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(base.database_url)
    env = {
        **os.environ,
        "PGHOST": str(info.get("host", "127.0.0.1")),
        "PGPORT": str(info.get("port", 5432)),
        "PGUSER": str(info.get("user", "postgres")),
        "PGDATABASE": name,
    }
    if info.get("password"):
        env["PGPASSWORD"] = str(info["password"])
    try:
        subprocess.run([sys.executable, "-m", "pgqueuer", "install"], env=env, check=True, capture_output=True)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            subprocess.run(
                [sys.executable, str(benchmark), "--strategy", "drain", "--output-json", str(out)],
                env=env,
                check=True,
                capture_output=True,
                timeout=600,
            )
            result = json.loads(out.read_text())
    finally:
        with psycopg.connect(admin_url(base.database_url), autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name))
            )
    return {"jobs": int(result["steps"]), "jobs_per_s": round(float(result["rate"]), 1), "driver": result["driver"]}


def run(  # noqa: PLR0917
    n: int,
    accounts: list[int],
    pgqueuer_benchmark: Path | None,
    timeout: float,
    profile: bool = False,
    jitter: bool = False,
) -> dict[str, Any]:
    ceiling = measure_ceiling(CEILING_SECONDS)[0].value
    if not ceiling:
        raise RuntimeError("the pgbench ceiling could not be measured")
    cases = []
    for spread in accounts:
        for seconds in (0, JITTER_SECONDS) if jitter else (0,):
            case = runplane_case(n, spread, timeout, profile, seconds)
            case["ratio_to_ceiling"] = round(case["runs_per_s"] / ceiling, 2) if case["runs_per_s"] else None
            case["load_average"] = [round(x, 2) for x in os.getloadavg()]
            cases.append(case)
    results: dict[str, Any] = {"ceiling_run_inserts_per_s": round(ceiling, 1), "runplane": cases}
    if pgqueuer_benchmark is not None:
        peer = pgqueuer_drain(pgqueuer_benchmark)
        peer["ratio_to_ceiling"] = round(peer["jobs_per_s"] / ceiling, 2)
        peer["load_average"] = [round(x, 2) for x in os.getloadavg()]
        results["pgqueuer_drain"] = peer
    results["target_run_delay_p99_s"] = TARGET_P99_SECONDS
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{'case':<34}{'runs/s':>10}{'vs ceiling':>12}{'p50 s':>8}{'p99 s':>8}{'max s':>8}{'started':>10}"
        f"{'peak/s':>8}{'p99 inst':>9}",
    ]
    for case in results["runplane"]:
        label = f"runplane {case['n']:,} / {case['accounts']:,} acc" + (" jit" if case["jittered"] != "none" else "")
        lines.append(
            f"{label:<34}{case['runs_per_s']!s:>10}{case['ratio_to_ceiling']!s:>12}{case['run_delay_p50_s']:>8}"
            f"{case['run_delay_p99_s']:>8}{case['run_delay_max_s']:>8}{case['runs_started']:>10}"
            f"{case['peak_started_per_s']:>8}{case['delay_from_instant_p99_s']:>9}"
        )
    peer = results.get("pgqueuer_drain")
    if peer:
        label = f"pgqueuer drain {peer['jobs']:,}"
        lines.append(f"{label:<28}{peer['jobs_per_s']!s:>10}{peer['ratio_to_ceiling']!s:>12}")
    lines.append(f"pgbench one-row ceiling: {results['ceiling_run_inserts_per_s']} rows/s")
    for case in results["runplane"]:
        cpu = case.get("cpu_profile")
        if not cpu:
            continue
        per_run = 1e6 / case["runs_started"] if case["runs_started"] else 0.0
        lines.append(
            f"CPU, {case['n']:,} / {case['accounts']:,} acc: {cpu['seconds']} s window, machine {cpu['machine_cpu_s']} "
            f"CPU s, counted {cpu['counted_cpu_s']} (µs per run started)"
        )
        for name, seconds in [*cpu["by_process"].items(), *cpu["postgres_by_statement"].items()]:
            lines.append(f"  {seconds:>7.2f} s {seconds * per_run:>7.1f} µs  {name}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.top_of_hour", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="runs due at the same second")
    parser.add_argument(
        "--accounts", type=int, nargs="+", default=[10_000], help="accounts the runs are spread over (one case each)"
    )
    parser.add_argument("--pgqueuer-benchmark", type=Path, help="a copy of pgqueuer's tools/benchmark.py")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a case may take to start every run")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample the CPU of each service and Postgres backend from the due second to the last start",
    )
    parser.add_argument(
        "--jitter",
        action="store_true",
        help=f"run each case again with half of the jobs jittered up to {JITTER_SECONDS} s",
    )
    args = parser.parse_args(argv)
    results = run(args.n, args.accounts, args.pgqueuer_benchmark, args.timeout, args.profile, args.jitter)
    print(json.dumps(results, indent=2))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
