"""runplane on a real Kubernetes node: the API where Pods reach it, a scheduler, a Kubernetes dispatcher.

The API process (with the runner API) listens on the node's bridge address, the address Pods reach
this machine at; the dispatcher gives Pods that address (``runner.api_address``), as the chart gives
them the runner API Service's name.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from runplane.basics.settings import Settings
from tests.support.kubernetes_cluster import Rest, RestError
from tests.support.kubernetes_fixtures import Cluster
from tests.support.processes import Services, wait_for_port
from tests.support.reports import failed

POD_START = 240.0  # a Pod's creation to its runner's claim, on a loaded two-core machine
API_START = 60.0  # the API process to listen, on a loaded machine


@dataclass
class KubernetesSystem:
    settings: Settings
    kube: Rest
    namespace: str

    @property
    def address(self) -> str:
        return f"{self.settings.api.host}:{self.settings.api.port}"

    def pod(self, name: str) -> Any:
        return self.kube.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")

    def pod_names(self) -> list[str]:
        return self.kube.pod_names(self.namespace)

    def undeleted_pod_names(self) -> list[str]:
        """The Pods nobody has asked to delete yet."""
        return self.kube.pod_names(self.namespace, terminating=False)

    def describe_pods(self) -> str:
        return describe_pods(self.kube, self.namespace)


def describe_pods(kube: Rest, namespace: str) -> str:
    """What to read when a test with Pods fails: each Pod's phase, container states, the events about
    it (why the scheduler or the kubelet holds it Pending) and its last log lines; then each node's
    conditions (pressure, readiness), what it can still take, and the images it holds."""
    lines = []
    for pod in kube.get(f"/api/v1/namespaces/{namespace}/pods").get("items", []):
        name, status = pod["metadata"]["name"], pod.get("status") or {}
        states = [s.get("state") for s in status.get("containerStatuses") or []]
        lines.append(f"{name}: {status.get('phase')} {status.get('reason', '')} {states}")
        for condition in status.get("conditions") or []:
            if condition.get("status") != "True":
                lines.append(
                    f"  condition {condition['type']}: {condition.get('reason', '')} {condition.get('message', '')}"
                )
        events = kube.get(f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3D{name}")
        for event in events.get("items", []):
            kind, reason, count = event.get("type", ""), event.get("reason", ""), event.get("count", 1)
            lines.append(f"  event {kind} {reason} x{count}: {event.get('message', '')}")
        try:
            log = kube.text("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log?tailLines=30")
        except RestError as exc:
            log = f"(no log: {exc})"
        lines.extend(f"  | {line}" for line in log.splitlines())
    if not lines:
        lines.append("(no pods)")
    lines.append("---- nodes ----")
    for node in kube.get("/api/v1/nodes").get("items", []):
        status = node.get("status") or {}
        lines.append(f"{node['metadata']['name']}: allocatable {status.get('allocatable', {})}")
        lines.extend(
            f"  condition {c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
            for c in status.get("conditions") or []
        )
        images = sorted(image["names"][0] for image in status.get("images") or [] if image.get("names"))
        lines.append(f"  images: {', '.join(images) or '(none)'}")
    return "\n".join(lines)


@asynccontextmanager
async def running_system(
    settings: Settings,
    services: Services,
    cluster: Cluster,
    request: pytest.FixtureRequest | None = None,
    **dispatcher_env: str,
) -> AsyncIterator[KubernetesSystem]:
    """The API on the node's bridge address, a scheduler and a Kubernetes dispatcher, each a process."""
    host = cluster.node.host_ip
    settings = settings.model_copy(
        update={
            "api": settings.api.model_copy(update={"host": host}),
            "runner": settings.runner.model_copy(update={"api_address": f"{host}:{settings.api.runner_port}"}),
        }
    )
    try:
        services.start(
            "api", name="api", RUNPLANE_API__HOST=host, RUNPLANE_RUNNER__API_ADDRESS=settings.runner.api_address
        )
        await asyncio.to_thread(wait_for_port, f"{host}:{settings.api.port}", API_START)
        await asyncio.to_thread(wait_for_port, settings.runner.api_address, API_START)
        services.start("scheduler")
        services.start(
            "dispatcher",
            RUNPLANE_DISPATCHER__LAUNCHER="kubernetes",
            RUNPLANE_DISPATCHER__CLUSTER="east",
            RUNPLANE_RUNNER__API_ADDRESS=settings.runner.api_address,
            RUNPLANE_KUBERNETES__KUBECONFIG=str(cluster.plane.kubeconfig),
            RUNPLANE_KUBERNETES__NAMESPACE=cluster.namespace,
            RUNPLANE_KUBERNETES__IMAGE=cluster.image,
            RUNPLANE_KUBERNETES__IMAGE_PULL_POLICY="Never",
            RUNPLANE_KUBERNETES__CPU_REQUEST="10m",
            RUNPLANE_KUBERNETES__SWEEP_INTERVAL="0.5",
            RUNPLANE_KUBERNETES__POD_RETENTION_SECONDS="1",
            RUNPLANE_KUBERNETES__ORPHAN_GRACE_SECONDS="1",
            **dispatcher_env,
        )
        system = KubernetesSystem(settings, cluster.kube, cluster.namespace)
        yield system
        if request is not None and failed(request):
            print("---- pods ----", system.describe_pods(), sep="\n")
    finally:
        services.stop_all()
