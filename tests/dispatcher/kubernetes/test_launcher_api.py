"""The launcher against a real kube-apiserver (v1.20, on loopback), with the real ``kubernetes`` client.

Contract cases (create, 409 on a second create, list, delete, and the API's rejections by
validation, admission and RBAC) run on the session's real API server, each in its own namespace.
429, 5xx and a connection dropped mid-request are faults a real API server cannot be made to show on
demand: those cases script them on kmock's stateless ``KubernetesScaffold``, or on a tiny TCP
server for the dropped connection (kmock cannot cut a connection).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock as kmocklib
import pytest

from dispatcher.kubernetes.api import CallRetries
from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.kubernetes.pods import SELECTOR
from dispatcher.launcher import LaunchRequest
from runplane.basics.errors import LaunchError
from runplane.basics.types import AccountId, JobId, RunId
from tests.dispatcher.kubernetes.conftest import NAMESPACE, client_config, k8s_settings
from tests.support.kubernetes_cluster import ControlPlane, Rest, service_account_token

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
SECRETS = f"/api/v1/namespaces/{NAMESPACE}/secrets"
REQUEST = LaunchRequest(
    run_id=RunId(7),
    job_id=JobId(70),
    account_id=AccountId(700),
    attempt=1,
    memory_mb=512,
    timeout_seconds=300,
    token="rpr_the-token-of-run-7",
)


def _secrets_accepted(kmock: Any) -> None:
    """Scripted answers for the token Secret a launch creates, then ties to its Pod."""
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "runplane-run-7-1"}}
    kmock[f"post {SECRETS}"] << 201 << secret
    kmock[f"patch {SECRETS}/runplane-run-7-1"] << 200 << secret


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    status = {"apiVersion": "v1", "kind": "Status", "status": "Failure"}
    return {**status, "code": code, "reason": reason, "message": message}


@pytest.fixture
async def launcher(control_plane: ControlPlane, runs_namespace: str) -> AsyncIterator[KubernetesLauncher]:
    settings = k8s_settings(namespace=runs_namespace)
    launcher = KubernetesLauncher(settings, configuration=control_plane.configuration())
    yield launcher
    await launcher.close()


async def test_create_records_cluster_and_pod_and_the_server_keeps_the_built_pod(
    launcher: KubernetesLauncher, kube: Rest, runs_namespace: str
) -> None:
    result = await launcher.launch(REQUEST)
    assert (result.cluster, result.pod_name) == ("east", "runplane-run-7-1")
    built = launcher.pod_for(REQUEST)
    stored = kube.get(f"/api/v1/namespaces/{runs_namespace}/pods/runplane-run-7-1")
    assert stored["metadata"]["labels"] == built["metadata"]["labels"]
    (container,) = stored["spec"]["containers"]
    (want,) = built["spec"]["containers"]
    for key in ("image", "command", "env", "resources", "securityContext", "volumeMounts"):
        assert container[key] == want[key], key
    for key in ("restartPolicy", "automountServiceAccountToken", "terminationGracePeriodSeconds",
                "activeDeadlineSeconds", "securityContext"):  # fmt: skip
        assert stored["spec"][key] == built["spec"][key], key
    assert stored["status"]["phase"] == "Pending"
    secret = kube.get(f"/api/v1/namespaces/{runs_namespace}/secrets/runplane-run-7-1")
    assert base64.b64decode(secret["data"]["token"]).decode() == REQUEST.token  # mounted; never in the Pod spec
    assert REQUEST.token not in json.dumps(stored)


async def test_duplicate_create_answers_409_and_counts_as_launched(
    launcher: KubernetesLauncher, kube: Rest, runs_namespace: str
) -> None:
    first = await launcher.launch(REQUEST)
    path = f"/api/v1/namespaces/{runs_namespace}/pods/{first.pod_name}"
    uid = kube.get(path)["metadata"]["uid"]
    second = await launcher.launch(REQUEST)
    assert first == second
    assert kube.pod_names(runs_namespace) == ["runplane-run-7-1"]
    assert kube.get(path)["metadata"]["uid"] == uid  # the first one, untouched


async def test_concurrent_creates_of_one_launch_make_one_pod(
    launcher: KubernetesLauncher, kube: Rest, runs_namespace: str
) -> None:
    results = await asyncio.gather(*(launcher.launch(REQUEST) for _ in range(8)))
    assert {r.pod_name for r in results} == {"runplane-run-7-1"}
    assert kube.pod_names(runs_namespace) == ["runplane-run-7-1"]


async def test_a_new_attempt_is_a_new_pod(launcher: KubernetesLauncher, kube: Rest, runs_namespace: str) -> None:
    await launcher.launch(REQUEST)
    result = await launcher.launch(LaunchRequest(**{**REQUEST.__dict__, "attempt": 2}))
    assert result.pod_name == "runplane-run-7-2"
    assert kube.pod_names(runs_namespace) == ["runplane-run-7-1", "runplane-run-7-2"]


async def test_list_by_label_and_delete(launcher: KubernetesLauncher, kube: Rest, runs_namespace: str) -> None:
    """The list call the watcher makes (watching: test_pod_watcher.py), and delete."""
    await launcher.launch(REQUEST)
    kube.post(
        f"/api/v1/namespaces/{runs_namespace}/pods",
        {"metadata": {"name": "not-ours"}, "spec": {"containers": [{"name": "c", "image": "local/busybox:1"}]}},
    )
    assert kube.pod_names(runs_namespace, SELECTOR) == ["runplane-run-7-1"]  # the server filtered by label

    assert await launcher.delete_pod("runplane-run-7-1") is True
    assert await launcher.delete_pod("runplane-run-7-1") is False  # 404: already gone
    assert kube.pod_names(runs_namespace) == ["not-ours"]


def _invalid_image(plane: ControlPlane, kube: Rest, namespace: str) -> KubernetesLauncher:
    """Validation: the API server requires an image."""
    return KubernetesLauncher(k8s_settings(namespace=namespace, image=""), configuration=plane.configuration())


def _over_the_limit_range(plane: ControlPlane, kube: Rest, namespace: str) -> KubernetesLauncher:
    """Admission: the LimitRanger plugin rejects a Pod above the namespace's memory maximum."""
    limits = {"type": "Container", "max": {"memory": "256Mi"}}
    kube.post(
        f"/api/v1/namespaces/{namespace}/limitranges", {"metadata": {"name": "small"}, "spec": {"limits": [limits]}}
    )
    return KubernetesLauncher(k8s_settings(namespace=namespace), configuration=plane.configuration())


