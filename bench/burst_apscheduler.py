"""The burst on APScheduler 3: N cron-trigger jobs in one process with a BackgroundScheduler and its
default thread pool; lag = the time the job function starts minus the due time.

APScheduler's cron has seconds, so the jobs are simply due at a real second a little ahead. One
default is changed as a user expecting a burst would: ``misfire_grace_time=None``, since the default
(1 s) silently skips every run that starts more than a second late instead of running it late.

The scheduler runs in a child process (``python -m bench.burst_apscheduler``) so that a run past
its cap can be stopped, and so that its memory per job is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

from bench.records import Measurement, lag_measurements
from bench.sandbox import child_env, log_tail, start, stop, wait_until


def lead_time(n: int) -> float:
    """Seconds from planning to the due time: adding N jobs and computing their first fire times
    takes roughly 0.2 ms a job here, more when the machine is busy."""
    return 4.0 + n * 0.3e-3


def measure_burst(n: int, cap: float) -> list[Measurement]:
    """One repetition; gives up ``cap`` seconds after the due time."""
    due = float(int(time.time() + lead_time(n)))
    with tempfile.TemporaryDirectory(prefix="bench-apscheduler-") as tmp:
        result_path = Path(tmp) / "result.json"
        log = Path(tmp) / "apscheduler.log"
        proc = start(
            [
                "-m",
                "bench.burst_apscheduler",
                "--n",
                str(n),
                "--due",
                repr(due),
                "--cap",
                repr(cap),
                "--out",
                str(result_path),
            ],
            child_env(),
            log,
        )
        try:
            wait_until(lambda: proc.poll() is not None, due + cap + 30.0 - time.time(), interval=0.2)
        finally:
            stop(proc)
        if not result_path.exists():
            raise RuntimeError(f"APScheduler wrote no result (exit {proc.returncode}):\n{log_tail(log)}")
        result = json.loads(result_path.read_text())
    lags = [started - due for started in result["starts"] if started is not None]
    out = lag_measurements(lags, n, cap)
    out.append(Measurement("setup_overrun", max(result["ready_at"] - due, 0.0), "s"))
    out.append(Measurement("memory_per_job", result["rss_per_job"], "B"))
    return out


def _child(n: int, due: float, cap: float, out: Path) -> None:
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.cron import CronTrigger

    process = psutil.Process()
    rss_before = process.memory_info().rss
    starts: list[float | None] = [None] * n
    remaining = [n]
    lock = threading.Lock()
    all_started = threading.Event()

    def job(i: int) -> None:
        starts[i] = time.time()
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                all_started.set()

    moment = datetime.fromtimestamp(due, UTC)
    scheduler = BackgroundScheduler(timezone=UTC, job_defaults={"misfire_grace_time": None})
    for i in range(n):
        trigger = CronTrigger(hour=moment.hour, minute=moment.minute, second=moment.second, timezone=UTC)
        scheduler.add_job(job, trigger, args=(i,), id=f"job-{i}")
    scheduler.start()
    ready_at = time.time()
    rss_per_job = (process.memory_info().rss - rss_before) / n
    all_started.wait(timeout=max(due + cap - time.time(), 0.0))
    out.write_text(json.dumps({"starts": list(starts), "ready_at": ready_at, "rss_per_job": rss_per_job}))
    # Jobs still queued in the pool must not hold the process past its cap.
    os._exit(0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.burst_apscheduler")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--due", type=float, required=True)
    parser.add_argument("--cap", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    _child(args.n, args.due, args.cap, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
