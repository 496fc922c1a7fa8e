"""RunService: triggering (types, idempotency, deactivation, pickup), reading, listing, cancelling."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from api.process import start_server
from runplane.adapters.bus import Topology
from runplane.basics.settings import Settings
from runplane.runs.pickups import pickup_accounts
from runplane.v1 import bus_pb2, common_pb2, jobs_pb2, runs_pb2
from tests.api.conftest import AsyncDb, Client, connect, deploy_job, scalar, status_of


async def ci_job(client: Client) -> jobs_pb2.Job:
    return await client.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(
            name="pr-checks",
            job_type=common_pb2.JOB_TYPE_CI,
            steps=["dbt build"],
            triggers=jobs_pb2.JobTriggers(on_pull_request=True),
        )
    )


async def test_trigger_queues_a_run_now(client: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job(settings=jobs_pb2.JobSettings(priority=7)))
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, cause="backfill"))
    assert run.status == common_pb2.RUN_STATUS_QUEUED
    assert run.trigger == common_pb2.TRIGGER_API  # the default
    assert run.job_id == job.id and run.account_id == client.account_id
    assert run.job_type == common_pb2.JOB_TYPE_DEPLOY and run.cause == "backfill" and run.attempt == 1
    assert run.scheduled_at == run.queued_at and run.queued_at.seconds > 0
    assert not run.HasField("dispatched_at") and not run.HasField("started_at")
    row = await (
        await adb.execute(
            "SELECT takes_slot, priority, schema_name, idempotency_key FROM runs WHERE id = %s", (run.id,)
        )
    ).fetchone()
    assert row is not None
    takes_slot, priority, schema, key = row
    assert takes_slot is True and priority == 7 and schema == ""
    assert key.startswith("api-once:")
    fetched = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    assert fetched == run


async def test_ci_runs_take_no_slot_and_build_in_their_pull_requests_schema(client: Client, adb: AsyncDb) -> None:
    job = await ci_job(client)
    run = await client.runs.TriggerRun(
        runs_pb2.TriggerRunRequest(
            job_id=job.id,
            trigger=common_pb2.TRIGGER_CI,
            overrides=runs_pb2.RunOverrides(pull_request_number=42, git_sha="0123abcd"),
        )
    )
    assert run.trigger == common_pb2.TRIGGER_CI and run.job_type == common_pb2.JOB_TYPE_CI
    assert run.schema == f"dbt_cloud_pr_{job.id}_42"
    assert run.overrides.pull_request_number == 42 and run.overrides.git_sha == "0123abcd"
    assert await scalar(adb, "SELECT takes_slot FROM runs WHERE id = %s", run.id) is False
    assert await scalar(adb, "SELECT pull_request_number FROM runs WHERE id = %s", run.id) == 42
    named = await client.runs.TriggerRun(
        runs_pb2.TriggerRunRequest(
            job_id=job.id,
            trigger=common_pb2.TRIGGER_CI,
            overrides=runs_pb2.RunOverrides(pull_request_number=43, schema="custom_schema"),
        )
    )
    # A CI run cannot be pointed at another schema (production's, say): it keeps its pull request's.
    assert named.schema == f"dbt_cloud_pr_{job.id}_43"


async def test_triggers_must_fit_the_job_type(client: Client, adb: AsyncDb) -> None:
    deploy = await client.jobs.CreateJob(deploy_job())
    ci = await ci_job(client)
    merge = await client.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(name="merge", job_type=common_pb2.JOB_TYPE_MERGE, steps=["true"])
    )
    pr = runs_pb2.RunOverrides(pull_request_number=1)
    cases: list[tuple[runs_pb2.TriggerRunRequest, str]] = [
        (runs_pb2.TriggerRunRequest(job_id=deploy.id, trigger=common_pb2.TRIGGER_CI, overrides=pr), "trigger"),
        (runs_pb2.TriggerRunRequest(job_id=deploy.id, trigger=common_pb2.TRIGGER_MERGE), "trigger"),
        (runs_pb2.TriggerRunRequest(job_id=ci.id, trigger=common_pb2.TRIGGER_CI), "overrides.pull_request_number"),
        (runs_pb2.TriggerRunRequest(job_id=ci.id), "overrides.pull_request_number"),
        (runs_pb2.TriggerRunRequest(job_id=deploy.id, trigger=common_pb2.TRIGGER_SCHEDULE), "trigger"),
        (runs_pb2.TriggerRunRequest(job_id=deploy.id, trigger=common_pb2.TRIGGER_COMPLETION), "trigger"),
        (runs_pb2.TriggerRunRequest(job_id=deploy.id, trigger=common_pb2.TRIGGER_RETRY), "trigger"),
        (runs_pb2.TriggerRunRequest(job_id=deploy.id, trigger=common_pb2.Trigger.ValueType(99)), "trigger"),
        (runs_pb2.TriggerRunRequest(job_id=0), "job_id"),
    ]
    for request, field in cases:
        code, details = await status_of(client.runs.TriggerRun(request))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, request
        assert details.startswith(f"{field}:"), details
    assert await scalar(adb, "SELECT count(*) FROM runs") == 0
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=merge.id, trigger=common_pb2.TRIGGER_MERGE))
    assert run.trigger == common_pb2.TRIGGER_MERGE
    assert await scalar(adb, "SELECT takes_slot FROM runs WHERE id = %s", run.id) is True


async def test_invalid_overrides_name_the_field_and_write_nothing(client: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    cases: list[tuple[dict[str, Any], str]] = [
        ({"steps": [""]}, "overrides.steps[0]"),
        ({"steps": ["true"] * 51}, "overrides.steps"),
        ({"threads": 65}, "overrides.threads"),
        ({"threads": -3}, "overrides.threads"),
        ({"git_branch": "-x"}, "overrides.git_branch"),
        ({"git_branch": "a b"}, "overrides.git_branch"),
        ({"git_sha": "not-hex"}, "overrides.git_sha"),
        ({"schema": "drop table x"}, "overrides.schema"),
        ({"schema": "s" * 64}, "overrides.schema"),
        ({"timeout_seconds": -1}, "overrides.timeout_seconds"),
        ({"timeout_seconds": 86_401}, "overrides.timeout_seconds"),
        ({"pull_request_number": -5}, "overrides.pull_request_number"),
    ]
    for fields, field in cases:
        request = runs_pb2.TriggerRunRequest(job_id=job.id, overrides=runs_pb2.RunOverrides(**fields))
        code, details = await status_of(client.runs.TriggerRun(request))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, fields
        assert details.startswith(f"{field}:"), details
    for request, field in [
        (runs_pb2.TriggerRunRequest(job_id=job.id, cause="x" * 1001), "cause"),
        (runs_pb2.TriggerRunRequest(job_id=job.id, idempotency_key="k" * 201), "idempotency_key"),
        (runs_pb2.TriggerRunRequest(job_id=job.id, idempotency_key="a\x00b"), "idempotency_key"),
    ]:
        code, details = await status_of(client.runs.TriggerRun(request))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}:"), details
    assert await scalar(adb, "SELECT count(*) FROM runs") == 0
    run = await client.runs.TriggerRun(
        runs_pb2.TriggerRunRequest(
            job_id=job.id,
            overrides=runs_pb2.RunOverrides(
                steps=["dbt run"], threads=2, git_branch="feature/x", timeout_seconds=60, schema="dev_schema"
            ),
        )
    )
    assert list(run.overrides.steps) == ["dbt run"] and run.overrides.threads == 2
    assert run.overrides.git_branch == "feature/x" and run.overrides.timeout_seconds == 60
    assert run.schema == "dev_schema"


async def test_the_same_idempotency_key_returns_the_same_run(client: Client, other: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    request = runs_pb2.TriggerRunRequest(job_id=job.id, idempotency_key="deploy-2024-06-01")
    first = await client.runs.TriggerRun(request)
    second = await client.runs.TriggerRun(request)
    assert second.id == first.id
    assert first.idempotency_key == f"api:{client.account_id}:deploy-2024-06-01"
    assert await scalar(adb, "SELECT count(*) FROM runs") == 1
    # The key belongs to that job: using it for another job of the account is refused.
    another = await client.jobs.CreateJob(deploy_job("another"))
    code, details = await status_of(
        client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=another.id, idempotency_key="deploy-2024-06-01"))
    )
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "idempotency_key" in details
    # A retry must ask for what the first trigger asked: another cause or overrides is refused.
    for changed in (
        runs_pb2.TriggerRunRequest(job_id=job.id, idempotency_key="deploy-2024-06-01", cause="backfill"),
        runs_pb2.TriggerRunRequest(
            job_id=job.id, idempotency_key="deploy-2024-06-01", overrides=runs_pb2.RunOverrides(threads=2)
        ),
    ):
        code, details = await status_of(client.runs.TriggerRun(changed))
        assert code is grpc.StatusCode.FAILED_PRECONDITION and f"trigger run {first.id}" in details, details
    assert await scalar(adb, "SELECT count(*) FROM runs") == 1
    # Another account's identical key is its own.
    theirs = await other.jobs.CreateJob(deploy_job())
    their_run = await other.runs.TriggerRun(
        runs_pb2.TriggerRunRequest(job_id=theirs.id, idempotency_key="deploy-2024-06-01")
    )
    assert their_run.id != first.id
    assert await scalar(adb, "SELECT count(*) FROM runs") == 2
    # Without a key every trigger is a new run.
    a = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    b = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    assert a.id != b.id


async def test_concurrent_triggers_with_one_key_make_one_run(client: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    request = runs_pb2.TriggerRunRequest(job_id=job.id, idempotency_key="webhook-delivery-7")
    runs = await asyncio.gather(*(client.runs.TriggerRun(request) for _ in range(12)))
    assert len({r.id for r in runs}) == 1
    assert await scalar(adb, "SELECT count(*) FROM runs") == 1


async def test_a_deactivated_job_is_refused_by_api_and_reactivated_by_run_now(client: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    await adb.execute(
        "UPDATE jobs SET deactivated_at = now(), deactivation_reason = '100 consecutive failed runs', "
        "consecutive_failures = 100, version = version + 1 WHERE id = %s",
        (job.id,),
    )
    code, details = await status_of(client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id)))
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "100 consecutive failed runs" in details
    assert await scalar(adb, "SELECT count(*) FROM runs") == 0
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, trigger=common_pb2.TRIGGER_MANUAL))
    assert run.status == common_pb2.RUN_STATUS_QUEUED and run.trigger == common_pb2.TRIGGER_MANUAL
    reactivated = await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
    assert reactivated.active and reactivated.consecutive_failures == 0 and reactivated.version == 3


async def test_get_run_shows_its_steps(client: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job(steps=["echo a", "exit 3"]))
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    await adb.execute(
        "INSERT INTO run_steps (run_id, step_index, command, status, exit_code, started_at, finished_at) VALUES "
        "(%s, 0, 'echo a', 10, 0, now(), now()), (%s, 1, 'exit 3', 20, 3, now(), now())",
        (run.id, run.id),
    )
    fetched = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    assert [(s.index, s.command, s.status, s.exit_code) for s in fetched.steps] == [
        (0, "echo a", common_pb2.RUN_STATUS_SUCCESS, 0),
        (1, "exit 3", common_pb2.RUN_STATUS_ERROR, 3),
    ]
    assert all(s.HasField("finished_at") for s in fetched.steps)


async def test_another_accounts_run_is_not_found(client: Client, other: Client) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    for call in (
        other.runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id)),
        other.runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id)),
        other.runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=run.id)),
        other.runs.GetArtifact(runs_pb2.GetArtifactRequest(run_id=run.id, path="target/manifest.json")),
    ):
        code, details = await status_of(call)
        assert code is grpc.StatusCode.NOT_FOUND and details == f"run {run.id} not found"
    stream = other.runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=run.id))
    try:
        async for _ in stream:
            raise AssertionError("another account's logs were streamed")
    except grpc.aio.AioRpcError as exc:
        assert exc.code() is grpc.StatusCode.NOT_FOUND
    else:
        raise AssertionError("expected NOT_FOUND")
    assert (await other.runs.ListRuns(runs_pb2.ListRunsRequest())).runs == []
    assert (await other.runs.ListRuns(runs_pb2.ListRunsRequest(job_id=job.id))).runs == []
    assert (await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id))).status == common_pb2.RUN_STATUS_QUEUED


async def test_list_runs_filters_and_walks_every_page_newest_first(client: Client, adb: AsyncDb) -> None:
    a = await client.jobs.CreateJob(deploy_job("a"))
    b = await client.jobs.CreateJob(deploy_job("b"))
    a_runs = [(await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=a.id))).id for _ in range(12)]
    b_runs = [(await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=b.id))).id for _ in range(3)]
    await adb.execute(
        "UPDATE runs SET status = 20, finished_at = now(), retries_exhausted = (id = %s) WHERE id = ANY(%s)",
        (a_runs[1], a_runs[:3]),
    )
    seen: list[int] = []
    token = ""
    while True:
        page = await client.runs.ListRuns(runs_pb2.ListRunsRequest(job_id=a.id, page_size=5, page_token=token))
        assert len(page.runs) <= 5
        seen += [r.id for r in page.runs]
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted(a_runs, reverse=True)
    everything = await client.runs.ListRuns(runs_pb2.ListRunsRequest())
    assert [r.id for r in everything.runs] == sorted(a_runs + b_runs, reverse=True)
    errors = await client.runs.ListRuns(runs_pb2.ListRunsRequest(statuses=[common_pb2.RUN_STATUS_ERROR]))
    assert [r.id for r in errors.runs] == sorted(a_runs[:3], reverse=True)
    queued_b = await client.runs.ListRuns(
        runs_pb2.ListRunsRequest(job_id=b.id, statuses=[common_pb2.RUN_STATUS_QUEUED, common_pb2.RUN_STATUS_RUNNING])
    )
    assert [r.id for r in queued_b.runs] == sorted(b_runs, reverse=True)
    exhausted = await client.runs.ListRuns(runs_pb2.ListRunsRequest(retries_exhausted_only=True))
    assert [r.id for r in exhausted.runs] == [a_runs[1]] and exhausted.runs[0].retries_exhausted
    first_page = await client.runs.ListRuns(runs_pb2.ListRunsRequest(job_id=a.id, page_size=5))
    for bad in (
        runs_pb2.ListRunsRequest(job_id=b.id, page_size=5, page_token=first_page.next_page_token),
        runs_pb2.ListRunsRequest(statuses=[common_pb2.RunStatus.ValueType(7)]),
        runs_pb2.ListRunsRequest(page_size=501),
        runs_pb2.ListRunsRequest(job_id=-1),
    ):
        code, _ = await status_of(client.runs.ListRuns(bad))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, bad


async def test_cancel_a_queued_run_cancels_it_now(client: Client) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    cancelled = await client.runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id))
    assert cancelled.status == common_pb2.RUN_STATUS_CANCELLED
    assert cancelled.HasField("finished_at") and cancelled.status_message
    code, details = await status_of(client.runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id)))
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "already finished" in details


async def test_cancel_a_running_run_asks_its_runner(client: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    await adb.execute("UPDATE runs SET status = 3, dispatched_at = now(), started_at = now() WHERE id = %s", (run.id,))
    requested = await client.runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id))
    assert requested.status == common_pb2.RUN_STATUS_RUNNING and requested.cancel_requested
    assert not requested.HasField("finished_at")
    assert await scalar(adb, "SELECT cancel_requested_at IS NOT NULL FROM runs WHERE id = %s", run.id)


async def test_artifacts_are_listed_and_fetched(client: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    manifest = b'{"nodes": {}}'
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/manifest.json', 1, %s), "
        "(%s, 'target/run_results.json', 2, %s)",
        (run.id, manifest, run.id, b"{}"),
    )
    listed = await client.runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=run.id))
    assert [(a.path, a.step_index, a.size_bytes) for a in listed.artifacts] == [
        ("target/manifest.json", 1, len(manifest)),
        ("target/run_results.json", 2, 2),
    ]
    got = await client.runs.GetArtifact(runs_pb2.GetArtifactRequest(run_id=run.id, path="target/manifest.json"))
    assert got.content == manifest and got.artifact.path == "target/manifest.json"
    code, _ = await status_of(client.runs.GetArtifact(runs_pb2.GetArtifactRequest(run_id=run.id, path="target/x.json")))
    assert code is grpc.StatusCode.NOT_FOUND
    code, details = await status_of(client.runs.GetArtifact(runs_pb2.GetArtifactRequest(run_id=run.id, path="")))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith("path:")


async def test_a_trigger_publishes_a_pickup_for_the_account(client: Client, settings: Settings) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(Topology(settings.bus_prefix).pickup, durable=True)
        incoming = await queue.get(timeout=5, fail=True)
        assert incoming is not None
        await incoming.ack()
        assert incoming.type == "Pickup"
        pickup = bus_pb2.Pickup.FromString(incoming.body)
        assert pickup_accounts(pickup) == [client.account_id] and pickup.sent_at_ms > 0
    finally:
        await connection.close()


async def test_a_trigger_succeeds_when_the_bus_is_down(settings: Settings) -> None:
    from api.admin import create_account

    down = settings.model_copy(update={"amqp_url": "amqp://guest:guest@127.0.0.1:1/"})
    api = await start_server(down, port=0)
    try:
        account_id, token = await create_account(down, name="offline", run_slots=1, memory_mb=256)
        async with connect(api, token, account_id) as client:
            job = await client.jobs.CreateJob(deploy_job())
            run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
            assert run.status == common_pb2.RUN_STATUS_QUEUED
            assert (await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id))).id == run.id
    finally:
        await api.stop(0)


async def test_a_run_at_a_later_time_waits_in_the_queue_until_it_is_due(client: Client, adb: AsyncDb) -> None:
    def at(delta: timedelta) -> Timestamp:
        stamp = Timestamp()
        stamp.FromDatetime(datetime.now(UTC).replace(microsecond=0) + delta)
        return stamp

    job = await client.jobs.CreateJob(deploy_job())
    later = at(timedelta(hours=2))
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, run_at=later))
    assert run.status == common_pb2.RUN_STATUS_QUEUED
    assert run.scheduled_at == later and run.queued_at == later  # due then, and waiting from then
    due = "SELECT count(*) FROM runs WHERE id = %s AND scheduled_at <= clock_timestamp()"
    assert await scalar(adb, due, run.id) == 0  # dispatch takes due runs only
    for bad, words in ((at(-timedelta(hours=1)), "in the past"), (at(timedelta(days=400)), "days ahead")):
        code, details = await status_of(client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, run_at=bad)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "run_at" in details and words in details
    before = datetime.now(UTC).replace(microsecond=0)
    now = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, run_at=at(-timedelta(seconds=5))))
    assert now.scheduled_at == now.queued_at and now.scheduled_at.ToDatetime(UTC) >= before  # a moment ago is now
    cancelled = await client.runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id))
    assert cancelled.status == common_pb2.RUN_STATUS_CANCELLED
