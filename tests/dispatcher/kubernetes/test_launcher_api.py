"""The launcher against a Kubernetes API on 127.0.0.1, with the real ``kubernetes`` client.

Contract cases run on kmock's ``KubernetesEmulator`` (a stateful in-memory API server). Faults are
scripted: the emulator stores a created object even when a scripted reaction answers instead, so
the 429/5xx cases use kmock's stateless ``KubernetesScaffold`` where every answer is scripted, and
the dropped connection uses a tiny TCP server, since neither kmock server can cut a connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import kmock as kmocklib
import pytest

from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.launcher import LaunchRequest
from runplane.errors import LaunchError
from runplane.types import AccountId, JobId, RunId
from tests.dispatcher.kubernetes.conftest import NAMESPACE, client_config, k8s_settings

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
REQUEST = LaunchRequest(
    run_id=RunId(7), job_id=JobId(70), account_id=AccountId(700), attempt=1, memory_mb=512, timeout_seconds=300
)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    status = {"apiVersion": "v1", "kind": "Status", "status": "Failure"}
    return {**status, "code": code, "reason": reason, "message": message}


@pytest.fixture
async def launcher(kube_url: str) -> AsyncIterator[KubernetesLauncher]:
    launcher = KubernetesLauncher(k8s_settings(), configuration=client_config(kube_url))
    yield launcher
    await launcher.close()


async def test_create_records_cluster_and_pod_and_stores_the_built_pod(
    launcher: KubernetesLauncher, kmock: Any
) -> None:
    result = await launcher.launch(REQUEST)
    assert (result.cluster, result.pod_name) == ("east", "runplane-run-7-1")
    stored = kmock.objects[kmock.resource("v1/pods"), NAMESPACE, "runplane-run-7-1"]
    assert stored.raw == launcher.pod_for(REQUEST)


async def test_duplicate_create_answers_409_and_counts_as_launched(launcher: KubernetesLauncher, kmock: Any) -> None:
    first = await launcher.launch(REQUEST)
    second = await launcher.launch(REQUEST)
    assert first == second
    creates = list(kmock["post"])
    assert len(creates) == 2  # the second really reached the API and got 409
    assert len(list(kmock.objects)) == 1


async def test_a_new_attempt_is_a_new_pod(launcher: KubernetesLauncher, kmock: Any) -> None:
    await launcher.launch(REQUEST)
    result = await launcher.launch(LaunchRequest(**{**REQUEST.__dict__, "attempt": 2}))
    assert result.pod_name == "runplane-run-7-2"
    assert len(list(kmock.objects)) == 2


async def test_list_by_label_and_delete(launcher: KubernetesLauncher, kmock: Any, kube_url: str) -> None:
    """The list call the watcher makes (watching: test_pod_watcher.py and test_watch_resume.py), and delete."""
    import kubernetes.client

    await launcher.launch(REQUEST)
    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(client_config(kube_url)))
    listing = await asyncio.to_thread(
        core.list_namespaced_pod, NAMESPACE, label_selector="app.kubernetes.io/managed-by=runplane"
    )
    assert [p.metadata.name for p in listing.items] == ["runplane-run-7-1"]
    (list_request,) = kmock["get"]
    assert list_request.params["labelSelector"] == "app.kubernetes.io/managed-by=runplane"

    assert await launcher.delete_pod("runplane-run-7-1") is True
    assert await launcher.delete_pod("runplane-run-7-1") is False  # 404: already gone
    listing = await asyncio.to_thread(core.list_namespaced_pod, NAMESPACE)
    assert listing.items == []
    core.api_client.close()


@pytest.mark.parametrize(
    ("code", "reason", "message"),
    [
        (422, "Invalid", 'Pod "runplane-run-7-1" is invalid: spec.containers[0].image: Required value'),
        (403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:runplane:dispatcher" cannot create'),
    ],
)
async def test_rejections_fail_the_run_with_the_reason(
    launcher: KubernetesLauncher, kmock: Any, code: int, reason: str, message: str
) -> None:
    reaction = kmock[f"post {PODS}"] << code << _status(code, reason, message)
    with pytest.raises(LaunchError) as caught:
        await launcher.launch(REQUEST)
    assert caught.value.retryable is False
    assert message in str(caught.value) and str(code) in str(caught.value)
    assert len(list(reaction)) == 1  # not retried


@pytest.mark.kmock(cls=kmocklib.KubernetesScaffold)
async def test_429_honours_retry_after_then_succeeds(kmock: Any) -> None:
    create = kmock[f"post {PODS}"]
    throttled = create[:1] << 429 << {"Retry-After": "1"} << _status(429, "TooManyRequests", "slow down")
    created = create << 201 << {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runplane-run-7-1"}}
    launcher = KubernetesLauncher(k8s_settings(api_backoff=0.01), configuration=client_config(kmock.url))
    try:
        started = time.monotonic()
        result = await launcher.launch(REQUEST)
        elapsed = time.monotonic() - started
    finally:
        await launcher.close()
    assert result.pod_name == "runplane-run-7-1"
    assert (len(list(throttled)), len(list(created))) == (1, 1)
    assert elapsed >= 1.0  # waited as long as the API asked, not the 0.01 s backoff


@pytest.mark.kmock(cls=kmocklib.KubernetesScaffold)
async def test_429_longer_than_a_launch_may_wait_defers_with_retry_after(kmock: Any) -> None:
    throttled = kmock[f"post {PODS}"] << 429 << {"Retry-After": "30"} << _status(429, "TooManyRequests", "slow")
    launcher = KubernetesLauncher(k8s_settings(api_backoff_cap=2.0), configuration=client_config(kmock.url))
    try:
        with pytest.raises(LaunchError) as caught:
            await launcher.launch(REQUEST)
    finally:
        await launcher.close()
    assert caught.value.retryable is True and caught.value.retry_after == 30.0
    assert len(list(throttled)) == 1


@pytest.mark.kmock(cls=kmocklib.KubernetesScaffold)
async def test_5xx_is_retried_with_backoff_then_succeeds(kmock: Any) -> None:
    create = kmock[f"post {PODS}"]
    failing = create[:2] << 500 << _status(500, "InternalError", "etcdserver: request timed out")
    created = create << 201 << {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runplane-run-7-1"}}
    launcher = KubernetesLauncher(k8s_settings(), configuration=client_config(kmock.url))
    try:
        result = await launcher.launch(REQUEST)
    finally:
        await launcher.close()
    assert result.pod_name == "runplane-run-7-1"
    assert (len(list(failing)), len(list(created))) == (2, 1)


@pytest.mark.kmock(cls=kmocklib.KubernetesScaffold)
async def test_5xx_that_persists_is_a_retryable_launch_error_after_bounded_attempts(kmock: Any) -> None:
    failing = kmock[f"post {PODS}"] << 503 << _status(503, "ServiceUnavailable", "apiserver is shutting down")
    launcher = KubernetesLauncher(k8s_settings(api_attempts=3), configuration=client_config(kmock.url))
    try:
        with pytest.raises(LaunchError) as caught:
            await launcher.launch(REQUEST)
    finally:
        await launcher.close()
    assert caught.value.retryable is True
    assert "apiserver is shutting down" in str(caught.value)
    assert len(list(failing)) == 3


class DroppingServer:
    """Reads each request, then closes the connection without an answer for the first ``drops``;
    answers 201 with a Pod afterwards. kmock cannot drop a connection, hence this server."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.requests = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            length = next((int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")), 0)
            await reader.readexactly(length)
            self.requests += 1
            if self.requests <= self.drops:
                return  # closed below with no answer: the client sees the connection drop
            body = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runplane-run-7-1"}}).encode()
            writer.write(
                b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_dropped_connection_is_retried_then_succeeds() -> None:
    server = DroppingServer(drops=1)
    async with server as url:
        launcher = KubernetesLauncher(k8s_settings(), configuration=client_config(url))
        try:
            result = await launcher.launch(REQUEST)
        finally:
            await launcher.close()
    assert result.pod_name == "runplane-run-7-1"
    assert server.requests == 2


async def test_connection_that_keeps_dropping_is_a_retryable_launch_error() -> None:
    server = DroppingServer(drops=100)
    async with server as url:
        launcher = KubernetesLauncher(k8s_settings(api_attempts=3), configuration=client_config(url))
        try:
            with pytest.raises(LaunchError) as caught:
                await launcher.launch(REQUEST)
        finally:
            await launcher.close()
    assert caught.value.retryable is True
    assert server.requests == 3


async def test_clusters_record_their_own_name(kmock: Any, kube_url: str) -> None:
    """Two dispatchers, two clusters: each launch lands in its own API server and names its cluster."""
    async with kmocklib.KubernetesEmulator() as west_api, kmocklib.Server(west_api) as west_server:
        west_api.resources["v1/pods"] = {}
        east = KubernetesLauncher(k8s_settings("east"), configuration=client_config(kube_url))
        west = KubernetesLauncher(k8s_settings("west"), configuration=client_config(west_server.url))
        try:
            a = await east.launch(REQUEST)
            b = await west.launch(LaunchRequest(**{**REQUEST.__dict__, "run_id": RunId(8)}))
        finally:
            await east.close()
            await west.close()
        assert (a.cluster, b.cluster) == ("east", "west")
        assert [key[2] for key in kmock.objects] == ["runplane-run-7-1"]
        assert [key[2] for key in west_api.objects] == ["runplane-run-8-1"]
        west_pod = west_api.objects[kmock.resource("v1/pods"), NAMESPACE, "runplane-run-8-1"]
        assert west_pod.raw["metadata"]["labels"]["runplane.dev/cluster"] == "west"
