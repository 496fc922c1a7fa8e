"""JobService: every RPC, validation naming the field, account scoping, paging, versions and NOTIFY."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import psycopg

from runplane.v1 import common_pb2, jobs_pb2, runs_pb2
from tests.api.conftest import AsyncDb, Client, deploy_job, scalar, status_of


def full_job() -> jobs_pb2.CreateJobRequest:
    return deploy_job(
        "models",
        steps=["dbt deps", "dbt build --select tag:nightly"],
        triggers=jobs_pb2.JobTriggers(
            schedule=jobs_pb2.CronSchedule(cron="30 2 * * 1-5", timezone="Europe/Amsterdam"),
        ),
        settings=jobs_pb2.JobSettings(
            threads=8,
            timeout_seconds=3600,
            target_name="prod",
            environment={"DBT_PROFILES_DIR": "/etc/dbt"},
            git_branch="main",
            retry_max_attempts=2,
            retry_on_step_failure=True,
            missed_run_grace_seconds=-1,
            priority=5,
        ),
    )


async def test_create_then_get_returns_the_definition(client: Client) -> None:
    created = await client.jobs.CreateJob(full_job())
    assert created.id > 0 and created.account_id == client.account_id
    assert created.version == 1 and created.active and created.consecutive_failures == 0
    assert created.job_type == common_pb2.JOB_TYPE_DEPLOY
    assert list(created.steps) == ["dbt deps", "dbt build --select tag:nightly"]
    assert created.triggers.schedule.cron == "30 2 * * 1-5"
    assert created.triggers.schedule.timezone == "Europe/Amsterdam"
    assert created.settings.threads == 8 and created.settings.timeout_seconds == 3600
    assert dict(created.settings.environment) == {"DBT_PROFILES_DIR": "/etc/dbt"}
    assert created.settings.missed_run_grace_seconds == 300  # -1 means the default
    assert created.settings.priority == 5 and created.settings.retry_on_step_failure
    fetched = await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=created.id))
    assert fetched == created


async def test_a_job_without_settings_gets_the_defaults(client: Client, adb: AsyncDb) -> None:
    created = await client.jobs.CreateJob(deploy_job())
    assert not created.triggers.HasField("schedule")
    assert created.settings.threads == 4
    assert created.settings.missed_run_grace_seconds == 300
    assert await scalar(adb, "SELECT cron IS NULL FROM jobs WHERE id = %s", created.id)


async def test_grace_zero_means_skip_missed_fires(client: Client) -> None:
    created = await client.jobs.CreateJob(deploy_job(settings=jobs_pb2.JobSettings(missed_run_grace_seconds=0)))
    assert created.settings.missed_run_grace_seconds == 0


INVALID: list[tuple[str, dict[str, Any]]] = [
    ("name", {"name": ""}),
    ("name", {"name": "x" * 201}),
    ("name", {"name": "bad\nname"}),
    ("job_type", {"job_type": 0}),
    ("job_type", {"job_type": 42}),
    ("steps", {"steps": []}),
    ("steps", {"steps": ["true"] * 51}),
    ("steps[1]", {"steps": ["true", "   "]}),
    ("steps[0]", {"steps": ["x" * 4097]}),
    ("steps[0]", {"steps": ["nul\x00byte"]}),
    ("triggers.schedule.cron", {"triggers": jobs_pb2.JobTriggers(schedule=jobs_pb2.CronSchedule(cron="* * *"))}),
    ("triggers.schedule.cron", {"triggers": jobs_pb2.JobTriggers(schedule=jobs_pb2.CronSchedule(cron="61 * * * *"))}),
    (
        "triggers.schedule.timezone",
        {"triggers": jobs_pb2.JobTriggers(schedule=jobs_pb2.CronSchedule(cron="0 * * * *", timezone="Mars/Olympus"))},
    ),
    ("triggers.on_pull_request", {"triggers": jobs_pb2.JobTriggers(on_pull_request=True)}),
    ("triggers.on_merge", {"triggers": jobs_pb2.JobTriggers(on_merge=True)}),
    (
        "triggers.on_completion[0].statuses",
        {"triggers": jobs_pb2.JobTriggers(on_completion=[jobs_pb2.CompletionTrigger(upstream_job_id=1)])},
    ),
    (
        "triggers.on_completion[0].statuses",
        {
            "triggers": jobs_pb2.JobTriggers(
                on_completion=[jobs_pb2.CompletionTrigger(upstream_job_id=1, statuses=[common_pb2.RUN_STATUS_RUNNING])]
            )
        },
    ),
    (
        "triggers.on_completion[0].upstream_job_id",
        {
            "triggers": jobs_pb2.JobTriggers(
                on_completion=[
                    jobs_pb2.CompletionTrigger(upstream_job_id=999, statuses=[common_pb2.RUN_STATUS_SUCCESS])
                ]
            )
        },
    ),
    ("settings.threads", {"settings": jobs_pb2.JobSettings(threads=65)}),
    ("settings.threads", {"settings": jobs_pb2.JobSettings(threads=-1)}),
    ("settings.timeout_seconds", {"settings": jobs_pb2.JobSettings(timeout_seconds=86_401)}),
    ("settings.missed_run_grace_seconds", {"settings": jobs_pb2.JobSettings(missed_run_grace_seconds=-2)}),
    ("settings.missed_run_grace_seconds", {"settings": jobs_pb2.JobSettings(missed_run_grace_seconds=86_401)}),
    ("settings.environment", {"settings": jobs_pb2.JobSettings(environment={"1BAD": "x"})}),
    ("settings.environment", {"settings": jobs_pb2.JobSettings(environment={"RUNPLANE_THREADS": "9"})}),
    ("settings.environment", {"settings": jobs_pb2.JobSettings(environment={f"K{i}": "v" for i in range(101)})}),
    ("settings.git_branch", {"settings": jobs_pb2.JobSettings(git_branch="--upload-pack=evil")}),
    ("settings.retry_max_attempts", {"settings": jobs_pb2.JobSettings(retry_max_attempts=11)}),
    ("settings.priority", {"settings": jobs_pb2.JobSettings(priority=10_000)}),
    ("settings.target_name", {"settings": jobs_pb2.JobSettings(target_name="prod; rm -rf /")}),
]


async def test_invalid_definitions_name_the_field_and_write_nothing(client: Client, adb: AsyncDb) -> None:
    # One server for every case: a database per case would cost a second each.
    for field, fields in INVALID:
        request = deploy_job(**{"name": "j", **fields})
        code, details = await status_of(client.jobs.CreateJob(request))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (field, fields)
        assert details.startswith(f"{field}:"), details
    assert await scalar(adb, "SELECT count(*) FROM jobs") == 0


async def test_job_types_and_their_triggers(client: Client) -> None:
    ci = await client.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(
            name="pr",
            job_type=common_pb2.JOB_TYPE_CI,
            steps=["true"],
            triggers=jobs_pb2.JobTriggers(on_pull_request=True),
        )
    )
    assert ci.triggers.on_pull_request
    merge = await client.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(
            name="merge",
            job_type=common_pb2.JOB_TYPE_MERGE,
            steps=["true"],
            triggers=jobs_pb2.JobTriggers(on_merge=True),
        )
    )
    assert merge.triggers.on_merge
    code, details = await status_of(
        client.jobs.CreateJob(
            jobs_pb2.CreateJobRequest(
                name="ci-cron",
                job_type=common_pb2.JOB_TYPE_CI,
                steps=["true"],
                triggers=jobs_pb2.JobTriggers(schedule=jobs_pb2.CronSchedule(cron="0 * * * *")),
            )
        )
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith("triggers.schedule:")


async def test_completion_triggers_stay_inside_the_account_and_never_loop(
    client: Client, other: Client, adb: AsyncDb
) -> None:
    upstream = await client.jobs.CreateJob(deploy_job("upstream"))
    success = [common_pb2.RUN_STATUS_SUCCESS, common_pb2.RUN_STATUS_ERROR]
    downstream = await client.jobs.CreateJob(
        deploy_job(
            "downstream",
            triggers=jobs_pb2.JobTriggers(
                on_completion=[jobs_pb2.CompletionTrigger(upstream_job_id=upstream.id, statuses=success)]
            ),
        )
    )
    assert [(t.upstream_job_id, list(t.statuses)) for t in downstream.triggers.on_completion] == [
        (upstream.id, [10, 20])
    ]
    assert await scalar(adb, "SELECT statuses FROM job_completion_triggers WHERE job_id = %s", downstream.id) == [
        10,
        20,
    ]
    # Another account cannot hang a trigger on this account's job: it does not exist for them.
    code, details = await status_of(
        other.jobs.CreateJob(
            deploy_job(
                "spy",
                triggers=jobs_pb2.JobTriggers(
                    on_completion=[jobs_pb2.CompletionTrigger(upstream_job_id=upstream.id, statuses=success)]
                ),
            )
        )
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "not found" in details
    # upstream -> downstream -> upstream would loop; a job on its own completion too.
    loop = jobs_pb2.UpdateJobRequest(
        job_id=upstream.id,
        name="upstream",
        job_type=common_pb2.JOB_TYPE_DEPLOY,
        steps=["true"],
        triggers=jobs_pb2.JobTriggers(
            on_completion=[jobs_pb2.CompletionTrigger(upstream_job_id=downstream.id, statuses=success)]
        ),
    )
    code, details = await status_of(client.jobs.UpdateJob(loop))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith("triggers.on_completion:")
    loop.triggers.on_completion[0].upstream_job_id = upstream.id
    code, details = await status_of(client.jobs.UpdateJob(loop))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "own completion" in details
    assert (await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=upstream.id))).version == 1


async def test_another_accounts_job_is_not_found(client: Client, other: Client) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    missing_code, missing_details = await status_of(other.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id + 1000)))
    for call in (
        other.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id)),
        other.jobs.UpdateJob(
            jobs_pb2.UpdateJobRequest(job_id=job.id, name="x", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=["true"])
        ),
        other.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job.id)),
        other.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id)),
    ):
        code, details = await status_of(call)
        assert code is grpc.StatusCode.NOT_FOUND == missing_code
        assert details == f"job {job.id} not found"
        assert missing_details == f"job {job.id + 1000} not found"
    assert (await other.jobs.ListJobs(jobs_pb2.ListJobsRequest())).jobs == []
    still = await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
    assert still.name == "nightly" and still.version == 1


async def test_list_jobs_walks_every_page_once(client: Client, other: Client) -> None:
    made = [(await client.jobs.CreateJob(deploy_job(f"job-{i}"))).id for i in range(23)]
    await other.jobs.CreateJob(deploy_job("not-mine"))
    seen: list[int] = []
    token = ""
    pages = 0
    while True:
        page = await client.jobs.ListJobs(jobs_pb2.ListJobsRequest(page_size=5, page_token=token))
        seen += [j.id for j in page.jobs]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == made and pages == 5
    assert len((await client.jobs.ListJobs(jobs_pb2.ListJobsRequest())).jobs) == 23  # 0 means 50


async def test_list_jobs_refuses_bad_paging(client: Client) -> None:
    cases = [
        (501, "", "page_size"),
        (-1, "", "page_size"),
        (5, "garbage!", "page_token"),
        (5, "eyJhIjoxfQ", "page_token"),
    ]
    for page_size, page_token, field in cases:
        code, details = await status_of(
            client.jobs.ListJobs(jobs_pb2.ListJobsRequest(page_size=page_size, page_token=page_token))
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}:"), details


async def test_update_replaces_the_definition_and_bumps_the_version(client: Client) -> None:
    job = await client.jobs.CreateJob(full_job())
    updated = await client.jobs.UpdateJob(
        jobs_pb2.UpdateJobRequest(
            job_id=job.id, name="renamed", job_type=common_pb2.JOB_TYPE_ADHOC, steps=["echo new"], expected_version=1
        )
    )
    assert updated.version == 2 and updated.name == "renamed"
    assert updated.job_type == common_pb2.JOB_TYPE_ADHOC
    assert not updated.triggers.HasField("schedule")  # replaced, not merged
    assert updated.settings.threads == 4
    code, details = await status_of(
        client.jobs.UpdateJob(
            jobs_pb2.UpdateJobRequest(
                job_id=job.id, name="stale", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=["true"], expected_version=1
            )
        )
    )
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "version 2" in details
    assert (await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).name == "renamed"


async def test_update_validates_like_create_and_writes_nothing(client: Client) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    code, details = await status_of(
        client.jobs.UpdateJob(
            jobs_pb2.UpdateJobRequest(job_id=job.id, name="x", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=[])
        )
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith("steps:")
    assert (await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).version == 1


async def test_saving_a_deactivated_job_reactivates_it(client: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    await adb.execute(
        "UPDATE jobs SET deactivated_at = now(), deactivation_reason = '100 consecutive failures', "
        "consecutive_failures = 100, version = version + 1 WHERE id = %s",
        (job.id,),
    )
    deactivated = await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
    assert not deactivated.active and deactivated.deactivation_reason == "100 consecutive failures"
    saved = await client.jobs.UpdateJob(
        jobs_pb2.UpdateJobRequest(job_id=job.id, name=job.name, job_type=job.job_type, steps=job.steps)
    )
    assert saved.active and saved.deactivation_reason == "" and saved.consecutive_failures == 0
    assert saved.version == 3


async def test_delete_hides_the_job_and_cancels_its_queued_runs(client: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    queued = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    running = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    await adb.execute("UPDATE runs SET status = 3, started_at = now() WHERE id = %s", (running.id,))
    await client.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job.id))
    code, _ = await status_of(client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id)))
    assert code is grpc.StatusCode.NOT_FOUND
    code, _ = await status_of(client.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job.id)))
    assert code is grpc.StatusCode.NOT_FOUND
    assert (await client.jobs.ListJobs(jobs_pb2.ListJobsRequest())).jobs == []
    cancelled = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=queued.id))  # runs stay readable
    assert cancelled.status == common_pb2.RUN_STATUS_CANCELLED
    assert "deleted" in cancelled.status_message and cancelled.HasField("finished_at")
    still = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=running.id))
    assert still.status == common_pb2.RUN_STATUS_RUNNING
    assert await scalar(adb, "SELECT deleted_at IS NOT NULL AND version = 2 FROM jobs WHERE id = %s", job.id)
    code, _ = await status_of(client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id)))
    assert code is grpc.StatusCode.NOT_FOUND


async def test_deleting_an_upstream_job_drops_the_completion_triggers_on_it(client: Client, adb: AsyncDb) -> None:
    upstream = await client.jobs.CreateJob(deploy_job("upstream"))
    downstream = await client.jobs.CreateJob(
        deploy_job(
            "downstream",
            triggers=jobs_pb2.JobTriggers(
                on_completion=[
                    jobs_pb2.CompletionTrigger(upstream_job_id=upstream.id, statuses=[common_pb2.RUN_STATUS_SUCCESS])
                ]
            ),
        )
    )
    await client.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=upstream.id))
    after = await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=downstream.id))
    assert list(after.triggers.on_completion) == [] and after.version == downstream.version + 1
    assert await scalar(adb, "SELECT count(*) FROM job_completion_triggers") == 0


async def test_every_scheduling_write_notifies_with_the_new_version(client: Client, database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as listener:
        await listener.execute("LISTEN runplane_jobs")
        job = await client.jobs.CreateJob(deploy_job())
        await client.jobs.UpdateJob(
            jobs_pb2.UpdateJobRequest(job_id=job.id, name="n2", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=["true"])
        )
        await client.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job.id))
        payloads = await asyncio.wait_for(_notifications(listener, 3), 10)
    assert [json.loads(p) for p in payloads] == [
        {"job_id": job.id, "version": 1, "op": "insert"},
        {"job_id": job.id, "version": 2, "op": "update"},
        {"job_id": job.id, "version": 3, "op": "update"},
    ]


async def _notifications(conn: psycopg.AsyncConnection[Any], count: int) -> list[str]:
    out: list[str] = []
    async for notify in conn.notifies():
        out.append(notify.payload)
        if len(out) == count:
            break
    return out


async def test_an_all_of_job_counts_only_upstream_runs_after_its_triggers_were_saved(
    client: Client, adb: AsyncDb
) -> None:
    a = await client.jobs.CreateJob(deploy_job("a"))
    b = await client.jobs.CreateJob(deploy_job("b"))
    earlier = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=a.id))
    counted = [common_pb2.RUN_STATUS_SUCCESS]
    c = await client.jobs.CreateJob(
        deploy_job(
            "c",
            triggers=jobs_pb2.JobTriggers(
                on_completion=[
                    jobs_pb2.CompletionTrigger(upstream_job_id=a.id, statuses=counted),
                    jobs_pb2.CompletionTrigger(upstream_job_id=b.id, statuses=counted),
                ],
                completion_mode=jobs_pb2.COMPLETION_MODE_ALL,
            ),
        )
    )
    assert c.triggers.completion_mode == jobs_pb2.COMPLETION_MODE_ALL
    assert a.triggers.completion_mode == jobs_pb2.COMPLETION_MODE_ANY  # the default
    baseline = "SELECT last_run_id FROM completion_consumed WHERE job_id = %s AND upstream_job_id = %s"
    assert await scalar(adb, baseline, c.id, a.id) == earlier.id
    assert await scalar(adb, baseline, c.id, b.id) == 0
    code, details = await status_of(
        client.jobs.CreateJob(
            deploy_job("bad", triggers=jobs_pb2.JobTriggers(completion_mode=jobs_pb2.CompletionMode.ValueType(7)))
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "completion_mode" in details
