"""The Pod watcher on a real kube-apiserver (v1.20, on loopback), reconciling runs in the real Postgres.

Pod status changes are written to the Pods' status subresource, as the kubelet reports them; the
API server validates them, stores them and streams MODIFIED events to the watcher. Each test has
its own namespace. Pods run for real (with a kubelet) in tests/system/test_kubernetes_pods.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.kubernetes.outcomes import PostgresPodOutcomes
from dispatcher.kubernetes.pods import MANAGED_BY, MANAGER
from dispatcher.kubernetes.pool import POOL
from dispatcher.kubernetes.watch import PodWatcher
from dispatcher.launcher import LaunchRequest
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings
from runplane.basics.tokens import new_run_token
from runplane.basics.types import AccountId, JobId, RunId, RunStatus
from tests.dispatcher.kubernetes.conftest import k8s_settings
from tests.support.kubernetes_cluster import ControlPlane, Rest
from tests.support.polling import eventually

Db = psycopg.Connection[tuple[object, ...]]


@dataclass
class Cluster:
    """A real API server with a watcher running against this test's database and namespace."""

    settings: Settings
    kube: Rest
    launcher: KubernetesLauncher
    watcher: PodWatcher

    @property
    def namespace(self) -> str:
        return self.settings.kubernetes.namespace

    def pod_names(self) -> set[str]:
        return set(self.kube.pod_names(self.namespace))

    async def set_status(self, name: str, status: dict[str, Any]) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{name}/status"
        await asyncio.to_thread(self.kube.merge_patch, path, {"status": status})


async def start_cluster(
    plane: ControlPlane, namespace: str, database_url: str, **kubernetes_settings: Any
) -> tuple[Cluster, asyncio.Event, asyncio.Task[None], Callable[[], Any]]:
    settings = k8s_settings(namespace=namespace, **kubernetes_settings)
    settings = settings.model_copy(update={"database_url": database_url})
    pool = await open_pool(database_url, max_size=4)
    launcher = KubernetesLauncher(settings, configuration=plane.configuration())
    watcher = PodWatcher(settings, PostgresPodOutcomes(pool, settings), configuration=plane.configuration())
    kube = plane.rest()
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop), name="test:pod-watcher")

    async def close() -> None:
        if not task.done():
            task.cancel()
        await launcher.close()
        await pool.close()
        kube.close()

    return Cluster(settings, kube, launcher, watcher), stop, task, close


@pytest.fixture
async def cluster(control_plane: ControlPlane, runs_namespace: str, database_url: str) -> AsyncIterator[Cluster]:
    # A watch the API server keeps open for a minute: only closing its socket ends it sooner.
    started, stop, task, close = await start_cluster(
        control_plane, runs_namespace, database_url, watch_timeout_seconds=60
    )
    try:
        yield started
        stop.set()
        await asyncio.wait_for(task, timeout=5)
        await eventually(lambda: not watch_threads(), 10, what="stopping to close the watch socket")
    finally:
        await close()


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "runplane-pod-watch" and t.is_alive()]


def _run(db: Db, status: RunStatus, *, launch_attempts: int = 0) -> RunId:
    account = db.execute("INSERT INTO accounts (name, run_slots, memory_mb) VALUES ('a', 5, 512) RETURNING id")
    (account_id,) = account.fetchone() or ()
    job = db.execute(
        "INSERT INTO jobs (account_id, name, job_type, steps)"
        " VALUES (%s, 'j', 'deploy', ARRAY['dbt run']) RETURNING id",
        (account_id,),
    )
    (job_id,) = job.fetchone() or ()
    run = db.execute(
        """INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
                             scheduled_at, launch_attempts, dispatched_at)
           VALUES (%s, %s, 'deploy', %s, 'api', gen_random_uuid()::text, true, now(), %s, now()) RETURNING id""",
        (account_id, job_id, int(status), launch_attempts),
    )
    (run_id,) = run.fetchone() or ()
    return RunId(int(str(run_id)))


async def _launch(cluster: Cluster, db: Db, run_id: RunId, *, attempt: int = 1) -> str:
    """Launch as the dispatcher would, and record the cluster and Pod on the run."""
    request = LaunchRequest(
        run_id, JobId(1), AccountId(1), attempt=attempt, memory_mb=512, timeout_seconds=0, token=new_run_token()
    )
    result = await cluster.launcher.launch(request)
    db.execute("UPDATE runs SET cluster = %s, pod_name = %s WHERE id = %s", (result.cluster, result.pod_name, run_id))
    return result.pod_name


def _row(db: Db, run_id: RunId) -> dict[str, Any]:
    cur = db.execute(
        "SELECT status, status_message, launch_attempts, not_before, waiting_reason, pod_name, finished_at"
        " FROM runs WHERE id = %s",
        (run_id,),
    )
    names = [c.name for c in cur.description or []]
    return dict(zip(names, cur.fetchone() or (), strict=True))


