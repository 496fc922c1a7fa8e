"""The whole path from a gRPC call: run now → dispatcher → local runner → success, logs followed live."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import psycopg
import pytest

from api.admin import create_account
from api.process import RunningApi, start_server
from client.cli import channel
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, runs_pb2, runs_pb2_grpc
from tests.support.polling import eventually
from tests.support.processes import Services

pytestmark = pytest.mark.slow


@pytest.fixture
async def api(settings: Settings, services: Services) -> AsyncIterator[RunningApi]:
    services.with_api = False  # served here, in this process
    services.start("scheduler")
    services.start("dispatcher")
    running = await start_server(settings, port=0)
    try:
        yield running
    finally:
        await running.stop(0)


async def test_run_now_over_grpc_to_success_with_live_logs_and_an_artifact(api: RunningApi, settings: Settings) -> None:
    account_id, token = await create_account(settings, name="acme", run_slots=2, memory_mb=1024)
    async with channel(f"127.0.0.1:{api.port}", token) as chan:
        jobs, runs = jobs_pb2_grpc.JobServiceStub(chan), runs_pb2_grpc.RunServiceStub(chan)
        job = await jobs.CreateJob(
            jobs_pb2.CreateJobRequest(
                name="nightly",
                job_type=common_pb2.JOB_TYPE_DEPLOY,
                steps=[
                    "echo building; mkdir -p target; printf '{\"nodes\": 3}' > target/manifest.json",
                    "sleep 1; echo tested",
                ],
            )
        )
        run = await runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, trigger=common_pb2.TRIGGER_MANUAL))
        followed = [
            (chunk.seq, chunk.step_index, chunk.text)
            async for chunk in runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=run.id, follow=True))
        ]
        finished = await eventually(
            lambda: runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id)),
            60,
            until=lambda r: r.status >= RunStatus.SUCCESS,
            what="the run to end",
        )
        artifacts = await runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=run.id))
        content = await runs.GetArtifact(runs_pb2.GetArtifactRequest(run_id=run.id, path="target/manifest.json"))

    assert RunStatus(finished.status) == RunStatus.SUCCESS, finished.status_message
    stamps = [
        finished.scheduled_at,
        finished.queued_at,
        finished.dispatched_at,
        finished.started_at,
        finished.finished_at,
    ]
    assert all(s.seconds for s in stamps)
    assert [s.ToDatetime() for s in stamps] == sorted(s.ToDatetime() for s in stamps)
    assert [(s.index, s.status, s.exit_code) for s in finished.steps] == [(0, 10, 0), (1, 10, 0)]
    assert followed  # streamed while the run went on
    assert "".join(text for _, step, text in followed if step == 0) == "building\n"
    assert "".join(text for _, step, text in followed if step == 1) == "tested\n"
    assert [a.path for a in artifacts.artifacts] == ["target/manifest.json"]
    assert content.content == b'{"nodes": 3}'
    assert finished.pod_name.startswith("pid:") and finished.cluster == "local"
    assert account_id == finished.account_id


async def test_a_deactivated_job_is_reactivated_by_run_now(api: RunningApi, settings: Settings) -> None:
    _, token = await create_account(settings, name="acme", run_slots=1, memory_mb=1024)
    async with channel(f"127.0.0.1:{api.port}", token) as chan:
        jobs, runs = jobs_pb2_grpc.JobServiceStub(chan), runs_pb2_grpc.RunServiceStub(chan)
        job = await jobs.CreateJob(
            jobs_pb2.CreateJobRequest(name="flaky", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=["exit 1"])
        )
        # Ninety-nine failures already counted (counting itself is tested against the database);
        # the hundredth, through the whole path, deactivates the job.
        with psycopg.connect(settings.database_url, autocommit=True) as db:
            db.execute("UPDATE jobs SET consecutive_failures = 99 WHERE id = %s", (job.id,))
        failing = await runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, trigger=common_pb2.TRIGGER_API))
        await eventually(
            lambda: runs.GetRun(runs_pb2.GetRunRequest(run_id=failing.id)),
            60,
            until=lambda r: RunStatus(r.status) == RunStatus.ERROR,
            what="the hundredth failure",
        )
        deactivated = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
        assert not deactivated.active
        assert "100 consecutive failed runs" in deactivated.deactivation_reason

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, trigger=common_pb2.TRIGGER_API))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        run_now = await runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, trigger=common_pb2.TRIGGER_MANUAL))
        reactivated = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
        assert reactivated.active and reactivated.consecutive_failures == 0
        ran = await eventually(
            lambda: runs.GetRun(runs_pb2.GetRunRequest(run_id=run_now.id)),
            60,
            until=lambda r: r.status >= RunStatus.SUCCESS,
            what="the run now to execute",
        )
        assert RunStatus(ran.status) == RunStatus.ERROR  # it ran (and failed again: the count starts over)
        assert (await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).consecutive_failures == 1
