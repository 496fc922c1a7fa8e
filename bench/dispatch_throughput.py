"""Dispatch throughput and prep time, on this machine's real Postgres, RabbitMQ and Redis.

1. **Throughput** (noop launcher): ``accounts`` accounts, each with ``runs_per_account`` queued runs
   of as many jobs; a scheduler loop and ``dispatchers`` dispatcher processes move them queued →
   running (the noop launcher claims and finishes each at once). Figure: runs per second between the
   first ``dispatched_at`` and the last ``started_at``. A dispatch pass costs about the same however
   many runs it starts (one account lock, one transaction), so the figure grows with the runs each
   pass finds: on 2 cores, about 300 passes per second.
2. **Prep time** (local launcher): runs queued at a steady ``rate`` per second for ``seconds``, each
   a real runner process with one trivial step. Figures: prep time (``started_at - dispatched_at``)
   p50/p99, and run delay (``started_at - scheduled_at``) p50/p99.

Each part uses its own temporary database (created, migrated, dropped) and bus/Redis prefix.
``python -m bench.dispatch_throughput [--quick]`` prints JSON and a table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import psutil
import psycopg

from bench.sandbox import delete_prefixed_keys, temporary_database
from runplane.adapters.bus import AmqpBus, Topology
from runplane.basics.settings import Settings
from runplane.runs.pickups import pickup
from tests.support.ports import free_port

TARGET_RUNS_PER_SECOND = 2000
TARGET_PREP_P99_SECONDS = 1.0


class Processes:
    """``runplane`` service processes for one part; stopped (runners included) on exit."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.started: list[subprocess.Popen[bytes]] = []
        self.pids: dict[str, int] = {}

    def start(self, command: str, name: str, **env: str) -> None:
        """Start ``runplane <command>`` with ``env`` over the part's environment; its Postgres connections
        carry ``name`` as their application_name."""
        with (self.log_dir / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "runplane", command],
                env={**self.env, **env, "PGAPPNAME": name},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.started.append(process)
        self.pids[name] = process.pid

    def stop(self) -> None:
        descendants: set[int] = set()
        for process in self.started:
            with contextlib.suppress(psutil.NoSuchProcess):
                descendants |= {p.pid for p in psutil.Process(process.pid).children(recursive=True)}
            process.terminate()
        for process in self.started:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()


def _env(base: Settings, database_url: str, prefix: str, launcher: str) -> dict[str, str]:
    env = os.environ.copy()
    env.update(
        RUNPLANE_DATABASE_URL=database_url,
        RUNPLANE_BUS_PREFIX=prefix,
        RUNPLANE_REDIS_PREFIX=prefix,
        RUNPLANE_DISPATCHER__LAUNCHER=launcher,
        RUNPLANE_LOG_FORMAT="text",
        RUNPLANE_LOG_LEVEL="WARNING",
        RUNPLANE_DRAIN_SECONDS="10",
    )
    # Runners reach the control plane through the runner API only: an API process on free ports.
    api_port, runner_port, rest_port = free_port(), free_port(), free_port()
    env.update(
        RUNPLANE_API__PORT=str(api_port),
        RUNPLANE_API__RUNNER_PORT=str(runner_port),
        RUNPLANE_API__REST_PORT=str(rest_port),  # not the default 8000: another program may hold it
        RUNPLANE_RUNNER__API_ADDRESS=f"127.0.0.1:{runner_port}",
    )
    return env


async def clean_prefix(amqp_url: str, prefix: str) -> None:
    """Delete what a bench's system left under ``prefix``: its pickup queue and its Redis keys."""
    bus = await AmqpBus.connect(amqp_url)
    try:
        await bus.delete(Topology(prefix).pickup)
    finally:
        await bus.close()
    delete_prefixed_keys(prefix)


def _cleanup_prefix(base: Settings, prefix: str) -> None:
    asyncio.run(clean_prefix(base.amqp_url, prefix))


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _seed(conn: psycopg.Connection[Any], accounts: int, runs_per_account: int, run_slots: int) -> int:
    """Accounts with one job per run (so serial execution never holds a run back) and queued runs."""
    conn.execute(
        "INSERT INTO accounts (name, run_slots) SELECT 'bench ' || i, %s FROM generate_series(1, %s) AS i",
        (run_slots, accounts),
    )
    conn.execute(
        """INSERT INTO jobs (account_id, name, job_type, steps)
           SELECT a.id, 'job ' || j, 'deploy', ARRAY['true'] FROM accounts a, generate_series(1, %s) AS j""",
        (runs_per_account,),
    )
    conn.execute(
        """INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at)
           SELECT account_id, id, job_type, 'api', 'bench:' || id, true, clock_timestamp() FROM jobs"""
    )
    return accounts * runs_per_account


