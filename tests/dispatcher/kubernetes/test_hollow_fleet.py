"""The launcher's Pods on a simulated fleet: kubemark's hollow nodes behind a real API server and scheduler.

A control plane of the test's own (not the session's, whose real node would take Pods too) and four
hollow nodes (``tests/support/hollow_fleet.py``). The launcher's own Pods (token Secret, Pod, owner)
ask for the fleet's nodes; the real scheduler places them and the hollow kubelets report them
Running, then, once deleted, finish their deletion as a kubelet does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.launcher import LaunchRequest
from runplane.basics.types import AccountId, JobId, RunId
from tests.dispatcher.kubernetes.conftest import NAMESPACE, k8s_settings
from tests.support.hollow_fleet import HollowFleet
from tests.support.kubernetes_cluster import ControlPlane
from tests.support.polling import eventually

NODES = 4
RUNS = 12

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def fleet() -> Iterator[HollowFleet]:
    plane = ControlPlane.start()
    try:
        rest = plane.rest()
        rest.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        rest.close()
        started = HollowFleet.start(plane, NODES)
        try:
            yield started
        finally:
            started.stop()
    finally:
        plane.stop()


@dataclass(frozen=True)
class Placement:
    """Where a Pod is and how it is, in a line: what a failure prints."""

    name: str
    phase: str
    node: str
    containers_running: bool
    why: str

    def __str__(self) -> str:
        return f"{self.name}: {self.phase} on {self.node or '-'} {self.why}"


def _placements(fleet: HollowFleet) -> list[Placement]:
    rest = fleet.plane.rest()
    try:
        pods = rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    finally:
        rest.close()
    return [
        Placement(
            pod["metadata"]["name"],
            pod["status"].get("phase", ""),
            pod["spec"].get("nodeName", ""),
            all("running" in c["state"] for c in pod["status"].get("containerStatuses") or [{"state": {}}]),
            " ".join(c.get("message", "") for c in pod["status"].get("conditions") or [] if c["status"] != "True"),
        )
        for pod in pods
    ]


async def test_the_launchers_pods_are_scheduled_onto_hollow_nodes_and_reported_running(fleet: HollowFleet) -> None:
    assert fleet.ready_nodes() == sorted(fleet.names)
    settings = k8s_settings(node_selector=fleet.selector, cpu_request="10m")
    launcher = KubernetesLauncher(settings, configuration=fleet.plane.configuration())
    try:
        requests = [
            LaunchRequest(RunId(i), JobId(i), AccountId(1), attempt=1, memory_mb=64, timeout_seconds=0, token=f"t{i}")
            for i in range(1, RUNS + 1)
        ]
        names = [result.pod_name for result in await asyncio.gather(*(launcher.launch(r) for r in requests))]

        def all_running(pods: list[Placement]) -> bool:
            return len(pods) == RUNS and all(p.phase == "Running" and p.containers_running for p in pods)

        pods = await eventually(
            lambda: asyncio.to_thread(_placements, fleet), 120, until=all_running, what="Pods Running"
        )
        listing = "\n".join(map(str, pods))
        assert sorted(p.name for p in pods) == sorted(names)
        nodes = {p.node for p in pods}
        assert nodes <= set(fleet.names), listing
        assert len(nodes) > 1, f"the scheduler put every Pod on one node:\n{listing}"

        for name in names:
            assert await launcher.delete_pod(name)
        await eventually(lambda: asyncio.to_thread(_placements, fleet), 120, until=lambda p: not p, what="Pods gone")
    finally:
        await launcher.close()
