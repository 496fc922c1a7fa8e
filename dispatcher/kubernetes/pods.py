"""Run Pods as data: the Pod the launcher creates, and what a Pod seen on a watch says about its run.

Pure functions over plain dicts (the JSON the API speaks), so tests can validate every Pod against
the Kubernetes schema and classify Pods without a cluster.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispatcher.launcher import LaunchRequest
from runplane.basics.settings import KubernetesSettings, RepositorySettings
from runplane.basics.types import RunId

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "runplane"
RUN_ID = "runplane.dev/run-id"
JOB_ID = "runplane.dev/job-id"
ACCOUNT_ID = "runplane.dev/account-id"
ATTEMPT = "runplane.dev/attempt"
CLUSTER = "runplane.dev/cluster"
SELECTOR = f"{MANAGED_BY}={MANAGER}"
CONTAINER = "runner"
WORK_DIR = "/work"
TOKEN_DIR = "/var/run/runplane"
TOKEN_KEY = "token"
NODE_CACHE_DIR = "/var/run/runplane-node-cache"
NODE_CACHE_SOCKET = "cache.sock"  # in kubernetes.node_cache_socket_dir, as the keeper's DaemonSet names it

# Waiting reasons after which a container will never start without a change to the Pod or cluster.
_STUCK_WAITING = frozenset({"InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"})


def pod_name(run_id: int, attempt: int) -> str:
    """Deterministic, so creating the same launch twice answers 409 instead of starting two runners."""
    return f"runplane-run-{run_id}-{attempt}"


def build_token_secret(request: LaunchRequest, settings: KubernetesSettings, *, cluster: str) -> dict[str, Any]:
    """The per-launch Secret holding the run's token; the Pod mounts it as a file (never an env var).

    Named like the Pod; once the Pod exists it becomes the Secret's owner, so deleting the Pod
    deletes the token with it.
    """
    name = pod_name(request.run_id, request.attempt)
    return token_secret(name, run_labels(request, cluster), request.token, settings)


def token_secret(name: str, labels: dict[str, str], token: str, settings: KubernetesSettings) -> dict[str, Any]:
    """A Secret named like its Pod, holding the token that Pod mounts at ``/var/run/runplane/token``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "type": "Opaque",
        "immutable": True,
        "stringData": {TOKEN_KEY: token},
    }


def run_labels(request: LaunchRequest, cluster: str) -> dict[str, str]:
    """The labels that make a Pod a run's Pod: the watcher reconciles it with that run."""
    return {
        MANAGED_BY: MANAGER,
        "app.kubernetes.io/name": "runplane-runner",
        RUN_ID: str(request.run_id),
        JOB_ID: str(request.job_id),
        ACCOUNT_ID: str(request.account_id),
        ATTEMPT: str(request.attempt),
        CLUSTER: _label_value(cluster),
    }


def build_pod(
    request: LaunchRequest,
    settings: KubernetesSettings,
    *,
    cluster: str,
    cancel_grace: float,
    runner_api_address: str,
    repositories: RepositorySettings,
) -> dict[str, Any]:
    """The Pod manifest that runs ``runplane runner --run-id N`` for one launch of a run.

    It holds no control-plane credential: the runner knows the runner API's address and reads the
    run's token from the per-launch Secret mounted read-only at ``/var/run/runplane/token``.
    """
    pod = runner_pod(
        pod_name(request.run_id, request.attempt),
        run_labels(request, cluster),
        ["--run-id", str(request.run_id)],
        settings,
        image=settings.dbt_images.get(request.dbt_version, settings.image),
        memory_mb=request.memory_mb,
        cancel_grace=cancel_grace,
        runner_api_address=runner_api_address,
        repositories=repositories,
    )
    if request.timeout_seconds > 0:
        pod["spec"]["activeDeadlineSeconds"] = request.timeout_seconds + settings.deadline_slack_seconds
    return pod


