"""Retention on the real Postgres: expired finished runs go with their logs and artifacts, in bounded
batches, and nothing else does."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool

from runplane.adapters.db import Connection, open_pool
from runplane.basics.settings import Settings
from scheduler.retention import delete_expired_runs
from tests.support.records import Conn, create_account, create_job, queue_run, rows


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[AsyncConnectionPool[Connection]]:
    pool = await open_pool(settings.database_url)
    try:
        yield pool
    finally:
        await pool.close()


def finished_run(db: Conn, job: int, *, status: int = 10, age: str) -> int:
    run = queue_run(db, job, status=status)
    db.execute("UPDATE runs SET finished_at = now() - %s::interval WHERE id = %s", (age, run))
    db.execute("INSERT INTO run_steps (run_id, step_index, command, status) VALUES (%s, 0, 'echo', %s)", (run, status))
    db.execute("INSERT INTO run_log_chunks (run_id, seq, step_index, text) VALUES (%s, 1, 0, 'hello')", (run,))
    db.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/run_results.json', 0, 'x')",
        (run,),
    )
    return run


def remaining(db: Conn, table: str, runs: list[int]) -> set[int]:
    return {r["run_id"] for r in rows(db, f"SELECT run_id FROM {table} WHERE run_id = ANY(%s)", (runs,))}


async def test_expired_runs_go_in_bounded_batches_with_their_logs_and_artifacts(
    db: Conn, pool: AsyncConnectionPool[Connection]
) -> None:
    keeps_a_month, keeps_forever = create_account(db), create_account(db)
    db.execute("UPDATE accounts SET run_retention_days = 30 WHERE id = %s", (keeps_a_month,))
    job, forever_job = create_job(db, keeps_a_month), create_job(db, keeps_forever)
    expired = [finished_run(db, job, status=s, age="40 days") for s in (10, 20, 30, 10, 20)]
    recent = finished_run(db, job, age="10 days")
    forever = finished_run(db, forever_job, age="400 days")
    old_but_queued = queue_run(db, job)  # not finished: never deleted
    db.execute("UPDATE runs SET queued_at = now() - interval '90 days' WHERE id = %s", (old_but_queued,))
    retry = queue_run(db, job)
    db.execute("UPDATE runs SET parent_run_id = %s WHERE id = %s", (expired[1], retry))

    # At most two batches of two: four runs, the oldest first; the next pass takes the rest.
    assert await delete_expired_runs(pool, batch=2, max_batches=2) == 4
    assert await delete_expired_runs(pool, batch=2, max_batches=2) == 1
    assert await delete_expired_runs(pool, batch=2, max_batches=2) == 0

    kept = {r["id"] for r in rows(db, "SELECT id FROM runs")}
    assert kept == {recent, forever, old_but_queued, retry}
    everything = [*expired, recent, forever]
    for table in ("run_steps", "run_log_chunks", "artifacts"):
        assert remaining(db, table, everything) == {recent, forever}, table
    [child] = rows(db, "SELECT parent_run_id FROM runs WHERE id = %s", (retry,))
    assert child["parent_run_id"] is None  # its parent is gone; the retry stays


def test_a_batch_reads_the_retention_index(db: Conn) -> None:
    """On an empty table the planner would scan; told not to, it must have the index to use."""
    account = create_account(db)
    db.execute("SET enable_seqscan = off")
    plan = [
        str(r[0])
        for r in db.execute(
            "EXPLAIN SELECT id FROM runs WHERE account_id = %s AND status IN (10, 20, 30)"
            " AND finished_at < now() - interval '30 days' ORDER BY finished_at LIMIT 200",
            (account,),
        )
    ]
    assert any("runs_retention_idx" in line for line in plan), plan


async def test_skipped_occurrences_go_after_the_same_retention_as_runs(
    db: Conn, pool: AsyncConnectionPool[Connection]
) -> None:
    account = create_account(db)
    db.execute("UPDATE accounts SET run_retention_days = 30 WHERE id = %s", (account,))
    job = create_job(db, account)
    for key, age in (("old", "31 days"), ("recent", "29 days")):
        db.execute(
            "INSERT INTO skipped_occurrences (account_id, job_id, occurrence_key, scheduled_at, reason, recorded_at)"
            " VALUES (%s, %s, %s, now() - %s::interval, 'overlap', now() - %s::interval)",
            (account, job, key, age, age),
        )
    await delete_expired_runs(pool)
    assert [r["occurrence_key"] for r in rows(db, "SELECT occurrence_key FROM skipped_occurrences")] == ["recent"]
