"""The Pods the launcher builds: schema-valid (kubernetes-validate, strict) and shaped as promised."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from dispatcher.kubernetes.launcher import _pod_create_limiter
from dispatcher.kubernetes.pods import PodState, build_pod, build_token_secret, pod_name, view_pod
from dispatcher.launcher import LaunchRequest
from runplane.basics.settings import KubernetesSettings, RepositorySettings
from runplane.basics.types import AccountId, JobId, RunId
from tests.dispatcher.kubernetes.conftest import KUBE_VERSION

REQUEST = LaunchRequest(
    run_id=RunId(42),
    job_id=JobId(7),
    account_id=AccountId(3),
    attempt=2,
    memory_mb=1536,
    timeout_seconds=600,
    token="rpr_token-of-run-42",
)
RUNNER_API = "runplane-api.runplane.svc:50052"

SETTINGS_VARIANTS = {
    "defaults": KubernetesSettings(),
    "everything": KubernetesSettings(
        namespace="runs-eu",
        image="registry.example.com/runplane-runner:1.2.3",
        service_account="runplane-runner",
        node_selector={"pool": "runs", "kubernetes.io/arch": "amd64"},
        tolerations=[
            {"key": "dedicated", "operator": "Equal", "value": "runs", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
        ],
        image_pull_secrets=["registry-credentials"],
        env_from_secrets=["warehouse-credentials"],
        node_cache_socket_dir="/var/run/runplane-node-cache",
    ),
}


def _build(settings: KubernetesSettings, request: LaunchRequest = REQUEST, cluster: str = "eu-west") -> dict[str, Any]:
    return build_pod(
        request,
        settings,
        cluster=cluster,
        cancel_grace=10.0,
        runner_api_address=RUNNER_API,
        repositories=RepositorySettings(),
    )


@pytest.mark.parametrize("variant", sorted(SETTINGS_VARIANTS))
@pytest.mark.parametrize("timeout", [0, 600])
def test_every_pod_is_valid_for_the_target_kubernetes(variant: str, timeout: int) -> None:
    request = LaunchRequest(**{**REQUEST.__dict__, "timeout_seconds": timeout})
    pod = _build(SETTINGS_VARIANTS[variant], request)
    assert kubernetes_validate.validate(pod, KUBE_VERSION, strict=True) == KUBE_VERSION


def test_strict_validation_catches_a_malformed_pod() -> None:
    """The validator is really strict: an unknown field or a wrong type fails (so the test above means something)."""
    pod = _build(SETTINGS_VARIANTS["everything"])
    pod["spec"]["containers"][0]["memoryLimit"] = "1Gi"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)
    pod = _build(SETTINGS_VARIANTS["everything"])
    pod["spec"]["activeDeadlineSeconds"] = "600"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)


def test_pod_runs_the_runner_for_the_run_as_promised() -> None:
    settings = SETTINGS_VARIANTS["everything"]
    pod = _build(settings)
    meta, spec = pod["metadata"], pod["spec"]
    (container,) = spec["containers"]
    assert meta["name"] == pod_name(42, 2) == "runplane-run-42-2"
    assert meta["namespace"] == "runs-eu"
    assert meta["labels"] == {
        "app.kubernetes.io/managed-by": "runplane",
        "app.kubernetes.io/name": "runplane-runner",
        "runplane.dev/run-id": "42",
        "runplane.dev/job-id": "7",
        "runplane.dev/account-id": "3",
        "runplane.dev/attempt": "2",
        "runplane.dev/cluster": "eu-west",
    }
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 600 + settings.deadline_slack_seconds
    assert container["command"] == ["runplane", "runner", "--run-id", "42", "--token-file", "/var/run/runplane/token"]
    assert container["image"] == "registry.example.com/runplane-runner:1.2.3"
    assert container["resources"]["requests"]["memory"] == "1536Mi"
    assert container["resources"]["limits"] == {"memory": "1536Mi"}
    assert container["envFrom"] == [{"secretRef": {"name": "warehouse-credentials"}}]
    assert spec["serviceAccountName"] == "runplane-runner"
    assert spec["nodeSelector"] == {"pool": "runs", "kubernetes.io/arch": "amd64"}
    assert spec["tolerations"][1]["tolerationSeconds"] == 60
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("variant", sorted(SETTINGS_VARIANTS))
def test_the_pod_holds_no_credential_and_reads_its_token_from_a_mounted_secret(variant: str) -> None:
    settings = SETTINGS_VARIANTS[variant]
    pod = _build(settings)
    (container,) = pod["spec"]["containers"]
    text = json.dumps(pod)
    assert REQUEST.token not in text  # the token is in the Secret only, never in the Pod spec
    for credential in ("DATABASE_URL", "REDIS_URL", "AMQP_URL", "SECRET_KEYS", "postgresql://", "amqp://", "redis://"):
        assert credential not in text
    env = {e["name"]: e.get("value", "") for e in container["env"]}  # an empty value is left out
    assert env["RUNPLANE_RUNNER__API_ADDRESS"] == RUNNER_API
    assert env["RUNPLANE_RUNNER__LOCAL_WAREHOUSE_ROOT"] == ""  # a Pod keeps no DuckDB file: refused at run
    assert {"name": "run-token", "mountPath": "/var/run/runplane", "readOnly": True} in container["volumeMounts"]
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "run-token"]
    assert volume["secret"]["secretName"] == pod["metadata"]["name"]
    assert volume["secret"]["defaultMode"] == 0o400
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    secret = build_token_secret(REQUEST, settings, cluster="eu-west")
    assert secret["stringData"] == {"token": REQUEST.token} and secret["immutable"] is True
    assert secret["metadata"]["name"] == pod["metadata"]["name"]
    kubernetes_validate.validate(secret, KUBE_VERSION, strict=True)


def test_no_timeout_means_no_deadline_and_optional_fields_are_omitted() -> None:
    request = LaunchRequest(**{**REQUEST.__dict__, "timeout_seconds": 0})
    spec = _build(KubernetesSettings(), request)["spec"]
    assert "activeDeadlineSeconds" not in spec
    for optional in ("serviceAccountName", "nodeSelector", "tolerations", "imagePullSecrets"):
        assert optional not in spec


def test_only_the_node_caches_socket_directory_is_mounted_and_only_when_named() -> None:
    assert "hostPath" not in json.dumps(_build(KubernetesSettings()))
    pod = _build(KubernetesSettings(node_cache_socket_dir="/run/node-cache"))
    (container,) = pod["spec"]["containers"]
    [volume] = [v for v in pod["spec"]["volumes"] if "hostPath" in v]
    assert volume == {"name": "node-cache", "hostPath": {"path": "/run/node-cache", "type": "DirectoryOrCreate"}}
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "node-cache"]
    assert mount == {"name": "node-cache", "mountPath": "/var/run/runplane-node-cache", "readOnly": True}
    env = {e["name"]: e.get("value", "") for e in container["env"]}  # an empty value is left out
    assert env["RUNPLANE_RUNNER__NODE_CACHE_SOCKET"] == "/var/run/runplane-node-cache/cache.sock"


def test_cluster_names_become_valid_label_values() -> None:
    pod = _build(KubernetesSettings(), cluster="gke_project/europe-west1:prod cluster_")
    assert pod["metadata"]["labels"]["runplane.dev/cluster"] == "gke_project-europe-west1-prod-cluster"
    kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)


def _pod(
    phase: str, *, reason: str = "", terminated: dict[str, Any] | None = None, waiting: str = ""
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if terminated is not None:
        state["terminated"] = terminated
    if waiting:
        state["waiting"] = {"reason": waiting, "message": "bad"}
    status: dict[str, Any] = {"phase": phase, "containerStatuses": [{"name": "runner", "state": state}]}
    if reason:
        status["reason"] = reason
    return {"metadata": {"name": "runplane-run-9-1", "labels": {"runplane.dev/run-id": "9"}}, "status": status}


@pytest.mark.parametrize(
    ("pod", "state"),
    [
        (_pod("Pending"), PodState.ACTIVE),
        (_pod("Running"), PodState.ACTIVE),
        (_pod("Succeeded", terminated={"exitCode": 0, "finishedAt": "2026-01-01T00:00:00Z"}), PodState.SUCCEEDED),
        (_pod("Failed", terminated={"exitCode": 137, "reason": "OOMKilled"}), PodState.OOM_KILLED),
        (_pod("Failed", reason="Evicted"), PodState.FAILED),
        (_pod("Failed", reason="DeadlineExceeded"), PodState.FAILED),
        (_pod("Failed", terminated={"exitCode": 1, "reason": "Error"}), PodState.FAILED),
        (_pod("Pending", waiting="CreateContainerConfigError"), PodState.FAILED),
        (_pod("Pending", waiting="ContainerCreating"), PodState.ACTIVE),
    ],
)
def test_pod_states(pod: dict[str, Any], state: PodState) -> None:
    view = view_pod(pod)
    assert view.state is state
    assert view.run_id == 9


def test_pod_view_keeps_reason_and_finish_time() -> None:
    evicted = view_pod(_pod("Failed", reason="Evicted"))
    assert evicted.reason == "Evicted"
    done = view_pod(_pod("Succeeded", terminated={"exitCode": 0, "finishedAt": "2026-01-01T00:00:05Z"}))
    assert done.finished_at is not None and done.finished_at.timestamp() == 1767225605
    assert view_pod({"metadata": {"name": "x", "labels": {"runplane.dev/run-id": "nope"}}}).run_id is None


def test_the_environments_dbt_version_picks_the_runner_image() -> None:
    settings = KubernetesSettings(
        image="runner:default", dbt_images={"1.9": "runner:dbt-1.9", "1.10": "runner:dbt-1.10"}
    )
    for version, image in [("1.9", "runner:dbt-1.9"), ("1.10", "runner:dbt-1.10"), ("", "runner:default")]:
        pod = _build(settings, LaunchRequest(**{**REQUEST.__dict__, "dbt_version": version}))
        assert pod["spec"]["containers"][0]["image"] == image


def test_pod_creates_per_second_is_the_launchers_rate_and_zero_means_no_limit() -> None:
    assert _pod_create_limiter(0) is None
    fast = _pod_create_limiter(50)
    assert fast is not None and (fast.max_rate, fast.time_period) == (50, 1.0)
    slow = _pod_create_limiter(0.5)  # one launch every two seconds
    assert slow is not None and (slow.max_rate, slow.time_period) == (1, 2.0)
