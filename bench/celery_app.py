"""The Celery application of the burst benchmark, as its users would write it: a beat schedule of N
crontab entries and one task. Configured from BENCH_CELERY_* variables so that beat, the worker and
the measuring process agree on the unique queue and Redis key of one run.

``celery -A bench.celery_app beat`` / ``celery -A bench.celery_app worker``
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from celery import Celery
from celery.schedules import crontab

QUEUE = os.environ.get("BENCH_CELERY_QUEUE", "bench-celery")
AMQP_URL = os.environ.get("BENCH_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("BENCH_CELERY_REDIS", "redis://127.0.0.1:6379/0")
STARTS_KEY = os.environ.get("BENCH_CELERY_STARTS_KEY", "bench-celery:starts")
N = int(os.environ.get("BENCH_CELERY_N", "0"))
CRON = os.environ.get("BENCH_CELERY_CRON", "0 0 * * *")
CLOCK_OFFSET = float(os.environ.get("BENCH_CELERY_CLOCK_OFFSET", "0"))

app = Celery("bench", broker=AMQP_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    task_ignore_result=True,
    timezone="UTC",
    enable_utc=True,
    broker_connection_retry_on_startup=True,
)


def shifted_now() -> datetime:
    """The clock beat's crontabs read: real time plus the offset that makes the burst minute arrive
    on time (see bench.burst_jobs)."""
    return datetime.now(UTC) + timedelta(seconds=CLOCK_OFFSET)


def _schedule() -> dict[str, dict[str, Any]]:
    minute, hour, day_of_month, month_of_year, day_of_week = CRON.split()
    return {
        f"job-{i}": {
            "task": "bench.celery_app.record_start",
            "schedule": crontab(
                minute=minute,
                hour=hour,
                day_of_month=day_of_month,
                month_of_year=month_of_year,
                day_of_week=day_of_week,
                nowfun=shifted_now,
            ),
            "args": (i,),
        }
        for i in range(N)
    }


app.conf.beat_schedule = _schedule()

_redis: redis.Redis | None = None


def record_start(i: int) -> None:
    """Record when job ``i`` started (the first thing it does)."""
    started = time.time()
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(REDIS_URL)
    _redis.rpush(STARTS_KEY, f"{i} {started!r}")


# Registered by a call, not as a decorator: celery has no types, and its decorator would untype the function.
app.task(name="bench.celery_app.record_start")(record_start)