def _terminated(reason: str, exit_code: int) -> dict[str, Any]:
    finished = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    terminated = {"exitCode": exit_code, "reason": reason, "startedAt": finished, "finishedAt": finished}
    return {"name": "runner", "image": "runner", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": terminated}}  # fmt: skip


async def test_oom_killed_pod_ends_the_run_with_memory_limit_error(cluster: Cluster, db: Db) -> None:
    run_id = _run(db, RunStatus.RUNNING)
    pod = await _launch(cluster, db, run_id)
    await cluster.set_status(pod, {"phase": "Failed", "containerStatuses": [_terminated("OOMKilled", 137)]})
    await eventually(lambda: _row(db, run_id)["status"] == RunStatus.ERROR, 5.0)
    row = _row(db, run_id)
    assert row["status_message"] == "memory limit error"
    assert row["finished_at"] is not None
    # Ended through the shared outcome path: the job's failure count moved.
    failures = db.execute(
        "SELECT j.consecutive_failures FROM jobs j JOIN runs r ON r.job_id = j.id WHERE r.id = %s", (run_id,)
    )
    assert failures.fetchone() == (1,)


async def test_evicted_before_claim_goes_back_to_the_queue_with_backoff(cluster: Cluster, db: Db) -> None:
    run_id = _run(db, RunStatus.STARTING)
    pod = await _launch(cluster, db, run_id)
    await cluster.set_status(pod, {"phase": "Failed", "reason": "Evicted", "message": "node low on memory"})
    await eventually(lambda: _row(db, run_id)["status"] == RunStatus.QUEUED, 5.0)
    row = _row(db, run_id)
    assert row["launch_attempts"] == 1
    assert row["waiting_reason"] == "launch_backoff"
    assert row["pod_name"] == ""
    assert "Evicted: node low on memory" in row["status_message"]
    backoff = (row["not_before"] - datetime.now(UTC)).total_seconds()
    assert 0 < backoff <= cluster.settings.scheduler.launch_backoff


async def test_failure_before_claim_with_the_budget_spent_ends_the_run(cluster: Cluster, db: Db) -> None:
    run_id = _run(db, RunStatus.STARTING, launch_attempts=2)  # the budget is 3 launches
    pod = await _launch(cluster, db, run_id, attempt=3)
    await cluster.set_status(
        pod, {"phase": "Pending", "containerStatuses": [{"name": "runner", "image": "runner", "imageID": "",
            "ready": False, "restartCount": 0, "state": {"waiting": {
            "reason": "CreateContainerConfigError", "message": 'secret "runplane-urls" not found'}}}]}
    )  # fmt: skip
    await eventually(lambda: _row(db, run_id)["status"] == RunStatus.ERROR, 5.0)
    row = _row(db, run_id)
    assert row["launch_attempts"] == 3
    assert "3 launch attempts" in row["status_message"] and "runplane-urls" in row["status_message"]


async def test_a_failed_pod_of_a_claimed_run_ends_it_runner_lost_at_once(cluster: Cluster, db: Db) -> None:
    """Once the runner claimed the run, a Pod that failed means the runner is gone: the run ends
    "runner lost" with the Pod's reason (not queued again, not left to wait out its lease)."""
    run_id = _run(db, RunStatus.RUNNING)
    pod = await _launch(cluster, db, run_id)
    await cluster.set_status(pod, {"phase": "Failed", "containerStatuses": [_terminated("Error", 1)]})
    await eventually(lambda: _row(db, run_id)["status"] == RunStatus.ERROR, 5.0)
    row = _row(db, run_id)
    assert row["status_message"] == "runner lost: its pod failed: Error"
    assert row["launch_attempts"] == 0  # not relaunched: the job's retry policy decides what follows


async def test_a_failed_pod_not_recorded_on_its_running_run_changes_nothing(cluster: Cluster, db: Db) -> None:
    """While no Pod is recorded on the running run, a failed Pod may not be its runner's: the lease
    decides. (A Pod of an earlier launch, another one recorded, is the conformance tests'.)"""
    run_id = _run(db, RunStatus.RUNNING)
    unrecorded = await _launch(cluster, db, run_id)
    db.execute("UPDATE runs SET pod_name = '' WHERE id = %s", (run_id,))
    other = _run(db, RunStatus.RUNNING)
    other_pod = await _launch(cluster, db, other)
    await cluster.set_status(unrecorded, {"phase": "Failed", "reason": "Evicted"})
    await cluster.set_status(other_pod, {"phase": "Failed", "containerStatuses": [_terminated("OOMKilled", 137)]})
    await eventually(lambda: _row(db, other)["status"] == RunStatus.ERROR, 5.0)  # events are handled in order
    assert _row(db, run_id)["status"] == RunStatus.RUNNING


async def test_a_pool_pod_waiting_for_a_run_fills_the_cluster_but_leaves_room_for_runs(
    cluster: Cluster, db: Db
) -> None:
    waiting = "runplane-pool-small-0a1b2c3d"
    labels = {MANAGED_BY: MANAGER, POOL: "small"}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": waiting, "labels": labels},
            "spec": {"containers": [{"name": "runner", "image": "runner"}]}}  # fmt: skip
    await asyncio.to_thread(cluster.kube.post, f"/api/v1/namespaces/{cluster.namespace}/pods", body)
    run_pod = await _launch(cluster, db, _run(db, RunStatus.STARTING))
    await eventually(lambda: cluster.watcher.pods.keys() >= {waiting, run_pod}, 5.0)
    assert cluster.watcher.active_count() == 2  # both hold a place on the nodes (what the pools grow within)
    assert cluster.watcher.run_pod_count() == 1  # the waiting one takes a run without a new Pod
    await cluster.set_status(waiting, {"phase": "Failed", "reason": "Evicted"})
    await eventually(lambda: cluster.watcher.active_count() == 1, 5.0)
    assert cluster.watcher.run_pod_count() == 1


