"""The burst on the single-loop queuer: N jobs due at the same minute, lag = queued_at - due."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import psycopg

from bench.burst_jobs import insert_burst_jobs, plan_burst
from bench.records import Measurement, lag_measurements
from bench.sandbox import child_env, log_tail, start, stop, temporary_database

PASS_INTERVAL = 0.5


def lead_time(n: int) -> float:
    """Seconds from planning to the due time: process start and one pass over every job (croniter
    costs some tens of µs a job)."""
    return 3.0 + n * 60e-6


def measure_burst(n: int, cap: float) -> list[Measurement]:
    """One repetition; gives up ``cap`` seconds after the due time."""
    with temporary_database() as url, tempfile.TemporaryDirectory(prefix="bench-single-loop-") as tmp:
        clock = plan_burst(lead=lead_time(n))
        insert_burst_jobs(url, n, clock.cron)
        log = Path(tmp) / "single_loop.log"
        proc = start(
            [
                "-m",
                "bench.single_loop",
                "--database-url",
                url,
                "--clock-offset",
                repr(clock.offset),
                "--pass-interval",
                str(PASS_INTERVAL),
            ],
            child_env(),
            log,
        )
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                deadline = clock.due + cap
                while time.time() < deadline:
                    if proc.poll() is not None:
                        raise RuntimeError(f"the single-loop queuer exited {proc.returncode}:\n{log_tail(log)}")
                    (count,) = conn.execute("SELECT count(*) FROM runs").fetchone() or (0,)
                    if count >= n:
                        break
                    time.sleep(0.2)
        finally:
            stop(proc)
        with psycopg.connect(url, autocommit=True) as conn:
            lags = [
                float(row[0])
                for row in conn.execute(
                    "SELECT extract(epoch FROM queued_at) - %s FROM runs WHERE trigger = 'schedule'", (clock.due,)
                )
            ]
        passes = [
            float(line.split()[2].rstrip("s")) for line in log.read_text().splitlines() if line.startswith("pass ")
        ]
    out = lag_measurements(lags, n, cap)
    if passes:
        # The quickest pass queued nothing: it is the cost of reading and evaluating every job.
        out.append(Measurement("idle_pass", min(passes), "s", note="a pass over every job that queues nothing"))
    return out
