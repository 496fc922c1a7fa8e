"""Fixtures with a real Kubernetes: API servers on loopback, a node, a namespace per test.

``control_plane`` is a real kube-apiserver v1.20 + etcd, started once per test session
(``kubernetes_cluster.ControlPlane``; ``make k8s`` builds and caches its binaries). Each test gets its
own namespace in it (``runs_namespace``), so tests cannot see each other's Pods. ``node`` adds a real
kubelet on a private dockerd, for tests where Pods must really run; ``runner_image`` is the runner
image in that node's dockerd (``deploy/k8s-local/images.sh``: loaded from the cache outside the clone
when its inputs are unchanged, else built reusing the cached slow layers). Loaded by the root conftest.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported by the fixtures that start a cluster: most test processes never do
    from tests.support.kubernetes_cluster import ControlPlane, Node, Rest

IMAGES = Path(__file__).resolve().parents[2] / "deploy" / "k8s-local" / "images.sh"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A real kube-apiserver v1.20 + etcd on loopback, for the whole session."""
    from tests.support.kubernetes_cluster import ControlPlane

    plane = ControlPlane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def second_control_plane() -> Iterator[ControlPlane]:
    """Another cluster's API server, for tests of two clusters."""
    from tests.support.kubernetes_cluster import ControlPlane

    plane = ControlPlane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def compacting_control_plane() -> Iterator[ControlPlane]:
    """An API server that forgets history within seconds: no watch cache, etcd compacted every second,
    so resuming a watch from a version a few seconds old answers 410 Gone."""
    from tests.support.kubernetes_cluster import ControlPlane

    plane = ControlPlane.start(extra_args=["--watch-cache=false", "--etcd-compaction-interval=1s"])
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def node(control_plane: ControlPlane) -> Iterator[Node]:
    """A real node (kubelet on a private dockerd) on the session's control plane."""
    from tests.support.kubernetes_cluster import Node

    started = Node.start(control_plane)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="session")
def runner_image(node: Node) -> str:
    """The runner image in the node's dockerd: loaded from the cache, or built (minutes) when its inputs changed."""
    env = {**os.environ, "DOCKER_HOST": node.docker_host}
    done = subprocess.run([str(IMAGES)], env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, f"images.sh failed:\n{done.stderr[-3000:]}"
    return done.stdout.strip().splitlines()[-1]


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


@dataclass
class Cluster:
    """A real control plane and node, the runner image in the node, and a namespace for this test's Pods."""

    plane: ControlPlane
    node: Node
    image: str
    namespace: str
    kube: Rest


@pytest.fixture
def cluster(control_plane: ControlPlane, node: Node, runner_image: str, runs_namespace: str, kube: Rest) -> Cluster:
    return Cluster(control_plane, node, runner_image, runs_namespace, kube)