async def test_pod_whose_run_is_not_live_is_deleted(cluster: Cluster, db: Db) -> None:
    live = _run(db, RunStatus.RUNNING)
    live_pod = await _launch(cluster, db, live)
    cancelled = _run(db, RunStatus.RUNNING)
    cancelled_pod = await _launch(cluster, db, cancelled)
    await eventually(lambda: cluster.watcher.pods.keys() >= {live_pod, cancelled_pod}, 5.0)
    db.execute("UPDATE runs SET status = 30, finished_at = now() WHERE id = %s", (cancelled,))
    await eventually(lambda: cancelled_pod not in cluster.pod_names(), 5.0)  # found by the periodic sweep
    for _ in range(3):  # sweeps that find the cancelled run's Pod gone leave the live run's alone
        await cluster.watcher.sweep()
    assert live_pod in cluster.pod_names()


async def test_finished_pods_are_deleted_after_retention(cluster: Cluster, db: Db) -> None:
    run_id = _run(db, RunStatus.RUNNING)
    pod = await _launch(cluster, db, run_id)
    terminated = _terminated("Completed", 0)
    await cluster.set_status(pod, {"phase": "Succeeded", "containerStatuses": [terminated]})
    # The runner's outcome; written after the Pod ended here, as the orphan grace (0.3 s) is too short to
    # cover a loaded machine between the two (the Pod would go as an orphan, not after retention).
    db.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (run_id,))
    await eventually(lambda: pod in cluster.watcher.pods and cluster.watcher.pods[pod].terminal, 5.0)
    await eventually(lambda: pod not in cluster.pod_names(), 5.0)
    retention = cluster.settings.kubernetes.pod_retention_seconds
    finished = datetime.fromisoformat(terminated["state"]["terminated"]["finishedAt"].replace("Z", "+00:00"))
    assert time.time() - finished.timestamp() >= retention  # kept for retention after the container finished
    assert _row(db, run_id)["status"] == RunStatus.SUCCESS  # the watcher never touches a finished run


async def test_watch_resumes_across_server_timeouts_without_listing_again(
    control_plane: ControlPlane, runs_namespace: str, database_url: str, db: Db
) -> None:
    """Each watch ends after ``watch_timeout_seconds`` (2 s); the next resumes from the last version seen."""
    started, stop, task, close = await start_cluster(
        control_plane, runs_namespace, database_url, watch_timeout_seconds=2
    )
    try:
        run_id = _run(db, RunStatus.RUNNING)
        pod = await _launch(started, db, run_id)
        await eventually(lambda: pod in started.watcher.pods, 5.0)
        await asyncio.sleep(2.5 * started.settings.kubernetes.watch_timeout_seconds)  # past two server timeouts
        await started.set_status(pod, {"phase": "Failed", "containerStatuses": [_terminated("OOMKilled", 137)]})
        await eventually(lambda: _row(db, run_id)["status"] == RunStatus.ERROR, 5.0)
        assert started.watcher.relists == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
        await close()


async def test_watch_410_gone_relists_and_keeps_reconciling(
    compacting_control_plane: ControlPlane, database_url: str, db: Db
) -> None:
    """On an API server that compacts its history every second, the watcher's version expires while its
    namespace is quiet and others change; resuming answers 410 Gone and the watcher lists again."""
    kube = compacting_control_plane.rest()
    for name in ("runs", "elsewhere"):
        kube.post("/api/v1/namespaces", {"metadata": {"name": name}})
    started, stop, task, close = await start_cluster(
        compacting_control_plane, "runs", database_url, watch_timeout_seconds=1
    )
    try:
        await eventually(lambda: started.watcher.relists == 1, 5.0)
        for i in range(12):  # writes elsewhere move the store's revision on; compaction drops the old ones
            kube.post("/api/v1/namespaces/elsewhere/configmaps", {"metadata": {"name": f"c{i}"}})
            await asyncio.sleep(0.5)
        await eventually(lambda: started.watcher.relists > 1, 10)
        assert started.watcher.expirations >= 1  # the relist followed a real 410 Gone
        run_id = _run(db, RunStatus.RUNNING)
        pod = await _launch(started, db, run_id)
        await started.set_status(pod, {"phase": "Failed", "containerStatuses": [_terminated("OOMKilled", 137)]})
        await eventually(lambda: _row(db, run_id)["status"] == RunStatus.ERROR, 5.0)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
        await close()
        kube.close()
