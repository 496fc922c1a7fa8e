"""Two clusters, a dispatcher process each, one pickup queue: capacity spreads the runs, an API outage
moves them to the other cluster, and no run is lost or gets two Pods.

Two real kube-apiservers; the Pods ask for a node label no node has, so they stay pending and each
counts against its cluster's capacity for the whole test (the session's node, registered with one of
the API servers, would otherwise run them and fail them: a runner needs the runner image). Each
dispatcher stops taking pickups while its cluster's API does not answer or holds
``kubernetes.capacity`` active run Pods; the scheduler loop resends pickups of runs still queued.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from api.admin import create_account
from api.process import RunningApi, start_server
from client.cli import channel
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, runs_pb2, runs_pb2_grpc
from tests.support.kubernetes_cluster import ControlPlane, Rest
from tests.support.polling import eventually
from tests.support.processes import Services
from tests.support.two_clusters import TwoClusters

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
CAPACITY = 3


@dataclass
class Clusters(TwoClusters):
    api: RunningApi
    services: Services


@pytest.fixture
async def clusters(
    settings: Settings, services: Services, second_control_plane: ControlPlane, control_plane: ControlPlane
) -> AsyncIterator[Clusters]:
    """East (the session's second API server, which the test takes down and brings back) and west."""
    east = second_control_plane
    namespace = f"runs-{uuid.uuid4().hex[:10]}"
    for plane in (east, control_plane):
        rest: Rest = plane.rest()
        rest.post("/api/v1/namespaces", {"metadata": {"name": namespace}})
        rest.close()
    api = await start_server(settings, port=0)
    services.with_api = False
    services.env.update(
        RUNPLANE_SCHEDULER__START_TIMEOUT="600",  # Pods stay pending: no reaping here
        # On a saturated machine an API server's first answers after a start can take seconds: a
        # launch that fails then is tried again, not counted against the run.
        RUNPLANE_DISPATCHER__LAUNCH_ATTEMPTS="10",
        RUNPLANE_KUBERNETES__REQUEST_TIMEOUT="30",
    )
    try:
        services.start("scheduler")
        for name, plane in (("east", east), ("west", control_plane)):
            services.start(
                "dispatcher",
                name=f"dispatcher-{name}",
                RUNPLANE_DISPATCHER__LAUNCHER="kubernetes",
                RUNPLANE_DISPATCHER__CLUSTER=name,
                RUNPLANE_KUBERNETES__KUBECONFIG=str(plane.kubeconfig),
                RUNPLANE_KUBERNETES__NAMESPACE=namespace,
                RUNPLANE_KUBERNETES__IMAGE="local/busybox:1",
                RUNPLANE_KUBERNETES__NODE_SELECTOR='{"runplane.dev/test-node": "none"}',
                RUNPLANE_KUBERNETES__CAPACITY=str(CAPACITY),
                RUNPLANE_KUBERNETES__HEALTH_INTERVAL="0.5",
                RUNPLANE_KUBERNETES__HEALTH_FAILURES="2",
                RUNPLANE_KUBERNETES__API_ATTEMPTS="1",
            )
        yield Clusters(
            settings=settings, east=east, west=control_plane, namespace=namespace, api=api, services=services
        )
    finally:
        services.stop_all()
        await api.stop(0)
        if not east.ready():  # left down by a failure: the other tests of the session need it
            east.start_api_server(timeout=60)
        for plane in (east, control_plane):
            rest = plane.rest()
            rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", {"gracePeriodSeconds": 0})
            rest.delete(f"/api/v1/namespaces/{namespace}")
            rest.close()


async def trigger(clusters: Clusters, index: int) -> int:
    """A run of a job of a new account (a dispatch pass takes one account's runs)."""
    _, token = await create_account(clusters.settings, name=f"acct-{index}", run_slots=5, memory_mb=256)
    async with channel(f"127.0.0.1:{clusters.api.port}", token) as chan:
        job = await jobs_pb2_grpc.JobServiceStub(chan).CreateJob(
            jobs_pb2.CreateJobRequest(name="j", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=["true"])
        )
        run = await runs_pb2_grpc.RunServiceStub(chan).TriggerRun(
            runs_pb2.TriggerRunRequest(job_id=job.id, trigger=common_pb2.TRIGGER_API)
        )
    return int(run.id)


async def not_taking_pickups(clusters: Clusters, name: str, times: int = 1) -> None:
    await eventually(
        lambda: asyncio.to_thread(clusters.services.log_text, f"dispatcher-{name}"),
        30,
        until=lambda text: text.count("not taking pickups") >= times,
        what=f"the {name} dispatcher to stop taking pickups",
    )


async def test_one_clusters_api_down_the_other_takes_runs_up_to_its_capacity_and_none_is_lost_or_doubled(
    clusters: Clusters,
) -> None:
    clusters.east.stop_api_server()
    await not_taking_pickups(clusters, "east")
    first = [await trigger(clusters, index) for index in range(CAPACITY)]
    await eventually(
        lambda: asyncio.to_thread(clusters.runs),
        60,
        until=lambda runs: [r[2] for r in runs if r[1] == RunStatus.STARTING] == ["west"] * CAPACITY,
        what="west to take the runs east cannot",
    )
    await not_taking_pickups(clusters, "west")  # it holds its capacity now
    second = [await trigger(clusters, index) for index in range(CAPACITY, 2 * CAPACITY)]
    runs = {r[0]: r for r in clusters.runs()}
    assert [runs[run_id][1] for run_id in second] == [RunStatus.QUEUED] * CAPACITY  # waiting, not lost

    clusters.east.start_api_server(timeout=60)
    final = await eventually(
        lambda: asyncio.to_thread(clusters.runs),
        240,
        until=lambda runs: all(r[1] == RunStatus.STARTING and r[3] for r in runs),
        what="east to take the rest",
    )
    assert sorted(r[0] for r in final) == sorted(first + second)  # nothing lost
    by_cluster = {name: sorted(r[3] for r in final if r[2] == name) for name in ("east", "west")}
    assert [r[2] for r in final if r[0] in second] == ["east"] * CAPACITY
    # One Pod per run, in the cluster its run names, and none anywhere else.
    assert clusters.pods(clusters.east) == by_cluster["east"]
    assert clusters.pods(clusters.west) == by_cluster["west"]
