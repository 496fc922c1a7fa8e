"""The burst on Celery beat with a Celery worker on the same RabbitMQ: N crontab entries due at the
same minute; lag = the time the task starts (recorded in Redis) minus the due time.

Beat and the worker run as their own processes with their defaults (persistent shelve schedule,
prefork pool of one process per core), on a queue and a Redis key of their own, removed afterwards.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from datetime import datetime
from pathlib import Path

import redis
from celery import Celery

from bench.burst_jobs import plan_burst
from bench.records import Measurement, lag_measurements
from bench.sandbox import child_env, log_tail, start, stop, unique_name, wait_until

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
REDIS_URL = "redis://127.0.0.1:6379/0"
READY_LINE = "Ticking with max interval"  # beat logs it once its schedule is loaded
SENDING = "Scheduler: Sending due task job-"


def lead_time(n: int) -> float:
    """Seconds from planning to the due time: the worker's start, then beat loading N crontab entries
    and writing its shelve (about 0.2 ms an entry)."""
    return 8.0 + n * 0.3e-3


def measure_burst(n: int, cap: float) -> list[Measurement]:
    """One repetition; gives up ``cap`` seconds after the due time."""
    queue = unique_name("bench-celery-")
    starts_key = f"{queue}:starts"
    client = redis.Redis.from_url(REDIS_URL)
    clock = plan_burst(lead=lead_time(n))
    env = child_env(
        BENCH_CELERY_QUEUE=queue,
        BENCH_CELERY_BROKER=AMQP_URL,
        BENCH_CELERY_REDIS=REDIS_URL,
        BENCH_CELERY_STARTS_KEY=starts_key,
        BENCH_CELERY_N=str(n),
        BENCH_CELERY_CRON=clock.cron,
        BENCH_CELERY_CLOCK_OFFSET=repr(clock.offset),
    )
    with tempfile.TemporaryDirectory(prefix="bench-celery-") as tmp:
        beat_log = Path(tmp) / "beat.log"
        worker_log = Path(tmp) / "worker.log"
        worker = start(
            ["-m", "celery", "-A", "bench.celery_app", "worker", "-Q", queue, "-n", f"{queue}@%h", "-l", "warning"],
            env,
            worker_log,
        )
        beat = None
        try:
            _wait_worker_ready(queue, starts_key, client, worker_log)
            beat = start(
                [
                    "-m",
                    "celery",
                    "-A",
                    "bench.celery_app",
                    "beat",
                    "-s",
                    str(Path(tmp) / "schedule"),
                    "--pidfile",
                    str(Path(tmp) / "beat.pid"),
                    "-l",
                    "debug",
                ],
                env,
                beat_log,
            )
            ready = wait_until(
                lambda: READY_LINE in beat_log.read_text(errors="replace"), clock.due + cap - time.time()
            )
            ready_at = time.time()
            deadline = clock.due + cap
            while ready and time.time() < deadline:
                if beat.poll() is not None or worker.poll() is not None:
                    raise RuntimeError(f"celery exited:\n{log_tail(beat_log)}\n{log_tail(worker_log)}")
                if int(client.llen(starts_key)) >= n:
                    break
                time.sleep(0.2)
        finally:
            if beat is not None:
                stop(beat)
            stop(worker)
            lags = _lags(client, starts_key, clock.due)
            client.delete(starts_key)
            client.close()
            _delete_queue(queue)
        sent = _sent_lags(beat_log, clock.due)
    out = lag_measurements(lags, n, cap)
    # Beat's own part: when it sent each task, comparable with a queuer's queued_at.
    out += [
        Measurement(f"sent_{m.metric}", m.value, m.unit, m.note)
        for m in lag_measurements(sent, n, cap)
        if m.metric.startswith("lag_") or m.metric == "all_done"
    ]
    out.append(Measurement("setup_overrun", max(ready_at - clock.due, 0.0), "s"))
    return out


def _sent_lags(beat_log: Path, due: float) -> list[float]:
    """From beat's log lines ``[2026-01-01 12:00:00,123: INFO/MainProcess] Scheduler: Sending due task
    job-7 ...`` (local time, milliseconds)."""
    lags: list[float] = []
    for line in beat_log.read_text(errors="replace").splitlines():
        if SENDING in line and line.startswith("["):
            stamp = line[1:24]
            try:
                sent = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            lags.append(sent - due)
    return lags


def _wait_worker_ready(queue: str, key: str, client: redis.Redis, log: Path) -> None:
    """Send one warm-up task and wait until the worker has run it."""
    app = Celery("bench-probe", broker=AMQP_URL)
    app.send_task("bench.celery_app.record_start", args=[-1], queue=queue, exchange=queue, routing_key=queue)
    if not wait_until(lambda: client.llen(key) > 0, 60.0):
        raise RuntimeError(f"the celery worker did not start within 60 s:\n{log_tail(log)}")
    client.delete(key)
    app.close()


def _lags(client: redis.Redis, key: str, due: float) -> list[float]:
    lags: list[float] = []
    for entry in client.lrange(key, 0, -1):
        index, started = (entry.decode() if isinstance(entry, bytes) else entry).split()
        if int(index) >= 0:
            lags.append(float(started) - due)
    return lags


def _delete_queue(queue: str) -> None:
    app = Celery("bench-cleanup", broker=AMQP_URL)
    try:
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            with contextlib.suppress(Exception):
                channel.queue_delete(queue)
            with contextlib.suppress(Exception):
                conn.default_channel.exchange_delete(queue)
    finally:
        app.close()
