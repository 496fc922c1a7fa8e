"""Ending runs (runplane.runs.finish) on the real Postgres: failures, deactivation, triggers, retries."""

from __future__ import annotations

import pytest

from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings
from runplane.basics.types import FailureKind, Outcome, RunStatus, completion_idempotency_key, retry_idempotency_key
from runplane.runs.finish import DEFAULT_DEACTIVATE_AFTER_FAILURES, end_run, finish_run
from runplane.runs.retries import RetryPolicy
from tests.support.records import Conn, create_account, create_job, one, queue_run, rows, run_row

POLICY = RetryPolicy(backoff_base=10.0, backoff_cap=40.0)


def test_backoff_is_exponential_jittered_and_capped() -> None:
    for attempt, ceiling in [(1, 10.0), (2, 20.0), (3, 40.0), (4, 40.0), (9, 40.0)]:
        delays = [POLICY.delay(attempt) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1


async def test_hundred_consecutive_failures_deactivate_the_job(db: Conn, settings: Settings) -> None:
    account = create_account(db)
    job = create_job(db, account)
    version = one(db, "SELECT version FROM jobs WHERE id = %s", (job,))[0]
    pool = await open_pool(settings.database_url)
    try:
        async with pool.connection() as conn:
            ok = queue_run(db, job, status=3)
            assert await finish_run(conn, ok, Outcome.success(), policy=POLICY)
            for n in range(1, DEFAULT_DEACTIVATE_AFTER_FAILURES + 1):
                run_id = queue_run(db, job, status=3)
                finished = await finish_run(conn, run_id, Outcome.error("boom", FailureKind.STEP), policy=POLICY)
                assert finished is not None
                assert finished.job_deactivated == (n == DEFAULT_DEACTIVATE_AFTER_FAILURES)
                if n == 50:  # counted from the success before
                    assert one(db, "SELECT consecutive_failures FROM jobs WHERE id = %s", (job,))[0] == 50
            one_more = queue_run(db, job, status=3)
            assert await finish_run(conn, one_more, Outcome.error("boom", FailureKind.STEP), policy=POLICY)
    finally:
        await pool.close()
    [row] = rows(db, "SELECT * FROM jobs WHERE id = %s", (job,))
    assert row["consecutive_failures"] == DEFAULT_DEACTIVATE_AFTER_FAILURES + 1
    assert row["deactivated_at"] is not None
    assert "100 consecutive failed runs" in row["deactivation_reason"]
    assert row["version"] == version + 1  # bumped once, so the orchestrator hears it once


async def test_success_resets_the_failure_count(db: Conn, settings: Settings) -> None:
    account = create_account(db)
    job = create_job(db, account)
    db.execute("UPDATE jobs SET consecutive_failures = 99 WHERE id = %s", (job,))
    pool = await open_pool(settings.database_url)
    try:
        async with pool.connection() as conn:
            assert await finish_run(conn, queue_run(db, job, status=3), Outcome.success(), policy=POLICY)
    finally:
        await pool.close()
    assert db.execute("SELECT consecutive_failures FROM jobs WHERE id = %s", (job,)).fetchone() == (0,)


@pytest.mark.usefixtures("_cleanup_bus")
async def test_completion_trigger_processed_twice_queues_downstream_once(db: Conn, settings: Settings) -> None:
    account = create_account(db)
    upstream = create_job(db, account, name="upstream")
    downstream = create_job(db, account, name="downstream")
    on_error_only = create_job(db, account, name="on error")
    deactivated = create_job(db, account, name="deactivated")
    db.execute("UPDATE jobs SET deactivated_at = now() WHERE id = %s", (deactivated,))
    db.execute(
        "INSERT INTO job_completion_triggers (job_id, upstream_job_id, statuses) VALUES (%s, %s, %s), (%s, %s, %s),"
        " (%s, %s, %s)",
        (downstream, upstream, [10], on_error_only, upstream, [20], deactivated, upstream, [10, 20]),
    )
    run_id = queue_run(db, upstream, status=3)
    pool = await open_pool(settings.database_url)
    try:
        first = await end_run(pool, None, settings.bus_prefix, run_id, Outcome.success(), policy=POLICY)
        # The same outcome delivered again (a duplicate runner, a reaper racing): nothing more happens.
        second = await end_run(pool, None, settings.bus_prefix, run_id, Outcome.success(), policy=POLICY)
        # Even forcing the trigger step again cannot queue a second run: the key is unique.
        db.execute("UPDATE runs SET status = 3 WHERE id = %s", (run_id,))
        third = await end_run(pool, None, settings.bus_prefix, run_id, Outcome.success(), policy=POLICY)
    finally:
        await pool.close()
    assert first is not None and len(first.downstream_run_ids) == 1
    assert second is None
    assert third is not None and third.downstream_run_ids == ()
    queued = rows(db, "SELECT job_id, trigger, idempotency_key, upstream_run_id FROM runs WHERE id <> %s", (run_id,))
    assert queued == [
        {
            "job_id": downstream,
            "trigger": "completion",
            "idempotency_key": completion_idempotency_key(run_id, downstream),
            "upstream_run_id": run_id,
        }
    ]


async def test_infrastructure_failures_are_retried_until_the_budget_is_spent(db: Conn, settings: Settings) -> None:
    account = create_account(db)
    job = create_job(db, account, retry_max_attempts=2)
    run_id = queue_run(db, job, status=3)
    pool = await open_pool(settings.database_url)
    chain = [run_id]
    try:
        for _ in range(3):
            finished = await end_run(
                pool,
                None,
                settings.bus_prefix,
                chain[-1],
                Outcome.error("runner lost", FailureKind.INFRASTRUCTURE),
                policy=POLICY,
            )
            assert finished is not None
            if finished.retry_run_id is None:
                break
            db.execute("UPDATE runs SET status = 3 WHERE id = %s", (finished.retry_run_id,))
            chain.append(finished.retry_run_id)
    finally:
        await pool.close()
    assert len(chain) == 3  # the first attempt and two retries
    retries = [run_row(db, r) for r in chain]
    assert [r["attempt"] for r in retries] == [1, 2, 3]
    assert [r["parent_run_id"] for r in retries] == [None, chain[0], chain[1]]
    assert [r["idempotency_key"] for r in retries[1:]] == [
        retry_idempotency_key(chain[0]),
        retry_idempotency_key(chain[1]),
    ]
    assert all(r["trigger"] == "retry" for r in retries[1:])
    delay = (retries[1]["scheduled_at"] - retries[0]["finished_at"]).total_seconds()
    assert 4 <= delay <= 11  # base 10 s, half of it jittered
    assert [r["retries_exhausted"] for r in retries] == [False, False, True]
    assert retries[2]["status_message"] == "runner lost; retries exhausted after 3 attempts"


async def test_step_failures_are_retried_only_when_the_job_says_so(db: Conn, settings: Settings) -> None:
    account = create_account(db)
    plain = create_job(db, account, retry_max_attempts=3)
    retrying = create_job(db, account, retry_max_attempts=3, retry_on_step_failure=True)
    pool = await open_pool(settings.database_url)
    try:
        results = [
            await end_run(
                pool,
                None,
                settings.bus_prefix,
                queue_run(db, job, status=3),
                Outcome.error("step 1 failed with exit code 1: false", FailureKind.STEP),
                policy=POLICY,
            )
            for job in (plain, retrying)
        ]
    finally:
        await pool.close()
    assert results[0] is not None and results[0].retry_run_id is None and not results[0].retries_exhausted
    assert results[1] is not None and results[1].retry_run_id is not None
    assert run_row(db, results[1].retry_run_id)["status"] == RunStatus.QUEUED


async def test_the_failure_limit_is_the_accounts_and_zero_never_deactivates(db: Conn, settings: Settings) -> None:
    strict, lenient = create_account(db), create_account(db)
    db.execute("UPDATE accounts SET deactivate_after_failures = 3 WHERE id = %s", (strict,))
    db.execute("UPDATE accounts SET deactivate_after_failures = 0 WHERE id = %s", (lenient,))
    strict_job, lenient_job = create_job(db, strict), create_job(db, lenient)
    pool = await open_pool(settings.database_url)
    try:
        async with pool.connection() as conn:
            deactivations = {strict_job: [], lenient_job: []}  # type: dict[int, list[bool]]
            for job in (strict_job, lenient_job):
                for _ in range(5):
                    run_id = queue_run(db, job, status=3)
                    finished = await finish_run(conn, run_id, Outcome.error("boom", FailureKind.STEP), policy=POLICY)
                    assert finished is not None
                    deactivations[job].append(finished.job_deactivated)
    finally:
        await pool.close()
    assert deactivations[strict_job] == [False, False, True, False, False]
    assert deactivations[lenient_job] == [False] * 5
    [strict_row] = rows(db, "SELECT * FROM jobs WHERE id = %s", (strict_job,))
    [lenient_row] = rows(db, "SELECT * FROM jobs WHERE id = %s", (lenient_job,))
    assert strict_row["deactivated_at"] is not None
    assert strict_row["deactivation_reason"].startswith("deactivated after 3 consecutive failed runs (last: run ")
    assert lenient_row["deactivated_at"] is None and lenient_row["consecutive_failures"] == 5
