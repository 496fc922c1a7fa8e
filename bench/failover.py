"""Failover: N jobs that fire every minute, owned by 3 queuer workers; one worker is killed with
SIGKILL 3 seconds before a minute's fires. Measures the time from the kill until the dead worker's
jobs fire again (their run for that minute is queued), the time until they are all claimed by the
survivors, missed fires (a job and minute with no run) and duplicate runs (a job and minute with
more than one)."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import psycopg

from bench.burst_jobs import insert_burst_jobs
from bench.records import Measurement
from bench.sandbox import temporary_database, wait_until
from bench.services import RunplaneServices, require_services

WORKERS = 3
KILL_BEFORE_FIRE = 3.0
# A minute's fires count as missed only once this long has passed since they were due.
SETTLE = 15.0


CLAIM_TIMEOUT = 60.0
# Seconds from the start that a repetition needs before the minute boundary it kills at: the
# database, the services and the claims (about 3.5 s idle, twice that on a loaded machine), the
# kill's lead and 2 s, and a margin; a repetition that needs more waits for the boundary after.
MINUTE_LEAD = 7.0 + KILL_BEFORE_FIRE + 2.0 + 9.0
REASSIGN_TIMEOUT = 60.0


def require() -> None:
    require_services("orchestrator", "queuer-worker")


def expected_duration(minutes_after: int) -> float:
    """What one repetition started ``MINUTE_LEAD`` before a minute boundary takes: the minutes
    observed after that boundary, the settling, stopping."""
    return MINUTE_LEAD + 60.0 * (minutes_after - 1) + SETTLE + 3.0


def measure_failover(n: int, minutes_after: int = 1) -> list[Measurement]:
    """One repetition; ``minutes_after`` minute boundaries from the kill on are checked for missed fires."""
    require()
    with temporary_database() as url, tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        insert_burst_jobs(url, n, "* * * * *", accounts=10)
        with RunplaneServices(url, Path(tmp)) as services, psycopg.connect(url, autocommit=True) as conn:
            services.start("orchestrator", "orchestrator")
            worker_ids = _start_workers(services, conn)
            if not wait_until(lambda: _claimed(conn) >= n, CLAIM_TIMEOUT, interval=0.25):
                services.check_alive()
                raise RuntimeError(f"only {_claimed(conn)} of {n} jobs claimed within {CLAIM_TIMEOUT:.0f} s")
            all_claimed_at = time.time()
            fire = _next_minute(all_claimed_at + KILL_BEFORE_FIRE + 2.0)
            victim = worker_ids[0]
            wait_until(lambda: time.time() >= fire - KILL_BEFORE_FIRE, fire - time.time() + 1.0, interval=0.05)
            victim_jobs = {
                int(row[0]) for row in conn.execute("SELECT job_id FROM job_ownership WHERE worker_id = %s", (victim,))
            }
            killed_at = time.time()
            services.kill_hard("worker-0")

            reassigned_at: list[float] = []

            def moved() -> bool:
                services.check_alive()
                row = conn.execute(
                    "SELECT count(*) FROM job_ownership WHERE job_id = ANY(%s) AND state = 'claimed'"
                    " AND worker_id IS DISTINCT FROM %s",
                    (list(victim_jobs), victim),
                ).fetchone()
                if row and int(row[0]) >= len(victim_jobs):
                    reassigned_at.append(time.time())
                    return True
                return False

            wait_until(moved, REASSIGN_TIMEOUT, interval=0.25)
            last_checked = fire + 60 * (minutes_after - 1)
            wait_until(lambda: time.time() >= last_checked + SETTLE, last_checked + SETTLE - time.time() + 1.0, 0.25)
            first_checked = _next_minute(all_claimed_at)
            minutes = list(range(first_checked, last_checked + 1, 60))
            fired_again = conn.execute(
                "SELECT count(*), max(extract(epoch FROM queued_at)) FROM runs"
                " WHERE job_id = ANY(%s) AND scheduled_at = to_timestamp(%s)",
                (list(victim_jobs), fire),
            ).fetchone()
            missed = conn.execute(
                "SELECT count(*) FROM jobs j CROSS JOIN unnest(%s::bigint[]) AS m(ts)"
                " WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.idempotency_key = 'sched:' || j.id || ':' || m.ts)",
                (minutes,),
            ).fetchone()
            duplicates = conn.execute(
                "SELECT coalesce(sum(c - 1), 0) FROM (SELECT count(*) AS c FROM runs WHERE trigger = 'schedule'"
                " GROUP BY job_id, scheduled_at) per_fire"
            ).fetchone()
    out = [
        Measurement("victim_jobs", float(len(victim_jobs)), "jobs"),
        Measurement(
            "missed_fires", float(missed[0]) if missed else math.nan, "fires", note=f"{len(minutes)} minutes checked"
        ),
        Measurement("duplicate_runs", float(duplicates[0]) if duplicates else math.nan, "runs"),
    ]
    if reassigned_at:
        out.append(Measurement("reassigned", reassigned_at[0] - killed_at, "s"))
    else:
        out.append(Measurement("timed_out", 1.0, "runs", note="the dead worker's jobs were not all reclaimed"))
    if fired_again and int(fired_again[0]) >= len(victim_jobs) and fired_again[1] is not None:
        out.append(
            Measurement("fire_again", float(fired_again[1]) - killed_at, "s", note="kill → its jobs' next run queued")
        )
    else:
        fired = int(fired_again[0]) if fired_again else 0
        out.append(
            Measurement("fire_again", None, "s", note=f"only {fired} of {len(victim_jobs)} fired for that minute")
        )
    return out


def _start_workers(services: RunplaneServices, conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """Start the workers one at a time, learning each one's worker_id as it appears."""
    ids: list[str] = []
    for i in range(WORKERS):
        services.start("queuer-worker", f"worker-{i}")

        def registered() -> bool:
            services.check_alive()
            rows = conn.execute(
                "SELECT worker_id FROM queuer_workers WHERE state = 'alive' ORDER BY registered_at"
            ).fetchall()
            new = [str(row[0]) for row in rows if row[0] not in ids]
            if new:
                ids.append(new[0])
                return True
            return False

        if not wait_until(registered, 30.0, interval=0.2):
            raise RuntimeError(f"queuer worker {i} did not register within 30 s")
    return ids


def _claimed(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute("SELECT count(*) FROM job_ownership WHERE state = 'claimed'").fetchone()
    return int(str(row[0])) if row else 0


def _next_minute(t: float) -> int:
    return int(math.ceil(t / 60.0) * 60)
