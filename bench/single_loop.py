"""The original single-loop queuer, kept only to measure the rebuild against.

Each pass reads every active scheduled job definition from Postgres, evaluates its cron with
croniter, and inserts a run for every fire time that fell since the previous pass, one INSERT per
run in autocommit as the original did; then it sleeps a short pass interval. The work of a pass
grows with the number of job definitions, however few are due: that is what it measures.

Run it as its own process: ``python -m bench.single_loop --database-url URL [--clock-offset S]``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import psycopg
from croniter import croniter

ACTIVE_SCHEDULED_JOBS = """
SELECT id, account_id, job_type, cron, timezone
  FROM jobs
 WHERE cron IS NOT NULL AND deleted_at IS NULL AND deactivated_at IS NULL
"""

INSERT_RUN = """
INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at)
VALUES (%s, %s, %s, 'schedule', %s, %s, to_timestamp(%s))
ON CONFLICT (idempotency_key) DO NOTHING
"""


class SingleLoopQueuer:
    """Walk every job, every pass. ``clock_offset`` shifts the clock it reads (see burst_jobs)."""

    def __init__(self, database_url: str, clock_offset: float = 0.0, pass_interval: float = 0.5) -> None:
        self.database_url = database_url
        self.clock_offset = clock_offset
        self.pass_interval = pass_interval
        self.attempted = 0  # INSERTs it tried: once per (job, fire) it found due
        self.inserted = 0  # runs it created
        self.pass_seconds: list[float] = []

    def now(self) -> float:
        return time.time() + self.clock_offset

    def run(self, stop: threading.Event) -> None:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            window_start = self.now()
            while not stop.is_set():
                began = time.monotonic()
                now = self.now()
                jobs = conn.execute(ACTIVE_SCHEDULED_JOBS).fetchall()
                for job_id, account_id, job_type, cron, timezone in jobs:
                    for fire in fires_between(cron, timezone, window_start, now):
                        cursor = conn.execute(
                            INSERT_RUN,
                            (account_id, job_id, job_type, f"sched:{job_id}:{fire}", job_type != "ci", fire),
                        )
                        self.attempted += 1
                        self.inserted += max(cursor.rowcount, 0)
                window_start = now
                self.pass_seconds.append(time.monotonic() - began)
                print(f"pass {len(self.pass_seconds)} {self.pass_seconds[-1]:.4f}s jobs={len(jobs)}", flush=True)
                stop.wait(self.pass_interval)


def fires_between(cron: str, timezone: str, after: float, until: float) -> Iterator[int]:
    """Fire times (unix seconds) in (after, until]."""
    it = croniter(cron, datetime.fromtimestamp(after, ZoneInfo(timezone)))
    while True:
        fire = int(it.get_next(float))
        if fire > until:
            return
        yield fire


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.single_loop")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--clock-offset", type=float, default=0.0)
    parser.add_argument("--pass-interval", type=float, default=0.5)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    queuer = SingleLoopQueuer(args.database_url, args.clock_offset, args.pass_interval)
    queuer.run(stop)
    print(f"stopped inserted={queuer.inserted}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