def wait_until_started(conn: psycopg.Connection[Any], timeout: float) -> bool:
    """Poll until no run is queued or starting (True) or ``timeout`` seconds pass (False).

    Two index probes, not a count of every run: the poll takes next to nothing from what it measures.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT EXISTS (SELECT FROM runs WHERE status = 1) OR EXISTS (SELECT FROM runs WHERE status = 2)"
        ).fetchone()
        if row is not None and not row[0]:
            return True
        time.sleep(0.1)
    return False


def throughput(
    *, accounts: int = 1000, runs_per_account: int = 10, run_slots: int = 10, dispatchers: int = 2, timeout: float = 300
) -> dict[str, Any]:
    """Queued → running with the noop launcher; runs per second through dispatch."""
    base = Settings()
    prefix = f"bdt{uuid.uuid4().hex[:10]}"
    with temporary_database() as url, tempfile.TemporaryDirectory() as logs:
        with psycopg.connect(url, autocommit=True) as conn:
            total = _seed(conn, accounts, runs_per_account, run_slots)
            conn.execute("ANALYZE")
        processes = Processes(_env(base, url, prefix, "noop"), Path(logs))
        try:
            for i in range(dispatchers):
                processes.start("dispatcher", f"dispatcher-{i}")
            processes.start("scheduler", "scheduler")
            with psycopg.connect(url, autocommit=True) as conn:
                wait_until_started(conn, timeout)
                row = conn.execute(
                    """SELECT count(started_at), extract(epoch FROM max(started_at) - min(dispatched_at)),
                              count(*) FILTER (WHERE launch_attempts > 1)
                         FROM runs"""
                ).fetchone()
        finally:
            processes.stop()
            _cleanup_prefix(base, prefix)
    assert row is not None
    started, seconds, relaunched = int(row[0]), float(row[1] or 0), int(row[2])
    return {
        "accounts": accounts,
        "runs": total,
        "runs_started": started,
        "dispatchers": dispatchers,
        "seconds": round(seconds, 3),
        "runs_per_second": round(started / seconds, 1) if seconds else None,
        "relaunched": relaunched,
        "target_runs_per_second": TARGET_RUNS_PER_SECOND,
    }


def prep_time(
    *, rate: float = 10.0, seconds: float = 30.0, accounts: int = 10, dispatchers: int = 2, fenced: bool = True
) -> dict[str, Any]:
    """Runs queued at a steady ``rate`` with the local launcher; prep time and run delay percentiles.
    ``fenced`` off: runs keep uids of their own (as root) without the fence (``runner.local_fence``)."""
    base = Settings()
    prefix = f"bdp{uuid.uuid4().hex[:10]}"
    total = int(rate * seconds)
    with temporary_database() as url, tempfile.TemporaryDirectory() as logs:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO accounts (name, run_slots) SELECT 'bench ' || i, 1000 FROM generate_series(1, %s) AS i",
                (accounts,),
            )
            conn.execute(
                """INSERT INTO jobs (account_id, name, job_type, steps)
                   SELECT 1 + (j %% %s), 'job ' || j, 'adhoc', ARRAY['true'] FROM generate_series(1, %s) AS j""",
                (accounts, total),
            )
            job_ids = [int(r[0]) for r in conn.execute("SELECT id FROM jobs ORDER BY id").fetchall()]
        env = _env(base, url, prefix, "local")
        env["RUNPLANE_RUNNER__LOCAL_FENCE"] = str(fenced).lower()
        processes = Processes(env, Path(logs))
        try:
            processes.start("api", "api")
            for i in range(dispatchers):
                processes.start("dispatcher", f"dispatcher-{i}")
            processes.start("scheduler", "scheduler")
            _wait_for_dispatchers(url, dispatchers)
            _wait_for_runner_api(processes.env["RUNPLANE_RUNNER__API_ADDRESS"])
            asyncio.run(_queue_steadily(base, url, prefix, job_ids, rate))
            deadline = time.monotonic() + 120
            with psycopg.connect(url, autocommit=True) as conn:
                while time.monotonic() < deadline:
                    row = conn.execute("SELECT count(*) FROM runs WHERE status < 10").fetchone()
                    if row is not None and row[0] == 0:
                        break
                    time.sleep(0.2)
                found = conn.execute(
                    """SELECT extract(epoch FROM started_at - dispatched_at)::float8,
                              extract(epoch FROM started_at - scheduled_at)::float8, status
                         FROM runs"""
                ).fetchall()
        finally:
            processes.stop()
            _cleanup_prefix(base, prefix)
    prep = [float(r[0]) for r in found if r[0] is not None]
    delay = [float(r[1]) for r in found if r[1] is not None]
    return {
        "rate_per_second": rate,
        "runs": total,
        "succeeded": sum(1 for r in found if r[2] == 10),
        "prep_time_p50": round(_percentile(prep, 0.50), 3),
        "prep_time_p99": round(_percentile(prep, 0.99), 3),
        "prep_time_max": round(max(prep), 3) if prep else None,
        "run_delay_p50": round(_percentile(delay, 0.50), 3),
        "run_delay_p99": round(_percentile(delay, 0.99), 3),
        "target_prep_time_p99": TARGET_PREP_P99_SECONDS,
        "load_average": round(os.getloadavg()[0], 2),  # the 1-minute load when the steady phase ended
    }


def _wait_for_dispatchers(url: str, count: int, timeout: float = 60) -> None:
    """Measure the steady state: dispatchers announce themselves once their launcher is ready."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT count(*) FROM dispatchers").fetchone()
            if row is not None and row[0] >= count:
                return
            time.sleep(0.1)
    raise RuntimeError("dispatchers did not become ready")


