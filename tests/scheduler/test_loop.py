"""The scheduler loop in this process: pickups (one waiting per account at most) and reaping."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aio_pika
import pytest

from runplane.bus import AmqpBus, Topology
from runplane.db import open_pool
from runplane.runs.pickups import PendingPickups
from runplane.settings import Settings
from runplane.types import RunStatus
from scheduler.loop import SchedulerLoop
from tests.support.processes import free_port
from tests.support.records import Conn, create_account, create_job, queue_run, rows, run_row

pytestmark = pytest.mark.usefixtures("_cleanup_bus")


@pytest.fixture
async def pending(settings: Settings) -> AsyncIterator[PendingPickups]:
    marks = PendingPickups.from_url(settings.redis_url, prefix=settings.redis_prefix, ttl_ms=5000)
    yield marks
    await marks.close()


async def waiting_pickups(settings: Settings) -> int:
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(Topology(settings.bus_prefix).pickup, durable=True)
        return int(queue.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def test_marks_let_one_pickup_wait_per_account(pending: PendingPickups) -> None:
    assert await pending.mark([1, 2, 3]) == [1, 2, 3]
    assert await pending.mark([1, 2, 3, 4]) == [4]
    await pending.clear(2)
    assert await pending.mark([1, 2]) == [2]


async def test_without_redis_every_pickup_is_sent(settings: Settings) -> None:
    marks = PendingPickups.from_url(f"redis://127.0.0.1:{free_port()}/0", prefix=settings.redis_prefix, ttl_ms=5000)
    try:
        assert await marks.mark([7, 8]) == [7, 8]
        await marks.clear(7)  # no error either
    finally:
        await marks.close()


async def test_a_pass_sends_one_pickup_per_account_with_due_runs_and_reaps(
    db: Conn, settings: Settings, pending: PendingPickups
) -> None:
    busy, idle, later = create_account(db), create_account(db), create_account(db)
    for _ in range(3):
        queue_run(db, create_job(db, busy))
    queue_run(db, create_job(db, later))
    db.execute("UPDATE runs SET scheduled_at = now() + interval '1 hour' WHERE account_id = %s", (later,))
    lost = queue_run(db, create_job(db, idle, retry_max_attempts=1), status=3)
    db.execute("UPDATE runs SET lease_owner = 'gone', lease_expires_at = now() - interval '1 s' WHERE id = %s", (lost,))
    stuck = queue_run(db, create_job(db, idle), status=2)
    db.execute("UPDATE runs SET dispatched_at = now() - interval '1 hour', launch_attempts = 1 WHERE id = %s", (stuck,))
    settings.scheduler.launch_attempts = 3
    pool = await open_pool(settings.database_url)
    bus = await AmqpBus.connect(settings.amqp_url)
    try:
        loop = SchedulerLoop(settings, pool, bus, pending)
        first = await loop.run_once()
        second = await loop.run_once()  # the first pass's pickups still wait: nothing new to send
    finally:
        await bus.close()
        await pool.close()
    assert {k: v for k, v in first.items() if k != "observed"} == {
        "pickups": 1, "relaunched": 1, "start_failed": 0, "lost": 1,
    }  # fmt: skip
    assert first["observed"] > 0  # the rows it read to make run metrics
    assert second["pickups"] == 0
    assert await waiting_pickups(settings) == 2  # the busy account's, and the one the lost run's end sent
    lost_row = run_row(db, lost)
    assert (lost_row["status"], lost_row["status_message"]) == (RunStatus.ERROR, "runner lost")
    [retry] = rows(db, "SELECT attempt, trigger FROM runs WHERE parent_run_id = %s", (lost,))
    assert retry == {"attempt": 2, "trigger": "retry"}
    stuck_row = run_row(db, stuck)
    assert (stuck_row["status"], stuck_row["waiting_reason"]) == (RunStatus.QUEUED, "launch_backoff")
    assert stuck_row["not_before"] is not None