def _without_a_role(plane: ControlPlane, kube: Rest, namespace: str) -> KubernetesLauncher:
    """RBAC: a ServiceAccount bound to no Role may not create Pods."""
    token = service_account_token(kube, namespace, "no-role")
    return KubernetesLauncher(k8s_settings(namespace=namespace), configuration=plane.configuration(token))


Arrange = Callable[[ControlPlane, Rest, str], KubernetesLauncher]


@pytest.mark.parametrize(
    "case",
    [
        (_invalid_image, 422, "Invalid", "spec.containers[0].image: Required value"),
        (_over_the_limit_range, 403, "Forbidden", "maximum memory usage per Container is 256Mi, but limit is 512Mi"),
        (_without_a_role, 403, "Forbidden", 'cannot create resource "secrets" in API group "" in the namespace'),
    ],
    ids=["validation", "admission", "rbac"],
)
async def test_rejections_fail_the_run_with_the_reason(
    control_plane: ControlPlane,
    kube: Rest,
    runs_namespace: str,
    case: tuple[Arrange, int, str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    arrange, code, reason, message = case
    launcher = arrange(control_plane, kube, runs_namespace)
    retries: list[int] = []
    backoff = CallRetries.delay

    def recorded(self: CallRetries, attempt: int) -> float:
        retries.append(attempt)
        return backoff(self, attempt)

    monkeypatch.setattr(CallRetries, "delay", recorded)
    try:
        with pytest.raises(LaunchError) as caught:
            await launcher.launch(REQUEST)
    finally:
        await launcher.close()
    assert caught.value.retryable is False
    assert message in str(caught.value) and str(code) in str(caught.value) and reason in str(caught.value)
    assert retries == []  # answered once, not retried with backoff
    assert kube.pod_names(runs_namespace) == []


@pytest.mark.kmock(cls=kmocklib.KubernetesScaffold)
async def test_429_honours_retry_after_then_succeeds(kmock: Any) -> None:
    """Emulated: a real API server throttles only under load it decides on, not on demand."""
    _secrets_accepted(kmock)
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
    """Emulated: a real API server does not send a 30 s Retry-After on demand."""
    _secrets_accepted(kmock)
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
    """Emulated: a real API server answers 500 twice and then 201 only by accident."""
    _secrets_accepted(kmock)
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
    """Emulated: a real API server shutting down closes its port rather than answering 503."""
    _secrets_accepted(kmock)
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
    """Emulated: a real API server cannot be made to read a request and hang up without an answer."""
    server = DroppingServer(drops=1)
    async with server as url:
        launcher = KubernetesLauncher(k8s_settings(), configuration=client_config(url))
        try:
            result = await launcher.launch(REQUEST)
        finally:
            await launcher.close()
    assert result.pod_name == "runplane-run-7-1"
    assert server.requests == 3  # the token Secret (dropped once, then created), then the Pod


async def test_connection_that_keeps_dropping_is_a_retryable_launch_error() -> None:
    """Emulated, as above: a connection cut after the request, every time."""
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


async def test_clusters_record_their_own_name(
    control_plane: ControlPlane, second_control_plane: ControlPlane, kube: Rest, runs_namespace: str
) -> None:
    """Two dispatchers, two real API servers: each launch lands in its own cluster and names it."""
    west_kube = second_control_plane.rest()
    west_kube.post("/api/v1/namespaces", {"metadata": {"name": runs_namespace}})
    east = KubernetesLauncher(
        k8s_settings("east", namespace=runs_namespace), configuration=control_plane.configuration()
    )
    west = KubernetesLauncher(
        k8s_settings("west", namespace=runs_namespace), configuration=second_control_plane.configuration()
    )
    try:
        a = await east.launch(REQUEST)
        b = await west.launch(LaunchRequest(**{**REQUEST.__dict__, "run_id": RunId(8)}))
        assert (a.cluster, b.cluster) == ("east", "west")
        assert kube.pod_names(runs_namespace) == ["runplane-run-7-1"]
        assert west_kube.pod_names(runs_namespace) == ["runplane-run-8-1"]
        west_pod = west_kube.get(f"/api/v1/namespaces/{runs_namespace}/pods/runplane-run-8-1")
        assert west_pod["metadata"]["labels"]["runplane.dev/cluster"] == "west"
    finally:
        await east.close()
        await west.close()
        west_kube.request("DELETE", f"/api/v1/namespaces/{runs_namespace}/pods", {"gracePeriodSeconds": 0})
        west_kube.delete(f"/api/v1/namespaces/{runs_namespace}")
        west_kube.close()