def runner_pod(
    name: str,
    labels: dict[str, str],
    runner_args: list[str],
    settings: KubernetesSettings,
    *,
    image: str,
    memory_mb: int,
    cancel_grace: float,
    runner_api_address: str,
    repositories: RepositorySettings,
) -> dict[str, Any]:
    """A Pod running ``runplane runner <runner_args>`` with the token of the Secret named like it, and
    the dispatcher's repository rule (``repositories``), which its runner applies again before it clones."""
    memory = f"{memory_mb}Mi"
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["runplane", "runner", *runner_args, "--token-file", f"{TOKEN_DIR}/{TOKEN_KEY}"],
        "env": [
            # The root filesystem is read-only: dbt and the runner write under the work volume.
            {"name": "HOME", "value": WORK_DIR},
            {"name": "TMPDIR", "value": WORK_DIR},
            {"name": "RUNPLANE_RUNNER__WORK_DIR", "value": WORK_DIR},
            {"name": "RUNPLANE_LOG_FORMAT", "value": "json"},
            {"name": "RUNPLANE_RUNNER__API_ADDRESS", "value": runner_api_address},
            # A Pod keeps no file for the next run: a DuckDB file is refused, with the reason. Set
            # empty, written as the API server keeps an empty value (without one), so the Pod built
            # is the Pod stored.
            {"name": "RUNPLANE_RUNNER__LOCAL_WAREHOUSE_ROOT"},
            *(
                {"name": name, "value": value} if value else {"name": name}
                for name, value in repositories.environment().items()
            ),
        ],
        "envFrom": [{"secretRef": {"name": secret}} for secret in settings.env_from_secrets],
        "resources": {
            "requests": {"memory": memory, "cpu": settings.cpu_request},
            "limits": {"memory": memory},  # exceeding it is an OOMKill: the run's "memory limit error"
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "work", "mountPath": WORK_DIR},
            {"name": "run-token", "mountPath": TOKEN_DIR, "readOnly": True},
        ],
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # the runner talks to the runner API only
        "terminationGracePeriodSeconds": int(cancel_grace) + 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_user,
            "fsGroup": settings.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "work", "emptyDir": {}},
            {
                "name": "run-token",
                "secret": {
                    "secretName": name,
                    "defaultMode": 0o400,
                    "items": [{"key": TOKEN_KEY, "path": TOKEN_KEY}],
                },
            },
        ],
    }
    if settings.node_cache_socket_dir:
        # Only the keeper's socket: the cache itself stays in a directory no Pod mounts, and the
        # keeper serves a caller the entries of its run token's account alone.
        container["env"].append(
            {"name": "RUNPLANE_RUNNER__NODE_CACHE_SOCKET", "value": f"{NODE_CACHE_DIR}/{NODE_CACHE_SOCKET}"}
        )
        container["volumeMounts"].append({"name": "node-cache", "mountPath": NODE_CACHE_DIR, "readOnly": True})
        spec["volumes"].append(
            {"name": "node-cache", "hostPath": {"path": settings.node_cache_socket_dir, "type": "DirectoryOrCreate"}}
        )
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    if settings.node_selector:
        spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        spec["tolerations"] = [dict(t) for t in settings.tolerations]
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret} for secret in settings.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": spec,
    }


def _label_value(value: str) -> str:
    """A label value: at most 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in value)[:63]
    return cleaned.strip("._-")


class PodState(enum.Enum):
    """What a Pod says about its run."""

    ACTIVE = "active"  # pending or running
    SUCCEEDED = "succeeded"
    OOM_KILLED = "oom_killed"  # the run's memory limit error
    FAILED = "failed"  # evicted, deadline exceeded, non-zero exit, or stuck before its container started


@dataclass(frozen=True)
class PodView:
    """The parts of a watched Pod that reconciling needs."""

    name: str
    run_id: RunId | None  # None: the label is missing or malformed
    state: PodState
    reason: str  # why it failed, for the run's message
    finished_at: datetime | None  # when the last container terminated (for retention)

    @property
    def terminal(self) -> bool:
        return self.state is not PodState.ACTIVE


def view_pod(pod: dict[str, Any]) -> PodView:
    """Classify a Pod as the API returns it (JSON)."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    raw_run_id = (metadata.get("labels") or {}).get(RUN_ID, "")
    run_id = RunId(int(raw_run_id)) if str(raw_run_id).isdigit() else None
    statuses = list(status.get("containerStatuses") or [])
    terminated = [s["state"]["terminated"] for s in statuses if (s.get("state") or {}).get("terminated")]
    finished = [_parse_time(t.get("finishedAt")) for t in terminated]
    finished_at = max((f for f in finished if f is not None), default=None)
    phase = status.get("phase", "Pending")
    name = str(metadata.get("name", ""))

    if any(t.get("reason") == "OOMKilled" for t in terminated):
        return PodView(name, run_id, PodState.OOM_KILLED, "OOMKilled", finished_at)
    if phase == "Succeeded":
        return PodView(name, run_id, PodState.SUCCEEDED, "", finished_at)
    if phase == "Failed":
        reason = status.get("reason") or next((t.get("reason") for t in terminated if t.get("reason")), "") or "Failed"
        message = status.get("message") or next((t.get("message") for t in terminated if t.get("message")), "")
        return PodView(name, run_id, PodState.FAILED, f"{reason}: {message}" if message else reason, finished_at)
    for s in statuses:
        waiting = (s.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _STUCK_WAITING:
            text = f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
            return PodView(name, run_id, PodState.FAILED, text, None)
    return PodView(name, run_id, PodState.ACTIVE, "", None)


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
