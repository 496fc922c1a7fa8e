"""The warm Pod pool on a real node: started runner Pods wait on the runner API and take dispatched runs.

The dispatcher keeps one pool (the runner image, 256 MiB: the test account's memory). A run
triggered over the API goes to a waiting pool Pod, which runs it through the runner API and exits;
the pool refills. A pool Pod frozen in place (its container paused in the node's dockerd) stops
calling the runner API and is replaced, and no run goes to it meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import psycopg
import pytest

from api.admin import create_account
from client.cli import channel
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, runs_pb2, runs_pb2_grpc
from tests.support.kubernetes_cluster import ClusterError, Node
from tests.support.kubernetes_fixtures import Cluster
from tests.support.kubernetes_system import POD_START, KubernetesSystem, running_system
from tests.support.polling import eventually
from tests.support.processes import Services

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
POOL = {"name": "small", "memory_mb": 256, "min_size": 1, "max_size": 2}
SILENT = 6.0


@pytest.fixture
async def pooled(
    request: pytest.FixtureRequest, settings: Settings, services: Services, cluster: Cluster
) -> AsyncIterator[KubernetesSystem]:
    async with running_system(
        settings,
        services,
        cluster,
        request,
        RUNPLANE_KUBERNETES__WARM_POOLS=json.dumps([POOL]),
        RUNPLANE_KUBERNETES__POOL_INTERVAL="0.5",
        RUNPLANE_KUBERNETES__POOL_SILENT_SECONDS=str(SILENT),
    ) as running:
        yield running


def waiting_pods(settings: Settings) -> list[str]:
    """Pool Pods heard from (their WaitForRun is open) and not given a run."""
    with psycopg.connect(settings.database_url, autocommit=True) as db:
        found = db.execute(
            "SELECT name FROM pool_runners WHERE assigned_at IS NULL AND seen_at > now() - interval '4 seconds'"
            " ORDER BY name"
        ).fetchall()
    return [str(row[0]) for row in found]


async def waiting(system: KubernetesSystem, *, besides: frozenset[str] = frozenset()) -> list[str]:
    async def fetch() -> list[str]:
        return [name for name in waiting_pods(system.settings) if name not in besides]

    return list(await eventually(fetch, POD_START, until=bool, what="a waiting pool Pod"))


async def test_a_run_goes_to_a_waiting_pool_pod_and_the_pool_refills(pooled: KubernetesSystem) -> None:
    first = await waiting(pooled)
    _, token = await create_account(pooled.settings, name="acme", run_slots=2, memory_mb=256)
    async with channel(pooled.address, token) as chan:
        jobs, runs = jobs_pb2_grpc.JobServiceStub(chan), runs_pb2_grpc.RunServiceStub(chan)
        job = await jobs.CreateJob(
            jobs_pb2.CreateJobRequest(
                name="warm",
                job_type=common_pb2.JOB_TYPE_DEPLOY,
                steps=["echo warm in $(hostname); mkdir -p target; echo '{}' > target/run_results.json"],
            )
        )
        run = await runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, trigger=common_pb2.TRIGGER_MANUAL))
        finished = await eventually(
            lambda: runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id)),
            60,
            until=lambda r: r.status >= RunStatus.SUCCESS,
            what="the run to end",
        )
        logs = [c.text async for c in runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=run.id))]
        artifacts = await runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=run.id))

    assert int(finished.status) == RunStatus.SUCCESS, finished.status_message
    assert finished.pod_name in first  # a Pod that was already waiting, not one made for the run
    assert "".join(logs) == f"warm in {finished.pod_name}\n"
    assert [a.path for a in artifacts.artifacts] == ["target/run_results.json"]
    pod = pooled.pod(finished.pod_name)
    assert pod["metadata"]["labels"]["runplane.dev/run-id"] == str(run.id)  # the watcher knows it as the run's
    # One run per Pod: it leaves, and another Pod waits in its place.
    refilled = await waiting(pooled, besides=frozenset(first))
    assert finished.pod_name not in refilled
    await eventually(
        lambda: asyncio.to_thread(pooled.undeleted_pod_names),
        60,
        until=lambda names: finished.pod_name not in names,
        what="the used pool Pod's deletion",
    )


async def test_a_pool_pod_that_stops_answering_is_replaced(pooled: KubernetesSystem, node: Node) -> None:
    (frozen,) = (await waiting(pooled))[:1]
    container = node.docker(
        "ps", "-q", "--filter", f"label=io.kubernetes.pod.name={frozen}", "--filter",
        "label=io.kubernetes.container.name=runner",
    ).split()  # fmt: skip
    assert len(container) == 1
    node.docker("pause", container[0])
    try:
        replacement = await waiting(pooled, besides=frozenset({frozen}))
        assert frozen not in replacement

        async def frozen_row() -> list[str]:
            with psycopg.connect(pooled.settings.database_url, autocommit=True) as db:
                rows = db.execute("SELECT name FROM pool_runners WHERE name = %s", (frozen,)).fetchall()
            return [str(r[0]) for r in rows]

        await eventually(frozen_row, SILENT * 4, until=lambda rows: not rows, what="the silent Pod to be dropped")
        pod = await asyncio.to_thread(pooled.kube.get, f"/api/v1/namespaces/{pooled.namespace}/pods")
        left = {item["metadata"]["name"]: item["metadata"].get("deletionTimestamp") for item in pod["items"]}
        assert frozen not in left or left[frozen], "the silent Pod is being deleted"
    finally:
        with contextlib.suppress(ClusterError):  # usually gone already, with its deleted Pod
            node.docker("unpause", container[0])
