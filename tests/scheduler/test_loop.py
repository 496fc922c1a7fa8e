"""The scheduler loop in this process: pickups (one waiting per account at most) and reaping."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aio_pika
import pytest

from runplane.adapters.bus import AmqpBus, Topology
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from runplane.runs.pickups import PendingPickups
from scheduler.loop import SchedulerLoop
from tests.support.ports import free_port
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
    await pending.clear([2])
    assert await pending.mark([1, 2]) == [2]


async def test_without_redis_every_pickup_is_sent(settings: Settings) -> None:
    marks = PendingPickups.from_url(f"redis://127.0.0.1:{free_port()}/0", prefix=settings.redis_prefix, ttl_ms=5000)
    try:
        assert await marks.mark([7, 8]) == [7, 8]
        await marks.clear([7])  # no error either
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
        "pickups": 1, "relaunched": 1, "start_failed": 0, "lost": 1, "schema_drops": 0,
        "runs_deleted": 0,
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


async def test_starting_runs_of_a_dead_dispatcher_are_reclaimed_within_seconds(
    db: Conn, settings: Settings, pending: PendingPickups
) -> None:
    account = create_account(db)
    orphan, live, fresh, unrecorded = (queue_run(db, create_job(db, account), status=2) for _ in range(4))
    db.execute(
        "INSERT INTO dispatchers (dispatcher_id, cluster, launcher, last_seen_at) VALUES"
        " ('dead:1', 'local', 'local', now() - interval '20 s'), ('live:2', 'local', 'local', now())"
    )
    for run_id, dispatcher, age in (
        (orphan, "dead:1", "16 s"),  # its dispatcher's last heartbeat is older than 3 x 5 s
        (live, "live:2", "16 s"),  # a live dispatcher is still launching it
        (fresh, "dead:1", "2 s"),  # just dispatched: not yet judged
        (unrecorded, None, "16 s"),  # no dispatcher recorded: only the start timeout applies
    ):
        db.execute(
            "UPDATE runs SET dispatcher_id = %s, dispatched_at = now() - %s::interval, launch_attempts = 1"
            " WHERE id = %s",
            (dispatcher, age, run_id),
        )
    pool = await open_pool(settings.database_url)
    bus = await AmqpBus.connect(settings.amqp_url)
    try:
        done = await SchedulerLoop(settings, pool, bus, pending).run_once()
    finally:
        await bus.close()
        await pool.close()
    assert done["relaunched"] == 1
    reclaimed = run_row(db, orphan)
    assert (reclaimed["status"], reclaimed["waiting_reason"]) == (RunStatus.QUEUED, "launch_backoff")
    assert "stopped heartbeating" in reclaimed["status_message"]
    assert [run_row(db, r)["status"] for r in (live, fresh, unrecorded)] == [RunStatus.STARTING] * 3


async def test_a_fresh_cron_run_is_left_to_its_queuers_pickup_until_the_grace_has_passed(
    db: Conn, settings: Settings, pending: PendingPickups
) -> None:
    cron_account, manual_account = create_account(db), create_account(db)
    cron_run = queue_run(db, create_job(db, cron_account), trigger="schedule")
    queue_run(db, create_job(db, manual_account))
    settings.scheduler.sweep_grace = 60
    pool = await open_pool(settings.database_url)
    bus = await AmqpBus.connect(settings.amqp_url)
    try:
        loop = SchedulerLoop(settings, pool, bus, pending)
        assert await loop.send_pickups() == 1  # the manual run's account only
        db.execute("UPDATE runs SET queued_at = queued_at - interval '61 s' WHERE id = %s", (cron_run,))
        assert await loop.send_pickups() == 1  # now the cron run's account too (the other is marked)
    finally:
        await bus.close()
        await pool.close()
    assert await waiting_pickups(settings) == 2


async def test_the_first_pass_sweeps_old_pull_request_schemas_and_the_next_waits(
    db: Conn, settings: Settings, pending: PendingPickups
) -> None:
    keeps, never = create_account(db), create_account(db)
    db.execute("UPDATE accounts SET pull_request_schema_max_age_days = 0 WHERE id = %s", (never,))
    kept_job, never_job = create_job(db, keeps, job_type="ci"), create_job(db, never, job_type="ci")
    for job, account, number in ((kept_job, keeps, 3), (kept_job, keeps, 4), (never_job, never, 3)):
        db.execute(
            "INSERT INTO pull_request_schemas (job_id, pull_request_number, account_id, schema_name, last_run_id,"
            " last_used_at) VALUES (%s, %s, %s, %s, 1, now() - %s::interval)",
            (job, number, account, f"dbt_cloud_pr_{job}_{number}", "30 days" if number == 3 else "1 day"),
        )
    pool = await open_pool(settings.database_url)
    bus = await AmqpBus.connect(settings.amqp_url)
    try:
        loop = SchedulerLoop(settings, pool, bus, pending)
        first = await loop.run_once()
        db.execute("UPDATE pull_request_schemas SET last_used_at = now() - interval '30 days'")
        second = await loop.run_once()  # the next sweep is an interval away
    finally:
        await bus.close()
        await pool.close()
    assert (first["schema_drops"], second["schema_drops"]) == (1, 0)
    [drop] = rows(db, "SELECT job_id, pull_request_number, trigger, takes_slot, overrides FROM runs")
    assert (drop["job_id"], drop["pull_request_number"], drop["trigger"], drop["takes_slot"]) == (
        kept_job,
        3,
        "ci",
        False,
    )
    assert drop["overrides"]["drop_schema"] is True


async def test_while_dispatch_is_behind_metrics_wait_and_cron_runs_are_left_to_their_queuers(
    db: Conn, settings: Settings, pending: PendingPickups
) -> None:
    account, cron_account = create_account(db), create_account(db)
    waiting = [queue_run(db, create_job(db, account)) for _ in range(3)]
    done = queue_run(db, create_job(db, account), status=RunStatus.SUCCESS)
    db.execute("UPDATE runs SET started_at = now(), finished_at = now() WHERE id = %s", (done,))
    # Queued by a queuer past the sweep's grace: normally the sweep would send its account a Pickup.
    cron = queue_run(db, create_job(db, cron_account), trigger="schedule")
    db.execute("UPDATE runs SET queued_at = now() - interval '30 s' WHERE id = %s", (cron,))
    settings.scheduler.behind_backlog = 3  # four due runs no dispatcher decided on: behind
    pool = await open_pool(settings.database_url)
    bus = await AmqpBus.connect(settings.amqp_url)
    try:
        loop = SchedulerLoop(settings, pool, bus, pending)
        first = await loop.run_once()
        assert (first["observed"], first["pickups"]) == (0, 1)  # the manual runs' account only
        assert run_row(db, done)["observed"] == 0
        # A dispatch pass decided on one of them (it waits for a slot): no longer behind.
        db.execute("UPDATE runs SET waiting_reason = 'no_run_slot' WHERE id = %s", (waiting[0],))
        second = await loop.run_once()
        # The cron run's account gets its Pickup now; the ended run and the cron run (queued long
        # enough ago) are recorded.
        assert (second["observed"], second["pickups"]) == (2, 1)
    finally:
        await bus.close()
        await pool.close()
    assert run_row(db, done)["observed"] == 7
    assert await waiting_pickups(settings) == 2
