"""Fixtures for the Kubernetes tests: settings, a real API server (and node), and kmock for faults.

``control_plane`` is a real kube-apiserver v1.20 + etcd on loopback, started once per test session
(``local_cluster.ControlPlane``; ``make k8s`` builds and caches its binaries). Each test gets its own
namespace in it (``runs_namespace``), so tests cannot see each other's Pods. ``node`` adds a real
kubelet on a private dockerd, for tests where Pods must really run.

kmock (an HTTP emulator) stays only for faults a real API server cannot be made to show on demand;
each such test says so.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from dispatcher.kubernetes_api import without_client_retries
from runplane.settings import DispatcherSettings, KubernetesSettings, SchedulerSettings, Settings
from tests.kubernetes.local_cluster import ControlPlane, Node, Rest

NAMESPACE = "runs"
KUBE_VERSION = "1.31"  # the chart's newest kubeVersion; every manifest is validated against this schema
REAL_KUBE_VERSION = "1.20"  # what the local API server is


def k8s_settings(cluster: str = "east", **kubernetes: Any) -> Settings:
    """Settings with fast retries and sweeps, so fault tests take well under a second each."""
    values: dict[str, Any] = {
        "namespace": NAMESPACE,
        "api_backoff": 0.05,
        "api_backoff_cap": 2.0,
        "request_timeout": 3.0,
        "watch_timeout_seconds": 2,
        "relist_backoff": 0.1,
        "sweep_interval": 0.2,
        "pod_retention_seconds": 0.6,
        "orphan_grace_seconds": 0.3,
    }
    values.update(kubernetes)
    return Settings(
        dispatcher=DispatcherSettings(launcher="kubernetes", cluster=cluster),
        scheduler=SchedulerSettings(launch_attempts=3, launch_backoff=2.0),
        kubernetes=KubernetesSettings(**values),
    )


def client_config(url: object) -> kubernetes.client.Configuration:
    """A client configuration for an emulated API server at ``url`` (kmock on 127.0.0.1)."""
    return without_client_retries(kubernetes.client.Configuration(host=str(url).rstrip("/")))


@pytest.fixture
def kube_url(kmock: Any) -> str:
    kmock.resources["v1/pods"] = {}  # the emulator lists pods even before one exists
    return str(kmock.url).rstrip("/")


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A real kube-apiserver v1.20 + etcd on loopback, for the whole session."""
    plane = ControlPlane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def second_control_plane() -> Iterator[ControlPlane]:
    """Another cluster's API server, for tests of two clusters."""
    plane = ControlPlane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def compacting_control_plane() -> Iterator[ControlPlane]:
    """An API server that forgets history within seconds: no watch cache, etcd compacted every second,
    so resuming a watch from a version a few seconds old answers 410 Gone."""
    plane = ControlPlane.start(extra_args=["--watch-cache=false", "--etcd-compaction-interval=1s"])
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def node(control_plane: ControlPlane) -> Iterator[Node]:
    """A real node (kubelet on a private dockerd) on the session's control plane."""
    started = Node.start(control_plane)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Rest]:
    """Admin JSON calls to the real API server, for arranging and asserting."""
    rest = control_plane.rest()
    yield rest
    rest.close()


@pytest.fixture
def runs_namespace(kube: Rest) -> Iterator[str]:
    """A namespace of this test's own in the real API server; its Pods are deleted at the end."""
    name = f"runs-{uuid.uuid4().hex[:10]}"
    kube.post("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    kube.request("DELETE", f"/api/v1/namespaces/{name}/pods", {"gracePeriodSeconds": 0})
    kube.delete(f"/api/v1/namespaces/{name}")
