"""Scale: N job definitions (1,000,000; quick 100,000) handed out by the orchestrator to 2 queuer
workers. Measures the time from the orchestrator's start until every job's ownership is 'claimed',
and the resident memory each worker gained per job it owns."""

from __future__ import annotations

import io
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
import psycopg

from bench.records import Measurement
from bench.sandbox import temporary_database, wait_until
from bench.services import RunplaneServices, require_services

WORKERS = 2
ACCOUNTS = 1000
COPY_CHUNK = 50_000


def require() -> None:
    require_services("orchestrator", "queuer-worker")


def setup_time(n: int) -> float:
    """Seconds before the orchestrator starts: the COPY of N jobs and the workers' idle memory."""
    return 4.0 + n * 12e-6


def measure_scale(n: int, cap: float) -> list[Measurement]:
    """One repetition; gives up ``cap`` seconds after the orchestrator starts."""
    require()
    with temporary_database() as url, tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        began = time.monotonic()
        insert_daily_jobs(url, n)
        insert_s = time.monotonic() - began
        with RunplaneServices(url, Path(tmp)) as services, psycopg.connect(url, autocommit=True) as conn:
            workers = [services.start("queuer-worker", f"worker-{i}") for i in range(WORKERS)]
            baseline = {proc.pid: settled_rss(proc.pid) for proc in workers}
            started = time.time()
            services.start("orchestrator", "orchestrator")
            claimed = 0
            deadline = started + cap
            while time.time() < deadline:
                services.check_alive()
                # Counting a million ownership rows takes Postgres a good part of a second: ask
                # the workers' heartbeats first, and count only once they hold every job.
                if held(conn) >= n:
                    claimed = count_claimed(conn)
                    if claimed >= n:
                        break
                time.sleep(0.25)
            assign_all_s = time.time() - started
            claimed = claimed or count_claimed(conn)
            gained = sum(settled_rss(proc.pid) - baseline[proc.pid] for proc in workers)
    out = [
        Measurement("insert_jobs", insert_s, "s", note="COPY, before the services start"),
        Measurement("claimed", float(claimed), "jobs"),
    ]
    if claimed >= n:
        out.append(Measurement("assign_all", assign_all_s, "s"))
    else:
        out.append(Measurement("timed_out", 1.0, "runs", note=f"{claimed} of {n} claimed within {cap:.0f} s"))
    if claimed:
        out.append(Measurement("memory_per_owned_job", gained / claimed, "B", note=f"RSS gained by {WORKERS} workers"))
    return out


def held(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The jobs the live workers said they hold in their last heartbeats."""
    row = conn.execute("SELECT coalesce(sum(jobs_owned), 0) FROM queuer_workers WHERE state = 'alive'").fetchone()
    return int(str(row[0])) if row else 0


def count_claimed(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute("SELECT count(*) FROM job_ownership WHERE state = 'claimed'").fetchone()
    return int(str(row[0])) if row else 0


def insert_daily_jobs(database_url: str, n: int) -> None:
    """N active deploy jobs over ACCOUNTS accounts, each firing daily half a day from now (so that
    none fires while it is measured). Triggers are skipped: the orchestrator reads all at start."""
    hour = (datetime.now(UTC).hour + 12) % 24
    with psycopg.connect(database_url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(
                "INSERT INTO accounts (name, run_slots) SELECT 'scale-' || g, 10 FROM generate_series(1, %s) g",
                (ACCOUNTS,),
            )
            (first_account,) = conn.execute("SELECT min(id) FROM accounts").fetchone() or (1,)
            with conn.cursor().copy("COPY jobs (account_id, name, job_type, steps, cron, timezone) FROM STDIN") as copy:
                for chunk_start in range(0, n, COPY_CHUNK):
                    buffer = io.StringIO()
                    for i in range(chunk_start, min(chunk_start + COPY_CHUNK, n)):
                        account = first_account + i % ACCOUNTS
                        buffer.write(f'{account}\tjob-{i}\tdeploy\t{{"dbt build"}}\t{i % 60} {hour} * * *\tUTC\n')
                    copy.write(buffer.getvalue())
        conn.execute("ANALYZE jobs")


def settled_rss(pid: int, timeout: float = 10.0) -> int:
    """Resident memory once it stops moving (two readings 0.5 s apart within 256 KiB)."""
    process = psutil.Process(pid)
    readings = [process.memory_info().rss]

    def settled() -> bool:
        readings.append(process.memory_info().rss)
        return abs(readings[-1] - readings[-2]) <= 256 * 1024

    wait_until(settled, timeout, interval=0.5)
    return readings[-1]