def _wait_for_runner_api(address: str, timeout: float = 60) -> None:
    """Measure the steady state: runners claim through the API process, so wait until it listens."""
    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError as exc:
        raise RuntimeError(f"the runner API at {address} did not become ready") from exc
    finally:
        channel.close()


async def _queue_steadily(base: Settings, url: str, prefix: str, job_ids: list[int], rate: float) -> None:
    """One run every 1/rate seconds, each followed by a Pickup (as a queuer worker does)."""
    bus = await AmqpBus.connect(base.amqp_url)
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        start = time.monotonic()
        for index, job_id in enumerate(job_ids):
            await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
            cur = await conn.execute(
                """INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at)
                   SELECT account_id, id, job_type, 'api', 'bench:' || id, true, clock_timestamp()
                     FROM jobs WHERE id = %s RETURNING account_id""",
                (job_id,),
            )
            row = await cur.fetchone()
            assert row is not None
            await bus.publish(Topology(prefix).pickup, pickup([int(row[0])]))
    finally:
        await conn.close()
        await bus.close()


def run(
    *,
    quick: bool = False,
    accounts: int = 1000,
    runs_per_account: int = 10,
    rate: float = 10.0,
    seconds: float | None = None,
    parts: Sequence[str] = ("throughput", "prep_time"),
) -> dict[str, Any]:
    """The named parts (both by default); ``quick`` shortens the steady phase of the prep-time part
    (15 s instead of 60 s).

    Each account has ``runs_per_account`` queued runs and as many run slots, so one dispatch pass
    can start them all; fewer runs per account means more passes per run (see the module doc).
    """
    unknown = set(parts) - {"throughput", "prep_time"}
    if unknown:
        raise ValueError(f"unknown part(s) {sorted(unknown)}")
    steady = seconds if seconds is not None else (15.0 if quick else 60.0)
    results: dict[str, Any] = {}
    if "throughput" in parts:
        results["throughput_noop"] = throughput(
            accounts=accounts, runs_per_account=runs_per_account, run_slots=runs_per_account
        )
    if "prep_time" in parts:
        # Side by side on one machine: what fencing a run (DESIGN.md rule 7) costs, when it can be fenced.
        if os.geteuid() == 0:
            results["prep_time_local_unfenced"] = prep_time(rate=rate, seconds=steady, fenced=False)
        results["prep_time_local"] = prep_time(rate=rate, seconds=steady)
    results["load_average"] = round(os.getloadavg()[0], 2)
    return results


def _table(results: dict[str, Any]) -> str:
    t, p = results["throughput_noop"], results["prep_time_local"]
    sizes = "{}/{}/{}".format(t["runs"], t["accounts"], t["seconds"])
    delays = "{}/{}".format(p["run_delay_p50"], p["run_delay_p99"])
    lines = [
        f"{'figure':<40}{'value':>12}{'target':>12}",
        f"{'dispatch throughput, noop (runs/s)':<40}{t['runs_per_second']!s:>12}{f'>= {TARGET_RUNS_PER_SECOND}':>12}",
        f"{'  runs / accounts / seconds':<40}{sizes:>12}",
        f"{'prep time p50, local (s)':<40}{p['prep_time_p50']!s:>12}",
        f"{'prep time p99, local (s)':<40}{p['prep_time_p99']!s:>12}{'<= ' + str(TARGET_PREP_P99_SECONDS):>12}",
        f"{'run delay p50 / p99, local (s)':<40}{delays:>12}",
    ]
    if (u := results.get("prep_time_local_unfenced")) is not None:
        unfenced = "{}/{}".format(u["prep_time_p50"], u["prep_time_p99"])
        lines.append(f"{'prep time p50 / p99, local, unfenced (s)':<40}{unfenced:>12}")
    lines.append(f"{'load average (1 min)':<40}{results['load_average']!s:>12}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch_throughput", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    results = run(quick=args.quick)
    print(json.dumps(results, indent=2))
    print(_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
