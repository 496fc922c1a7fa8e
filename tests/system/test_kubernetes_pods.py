"""Run Pods on a real node: kubelet v1.20 on a private dockerd, the runner image built here.

The runner image is built from Debian's packages and PyPI (``deploy/k8s-local/images.sh``: a
debootstrap root filesystem imported as the base, the project's Dockerfiles on top) and cached by
the content of its inputs. Pods come from the launcher's own manifest (non-root, read-only root
filesystem, the account's memory as the limit); the Pod watcher reconciles them against the real
Postgres. Where a test needs the container to do something other than ``runplane runner`` (use
memory, wait for SIGTERM), it changes only the command of the launcher's Pod.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import urllib3

from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.kubernetes.outcomes import PostgresPodOutcomes
from dispatcher.kubernetes.pods import build_token_secret
from dispatcher.kubernetes.watch import PodWatcher
from dispatcher.launcher import LaunchRequest
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings
from runplane.basics.tokens import new_run_token
from runplane.basics.types import AccountId, JobId, RunId, RunStatus
from tests.dispatcher.kubernetes.conftest import k8s_settings
from tests.support.kubernetes_cluster import ControlPlane, Rest, RestError
from tests.support.kubernetes_system import describe_pods
from tests.support.polling import wait_for

# The first test pays for the node and, when the sources changed, the image build (minutes on a busy machine).
pytestmark = pytest.mark.timeout(1500)
Db = psycopg.Connection[tuple[object, ...]]


@dataclass
class Runs:
    """Launching and reconciling on the real node, against this test's database."""

    settings: Settings
    kube: Rest
    launcher: KubernetesLauncher
    watcher: PodWatcher
    db: Db

    @property
    def namespace(self) -> str:
        return self.settings.kubernetes.namespace

    def pod(self, name: str) -> Any:
        return self.kube.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")

    def log(self, name: str) -> str:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{name}/log"
        try:
            return self.kube.text("GET", path)
        except RestError as exc:
            if exc.status == 400:  # "waiting to start", "not available": no log before the container runs
                return ""
            if exc.status == 404:
                # The kubelet answers 404 for a Pod bound to it that it has not synced yet; only a Pod
                # gone from the API server is an error (``pod`` raises then).
                self.pod(name)
                return ""
            raise

    def create(self, pod: dict[str, Any], request: LaunchRequest) -> None:
        """Create a (changed) launcher Pod with the token Secret it mounts, as the launcher would."""
        secret = build_token_secret(request, self.settings.kubernetes, cluster=self.settings.dispatcher.cluster)
        self.kube.post(f"/api/v1/namespaces/{self.namespace}/secrets", secret)
        self.kube.post(f"/api/v1/namespaces/{self.namespace}/pods", pod)

    def new_run(self, status: RunStatus, memory_mb: int = 256) -> RunId:
        account = self.db.execute(
            "INSERT INTO accounts (name, run_slots, memory_mb) VALUES ('a', 5, %s) RETURNING id", (memory_mb,)
        )
        (account_id,) = account.fetchone() or ()
        job = self.db.execute(
            "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, 'j', 'deploy', ARRAY['dbt run'])"
            " RETURNING id",
            (account_id,),
        )
        (job_id,) = job.fetchone() or ()
        run = self.db.execute(
            """INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
                                 scheduled_at, dispatched_at)
               VALUES (%s, %s, 'deploy', %s, 'api', gen_random_uuid()::text, true, now(), now()) RETURNING id""",
            (account_id, job_id, int(status)),
        )
        (run_id,) = run.fetchone() or ()
        return RunId(int(str(run_id)))

    def request(self, run_id: RunId, memory_mb: int = 256) -> LaunchRequest:
        return LaunchRequest(
            run_id, JobId(1), AccountId(1), attempt=1, memory_mb=memory_mb, timeout_seconds=0, token=new_run_token()
        )

    def record(self, run_id: RunId, pod_name: str) -> None:
        self.db.execute("UPDATE runs SET cluster = 'east', pod_name = %s WHERE id = %s", (pod_name, run_id))

    def status(self, run_id: RunId) -> tuple[int, str]:
        row = self.db.execute("SELECT status, status_message FROM runs WHERE id = %s", (run_id,)).fetchone()
        assert row is not None
        return int(str(row[0])), str(row[1])


@pytest.fixture
async def runs(
    control_plane: ControlPlane, runner_image: str, runs_namespace: str, database_url: str, db: Db
) -> AsyncIterator[Runs]:
    settings = k8s_settings(
        namespace=runs_namespace,
        image=runner_image,
        image_pull_policy="Never",
        sweep_interval=0.5,
        orphan_grace_seconds=0.5,
        pod_retention_seconds=60,
    )
    settings = settings.model_copy(update={"database_url": database_url})
    pool = await open_pool(database_url, max_size=4)
    launcher = KubernetesLauncher(settings, configuration=control_plane.configuration())
    watcher = PodWatcher(settings, PostgresPodOutcomes(pool, settings), configuration=control_plane.configuration())
    kube = control_plane.rest()
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop), name="test:pod-watcher")
    try:
        yield Runs(settings, kube, launcher, watcher, db)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
        await launcher.close()
        await pool.close()
        kube.close()


