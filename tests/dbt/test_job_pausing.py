"""Pausing a job and the account's failure limit, with the real dbt project and warehouse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from api.admin import update_account_settings
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, jobs_pb2
from tests.dbt.conftest import Client, dbt_job, environment, make_repository, run_job
from tests.support.records import one

pytestmark = [pytest.mark.slow, pytest.mark.dbt, pytest.mark.timeout(400), pytest.mark.usefixtures("_cleanup_bus")]

Db = psycopg.Connection[Any]


def runs_of(db: Db, job_id: int) -> list[tuple[int, str, bool]]:
    return [
        (int(r[0]), str(r[1]), bool(r[2]))
        for r in db.execute("SELECT id, trigger, job_paused FROM runs WHERE job_id = %s ORDER BY id", (job_id,))
    ]


async def test_a_paused_job_is_not_queued_by_completion_but_runs_now_and_says_so(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    env = await environment(client, database_url, str(make_repository(tmp_path / "jaffle")))
    upstream = await dbt_job(client, env.id, ["dbt seed"])
    downstream = await client.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(
            name="after seed",
            job_type=common_pb2.JOB_TYPE_DEPLOY,
            steps=["dbt run"],
            triggers=jobs_pb2.JobTriggers(
                schedule=jobs_pb2.CronSchedule(cron="0 3 * * *", timezone="UTC"),
                on_completion=[
                    jobs_pb2.CompletionTrigger(upstream_job_id=upstream.id, statuses=[common_pb2.RUN_STATUS_SUCCESS])
                ],
            ),
            settings=jobs_pb2.JobSettings(environment_id=env.id),
        )
    )
    paused = await client.jobs.PauseJob(jobs_pb2.PauseJobRequest(job_id=downstream.id))
    assert paused.paused and paused.paused_at.seconds > 0 and paused.active
    assert paused.version == downstream.version + 1  # the orchestrator hears of it
    again = await client.jobs.PauseJob(jobs_pb2.PauseJobRequest(job_id=downstream.id))
    assert (again.version, again.paused_at) == (paused.version, paused.paused_at)  # pausing twice is once

    seeded = await run_job(client, dbt_settings, db, upstream.id)
    assert seeded.status == common_pb2.RUN_STATUS_SUCCESS
    assert runs_of(db, downstream.id) == []  # the upstream's success queued nothing

    # Run now still runs it, with dbt, and the run says the job was paused.
    manual = await run_job(client, dbt_settings, db, downstream.id, trigger=common_pb2.TRIGGER_MANUAL)
    assert manual.status == common_pb2.RUN_STATUS_SUCCESS and manual.job_paused
    assert one(db, "SELECT count(*) FROM analytics.customers")[0] > 0
    still = await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=downstream.id))
    assert still.paused  # run now does not unpause

    unpaused = await client.jobs.UnpauseJob(jobs_pb2.UnpauseJobRequest(job_id=downstream.id))
    assert not unpaused.paused and not unpaused.HasField("paused_at")
    seeded_again = await run_job(client, dbt_settings, db, upstream.id)
    assert seeded_again.status == common_pb2.RUN_STATUS_SUCCESS
    completion = runs_of(db, downstream.id)[-1]
    assert completion[1:] == ("completion", False)


async def test_pausing_a_missing_or_invalid_job_is_an_error(client: Client) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await client.jobs.PauseJob(jobs_pb2.PauseJobRequest(job_id=10_000_000))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await client.jobs.UnpauseJob(jobs_pb2.UnpauseJobRequest(job_id=0))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_failure_limit_is_an_account_setting(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    changed = await update_account_settings(dbt_settings, account_id=client.account_id, deactivate_after_failures=2)
    assert changed == {
        "account_id": client.account_id,
        "deactivate_after_failures": 2,
        "pull_request_schema_max_age_days": 14,
        "run_retention_days": 0,
    }
    env = await environment(client, database_url, str(make_repository(tmp_path / "jaffle")))
    job = await dbt_job(client, env.id, ["dbt run --select customers"])  # before its seeds: the run fails
    first = await run_job(client, dbt_settings, db, job.id)
    assert first.status == common_pb2.RUN_STATUS_ERROR
    assert (await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).active
    second = await run_job(client, dbt_settings, db, job.id)
    assert second.status == common_pb2.RUN_STATUS_ERROR
    deactivated = await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
    assert not deactivated.active
    assert deactivated.deactivation_reason == f"deactivated after 2 consecutive failed runs (last: run {second.id})"
