"""Burst: N job definitions all due at the same second, one orchestrator and ``workers`` queuer workers.

Uses its own temporary database and bus prefix. Measures, from the run rows: the time until all N
runs are queued after the fire second, and trigger lag (queued_at - scheduled_at) p50/p99; and,
from the workers' resident memory before and after they took their jobs, bytes per owned job.

    python -m bench.queuer_burst --n 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import aio_pika
import psutil
import psycopg

from runplane.adapters.bus import Topology
from runplane.basics.settings import Settings
from runplane.commands.migrate import migrate

ACCOUNTS_PER_JOBS = 100  # one account per 100 jobs, at most 1,000 accounts


def run(n: int, workers: int = 2) -> dict[str, Any]:
    """Run the scenario once; the figures as a dict."""
    base = Settings()
    name = f"rp_bench_{uuid.uuid4().hex[:10]}"
    admin_url = psycopg.conninfo.make_conninfo(base.database_url, dbname="postgres")
    db_url = psycopg.conninfo.make_conninfo(base.database_url, dbname=name)
    prefix = f"rpbench{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        migrate(db_url)
        env = {
            **os.environ,
            "RUNPLANE_DATABASE_URL": db_url,
            "RUNPLANE_BUS_PREFIX": prefix,
            "RUNPLANE_REDIS_PREFIX": prefix,
            "RUNPLANE_LOG_FORMAT": "text",
            "RUNPLANE_LOG_LEVEL": os.environ.get("RUNPLANE_LOG_LEVEL", "WARNING"),
            "RUNPLANE_ORCHESTRATOR__HEARTBEAT_INTERVAL": "1",
            "RUNPLANE_ORCHESTRATOR__RECONCILE_INTERVAL": "30",
        }
        with psycopg.connect(db_url, autocommit=True) as db:
            return _scenario(db, env, n, workers, procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        with psycopg.connect(db_url, autocommit=True) as db_conn:
            worker_ids = [str(r[0]) for r in db_conn.execute("SELECT worker_id FROM queuer_workers")]
        asyncio.run(_delete_queues(base.amqp_url, prefix, worker_ids))
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name))
            )


def fire_lead(n: int) -> float:
    """Seconds to leave, once the workers run, for inserting and assigning N jobs before the fire:
    the orchestrator's start and the registrations take a few seconds, assigning some 15,000 jobs a
    second, with room to spare."""
    return 15 + n / 4000


def _scenario(
    db: psycopg.Connection[Any], env: dict[str, str], n: int, workers: int, procs: list[subprocess.Popen[bytes]]
) -> dict[str, Any]:
    exe = [sys.executable, "-m", "runplane"]
    worker_procs = [subprocess.Popen([*exe, "queuer-worker"], env=env) for _ in range(workers)]
    procs.extend(worker_procs)
    _wait(lambda: _rss_settled(worker_procs), 60, "workers started")
    rss_before = [psutil.Process(p.pid).memory_info().rss for p in worker_procs]

    # The fire: the first minute boundary that leaves time to insert and assign every job.
    fire = (int(time.time() + fire_lead(n)) // 60 + 1) * 60
    at = datetime.fromtimestamp(fire, UTC)
    cron = f"{at.minute} {at.hour} {at.day} {at.month} *"
    accounts = min(1000, max(1, n // ACCOUNTS_PER_JOBS))
    db.execute(
        "INSERT INTO accounts (name, run_slots) SELECT 'bench-' || g, 10 FROM generate_series(1, %s) g", (accounts,)
    )
    db.execute(
        """INSERT INTO jobs (account_id, name, job_type, steps, cron, timezone)
           SELECT (SELECT min(id) FROM accounts) + (g %% %s), 'burst-' || g, 'deploy', ARRAY['true'], %s, 'UTC'
           FROM generate_series(1, %s) g""",
        (accounts, cron, n),
    )
    started = time.time()
    procs.append(subprocess.Popen([*exe, "orchestrator"], env=env))
    _wait(lambda: _claimed(db) == n, max(60.0, fire - time.time() - 1), f"{n} jobs claimed before the fire")
    assigned_s = time.time() - started
    time.sleep(2 * 1.0)  # two heartbeats: the workers' reported counts are current
    rss_after = [psutil.Process(p.pid).memory_info().rss for p in worker_procs]
    owned = dict(db.execute("SELECT worker_id, jobs_owned FROM queuer_workers").fetchall())
    if fire - time.time() < 1:
        raise RuntimeError("assignment took longer than the lead time; the fire was not measured")

    _wait(lambda: _runs(db) >= n, fire - time.time() + 120, f"{n} runs queued")
    row = db.execute(
        """SELECT count(*),
                  extract(epoch FROM max(queued_at) - min(scheduled_at)),
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM queued_at - scheduled_at)),
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM queued_at - scheduled_at)),
                  max(extract(epoch FROM queued_at - scheduled_at)),
                  min(extract(epoch FROM queued_at - scheduled_at))
           FROM runs WHERE trigger = 'schedule'"""
    ).fetchone()
    assert row is not None
    dup = db.execute("SELECT count(*) - count(DISTINCT idempotency_key) FROM runs").fetchone()
    total_owned = sum(int(v) for v in owned.values())
    grown = sum(a - b for a, b in zip(rss_after, rss_before, strict=True))
    return {
        "n": n,
        "workers": workers,
        "accounts": accounts,
        "assign_seconds": round(assigned_s, 2),
        "runs_queued": int(row[0]),
        "duplicate_runs": int(dup[0]) if dup else None,
        "all_queued_seconds": round(float(row[1]), 3),
        "trigger_lag_min_s": round(float(row[5]), 3),
        "trigger_lag_p50_s": round(float(row[2]), 3),
        "trigger_lag_p99_s": round(float(row[3]), 3),
        "trigger_lag_max_s": round(float(row[4]), 3),
        "jobs_owned": owned,
        "worker_rss_before_mib": [round(r / 2**20, 1) for r in rss_before],
        "worker_rss_after_mib": [round(r / 2**20, 1) for r in rss_after],
        "bytes_per_owned_job": round(grown / total_owned) if total_owned else None,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _rss_settled(procs: list[subprocess.Popen[bytes]]) -> bool:
    # Started means imported and connected: resident memory stops growing.
    first = [psutil.Process(p.pid).memory_info().rss for p in procs]
    time.sleep(1.0)
    second = [psutil.Process(p.pid).memory_info().rss for p in procs]
    return all(b > 30 * 2**20 and abs(b - a) < 256 * 1024 for a, b in zip(first, second, strict=True))


def _claimed(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) FROM job_ownership WHERE state = 'claimed'").fetchone()
    return int(row[0]) if row else 0


def _runs(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) FROM runs").fetchone()
    return int(row[0]) if row else 0


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


async def _delete_queues(amqp_url: str, prefix: str, worker_ids: list[str]) -> None:
    topo = Topology(prefix)
    connection = await aio_pika.connect(amqp_url)
    try:
        for queue in [topo.assign, topo.orchestrator, topo.pickup, *(topo.worker(w) for w in worker_ids)]:
            channel = await connection.channel()
            try:
                await channel.queue_delete(queue)
            except aio_pika.exceptions.AMQPError:
                continue
            await channel.close()
    finally:
        await connection.close()


def table(result: dict[str, Any]) -> str:
    width = max(len(k) for k in result)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in result.items())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queuer_burst", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="jobs due at the same second")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    result = run(args.n, args.workers)
    print(json.dumps(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