async def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll in a thread: the conditions make blocking calls to the API server."""
    await asyncio.to_thread(wait_for, condition, timeout, interval=0.1, what=what)


# A container waiting for one of these does not start by itself: a test says so at once, not after
# its timeout.
CANNOT_START = {
    "ErrImageNeverPull",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
}


async def _until_started(runs: Runs, name: str, timeout: float) -> None:
    """Wait until the Pod's container has left ``waiting``; fail at once if it cannot, and on either
    failure say why (the Pod's events, the node's conditions and images)."""

    def started() -> bool:
        state = _container_state(runs.pod(name))
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in CANNOT_START:
            raise AssertionError(f"the container cannot start: {waiting['reason']}: {waiting.get('message', '')}")
        return bool(state) and not waiting

    try:
        await _until(started, timeout, f"the runner container of {name} to start")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe_pods(runs.kube, runs.namespace)}") from None


def _container_state(pod: Any) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return dict(statuses[0]["state"]) if statuses else {}


class PodEvents:
    """Every watch event of one namespace's Pods, collected in a thread (what a Pod went through)."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._http = urllib3.PoolManager(ca_certs=str(plane.ca_file), cert_reqs="CERT_REQUIRED", retries=False)
        url = f"{plane.url}/api/v1/namespaces/{namespace}/pods?watch=true&timeoutSeconds=120"
        headers = {"Authorization": f"Bearer {plane.admin_token}"}
        self._response = self._http.request("GET", url, headers=headers, preload_content=False, timeout=130)
        self._thread = threading.Thread(target=self._read, name="test-pod-events", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buffer = b""
        try:
            for chunk in self._response.stream(4096):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    event = json.loads(line)
                    self.events.append((event["type"], event["object"]))
        except Exception:  # the stream was closed by close()
            return

    def close(self) -> None:
        self._response.release_conn()
        self._http.clear()


async def test_the_runner_image_starts_in_a_real_pod(runs: Runs) -> None:
    """The launcher's Pod is scheduled, its container starts as uid 10001 and runs ``runplane runner``."""
    run_id = runs.new_run(RunStatus.STARTING)
    result = await runs.launcher.launch(runs.request(run_id))
    runs.record(run_id, result.pod_name)
    await _until_started(runs, result.pod_name, 120)
    pod = runs.pod(result.pod_name)
    assert pod["spec"]["nodeName"] == "localhost"
    assert pod["status"]["podIP"]
    await _until(lambda: "runner" in runs.log(result.pod_name), 60, "the runner's first log line")
    log = runs.log(result.pod_name)
    assert '"logger"' in log or "runner" in log, log


async def test_memory_limit_is_enforced_by_the_kernel_and_ends_the_run(runs: Runs) -> None:
    """A container above the account's memory is OOM-killed by its cgroup; the run ends "memory limit error"."""
    run_id = runs.new_run(RunStatus.RUNNING, memory_mb=64)
    request = runs.request(run_id, memory_mb=64)
    pod = runs.launcher.pod_for(request)
    hog = "import time; blocks = [bytearray(16 << 20) for _ in range(32)]; time.sleep(60)"
    pod["spec"]["containers"][0]["command"] = ["python3", "-c", hog]
    runs.create(pod, request)
    runs.record(run_id, pod["metadata"]["name"])
    await _until(lambda: runs.status(run_id)[0] == RunStatus.ERROR, 120, "the run to end")
    assert runs.status(run_id)[1] == "memory limit error"
    terminated = _container_state(runs.pod(pod["metadata"]["name"]))["terminated"]
    assert terminated["reason"] == "OOMKilled" and terminated["exitCode"] == 137


@pytest.fixture
def pod_events(control_plane: ControlPlane, runs: Runs) -> Iterator[PodEvents]:
    events = PodEvents(control_plane, runs.namespace)
    yield events
    events.close()


async def test_a_cancelled_run_has_its_pod_deleted_gracefully(runs: Runs, pod_events: PodEvents) -> None:
    """The watcher deletes the Pod of a run that is no longer live; the container gets SIGTERM and its
    grace period to exit, then the Pod is gone."""
    run_id = runs.new_run(RunStatus.RUNNING)
    request = runs.request(run_id)
    pod = runs.launcher.pod_for(request)
    name = pod["metadata"]["name"]
    script = "trap 'echo got SIGTERM; exit 3' TERM; echo ready; while true; do sleep 0.1; done"
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", script]
    runs.create(pod, request)
    runs.record(run_id, name)
    await _until(lambda: "ready" in runs.log(name), 120, "the container to run")
    runs.db.execute("UPDATE runs SET status = 30, finished_at = now() WHERE id = %s", (run_id,))  # cancelled
    await _until(lambda: any(kind == "DELETED" for kind, _ in pod_events.events), 60, "the Pod to be deleted")
    deleting = [obj for kind, obj in pod_events.events if obj["metadata"].get("deletionTimestamp")]
    assert deleting, "deleted with a grace period (deletionTimestamp set first), not at once"
    assert deleting[0]["metadata"]["deletionGracePeriodSeconds"] == pod["spec"]["terminationGracePeriodSeconds"]
    final = _container_state(deleting[-1])
    # The trap ran and the container ended by it: SIGTERM, not SIGKILL at the end of the grace period.
    assert final.get("terminated", {}).get("exitCode") == 3, final
