"""The whole path on a real node: trigger over the API → dispatcher (Kubernetes launcher) → Pod → runner.

The system is ``tests/support/kubernetes_system.py``'s: the API where Pods reach it, a scheduler and a
Kubernetes dispatcher as real processes, the runner image built here. The runner in the Pod reaches
the control plane only through the runner API, with the run's token from the per-launch Secret.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from api.admin import create_account
from client.cli import channel
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, runs_pb2, runs_pb2_grpc
from tests.support.kubernetes_fixtures import Cluster
from tests.support.kubernetes_system import POD_START, KubernetesSystem, running_system
from tests.support.polling import eventually
from tests.support.processes import Services

# The first test may pay for the node and the runner image (minutes on a busy machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture
async def system(
    request: pytest.FixtureRequest, settings: Settings, services: Services, cluster: Cluster
) -> AsyncIterator[KubernetesSystem]:
    """Every run in a cold Pod of its own."""
    async with running_system(settings, services, cluster, request) as running:
        yield running


async def test_a_run_triggered_over_the_api_runs_in_a_real_pod_with_live_logs_and_artifacts(
    system: KubernetesSystem,
) -> None:
    _, token = await create_account(system.settings, name="acme", run_slots=2, memory_mb=256)
    async with channel(system.address, token) as chan:
        jobs, runs = jobs_pb2_grpc.JobServiceStub(chan), runs_pb2_grpc.RunServiceStub(chan)
        job = await jobs.CreateJob(
            jobs_pb2.CreateJobRequest(
                name="nightly",
                job_type=common_pb2.JOB_TYPE_DEPLOY,
                steps=[
                    "echo building in $(hostname); mkdir -p target; printf '{\"nodes\": 3}' > target/manifest.json",
                    "sleep 3; echo tested",
                ],
            )
        )
        run = await runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, trigger=common_pb2.TRIGGER_MANUAL))
        followed: list[tuple[int, str]] = []
        status_at_first_chunk: int | None = None
        async for chunk in runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=run.id, follow=True)):
            if status_at_first_chunk is None:
                status_at_first_chunk = (await runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id))).status
            followed.append((chunk.step_index, chunk.text))
        finished = await eventually(
            lambda: runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id)),
            POD_START,
            until=lambda r: r.status >= RunStatus.SUCCESS,
            what="the run to end",
        )
        artifacts = await runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=run.id))
        content = await runs.GetArtifact(runs_pb2.GetArtifactRequest(run_id=run.id, path="target/manifest.json"))

    assert int(finished.status) == RunStatus.SUCCESS, finished.status_message
    assert finished.cluster == "east" and finished.pod_name == f"runplane-run-{run.id}-1"
    assert status_at_first_chunk == RunStatus.RUNNING  # followed live, not read after the end
    # The step ran inside the Pod: its hostname is the Pod's name.
    assert "".join(text for step, text in followed if step == 0) == f"building in {finished.pod_name}\n"
    assert "".join(text for step, text in followed if step == 1) == "tested\n"
    assert [(s.index, s.status, s.exit_code) for s in finished.steps] == [(0, 10, 0), (1, 10, 0)]
    assert [a.path for a in artifacts.artifacts] == ["target/manifest.json"]
    assert content.content == b'{"nodes": 3}'
    # The runner exited by itself once the outcome was written; the Pod watcher removes its Pod.
    await eventually(
        lambda: asyncio.to_thread(system.undeleted_pod_names),
        60,
        until=lambda names: not names,
        what="the Pod's deletion",
    )


async def test_a_run_cancelled_over_the_api_stops_its_runner_in_the_pod(system: KubernetesSystem) -> None:
    _, token = await create_account(system.settings, name="acme", run_slots=2, memory_mb=256)
    async with channel(system.address, token) as chan:
        jobs, runs = jobs_pb2_grpc.JobServiceStub(chan), runs_pb2_grpc.RunServiceStub(chan)
        job = await jobs.CreateJob(
            jobs_pb2.CreateJobRequest(
                name="long",
                job_type=common_pb2.JOB_TYPE_DEPLOY,
                steps=["echo started; sleep 600", "echo never"],
            )
        )
        run = await runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, trigger=common_pb2.TRIGGER_MANUAL))

        async def first_line() -> str:
            async for chunk in runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=run.id, follow=True)):
                return chunk.text
            return ""

        assert await asyncio.wait_for(first_line(), POD_START) == "started\n"
        pod_name = (await runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id))).pod_name
        # The kubelet's status reaches the API server a little after the container runs.
        await eventually(
            lambda: asyncio.to_thread(system.pod, pod_name),
            30,
            until=lambda pod: pod["status"]["phase"] == "Running",
            what="the Pod to be Running",
        )
        await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id))
        cancelled = await eventually(
            lambda: runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id)),
            60,
            until=lambda r: r.status >= RunStatus.SUCCESS,
            what="the run to end",
        )

    assert int(cancelled.status) == RunStatus.CANCELLED, cancelled.status_message
    first, second = cancelled.steps
    assert int(first.status) == RunStatus.CANCELLED and "SIGINT" in first.end_reason, first
    assert second.skipped
    # The runner wrote the outcome and left; the Pod watcher then deletes the Pod.
    await eventually(
        lambda: asyncio.to_thread(system.undeleted_pod_names),
        60,
        until=lambda names: not names,
        what="the Pod's deletion",
    )
