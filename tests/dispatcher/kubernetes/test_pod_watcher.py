"""The Pod watcher on kmock's ``KubernetesEmulator``, reconciling against runs in the real Postgres.

Pod status changes are PATCHed into the emulator (it merges them and streams MODIFIED events), the
way the kubelet would report them. The emulator neither filters by label nor keeps resourceVersions,
so these tests check what the watcher does with events; the 410 Gone is scripted on the first watch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import psycopg
import pytest

from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.kubernetes.outcomes import PostgresPodOutcomes
from dispatcher.kubernetes.watch import PodWatcher
from dispatcher.launcher import LaunchRequest
from runplane.db import open_pool
from runplane.settings import Settings
from runplane.types import AccountId, JobId, RunId, RunStatus
from tests.dispatcher.kubernetes.conftest import NAMESPACE, client_config, k8s_settings

Db = psycopg.Connection[tuple[object, ...]]


@dataclass
class Cluster:
    """An emulated cluster with a watcher running against this test's database."""

    settings: Settings
    url: str
    kmock: Any
    launcher: KubernetesLauncher
    watcher: PodWatcher

    def pod_names(self) -> set[str]:
        return {name for (_, _, name), obj in self.kmock.objects.items() if not obj.deleted}

    async def set_status(self, name: str, status: dict[str, Any]) -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.patch(f"{self.url}/api/v1/namespaces/{NAMESPACE}/pods/{name}", json={"status": status}) as resp,
        ):
            assert resp.status == 200, await resp.text()


@pytest.fixture
async def cluster(kmock: Any, kube_url: str, database_url: str) -> AsyncIterator[Cluster]:
    settings = k8s_settings()
    settings = settings.model_copy(update={"database_url": database_url})
    pool = await open_pool(database_url, max_size=4)
    launcher = KubernetesLauncher(settings, configuration=client_config(kube_url))
    watcher = PodWatcher(settings, PostgresPodOutcomes(pool, settings), configuration=client_config(kube_url))
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop), name="test:pod-watcher")
    try:
        yield Cluster(settings, kube_url, kmock, launcher, watcher)
        stop.set()
        started = time.monotonic()
        await asyncio.wait_for(task, timeout=5)
        assert time.monotonic() - started < 3  # stopping closes the watch socket: no wait for a timeout
        # The emulator's watch handlers notice a closed client only when they next write: give them an event.
        await launcher.launch(LaunchRequest(RunId(10**9), JobId(1), AccountId(1), 1, 64, 0))

    finally:
        if not task.done():
            task.cancel()
        await launcher.close()
        await pool.close()


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
    request = LaunchRequest(run_id, JobId(1), AccountId(1), attempt=attempt, memory_mb=512, timeout_seconds=0)
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


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def _terminated(reason: str, exit_code: int) -> dict[str, Any]:
    finished = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    terminated = {"exitCode": exit_code, "reason": reason, "finishedAt": finished}
    return {"name": "runner", "state": {"terminated": terminated}}


async def test_oom_killed_pod_ends_the_run_with_memory_limit_error(cluster: Cluster, db: Db) -> None:
    run_id = _run(db, RunStatus.RUNNING)
    pod = await _launch(cluster, db, run_id)
    await cluster.set_status(pod, {"phase": "Failed", "containerStatuses": [_terminated("OOMKilled", 137)]})
    await _until(lambda: _row(db, run_id)["status"] == RunStatus.ERROR)
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
    await _until(lambda: _row(db, run_id)["status"] == RunStatus.QUEUED)
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
        pod, {"phase": "Pending", "containerStatuses": [{"name": "runner", "state": {"waiting": {
            "reason": "CreateContainerConfigError", "message": 'secret "runplane-urls" not found'}}}]}
    )  # fmt: skip
    await _until(lambda: _row(db, run_id)["status"] == RunStatus.ERROR)
    row = _row(db, run_id)
    assert row["launch_attempts"] == 3
    assert "3 launch attempts" in row["status_message"] and "runplane-urls" in row["status_message"]


async def test_a_failed_pod_of_a_claimed_run_does_not_requeue_it(cluster: Cluster, db: Db) -> None:
    """Once the runner claimed the run, its lease (not the Pod) decides: the watcher leaves it running."""
    run_id = _run(db, RunStatus.RUNNING)
    pod = await _launch(cluster, db, run_id)
    other = _run(db, RunStatus.RUNNING)
    other_pod = await _launch(cluster, db, other)
    await cluster.set_status(pod, {"phase": "Failed", "reason": "Evicted"})
    await cluster.set_status(other_pod, {"phase": "Failed", "containerStatuses": [_terminated("OOMKilled", 137)]})
    await _until(lambda: _row(db, other)["status"] == RunStatus.ERROR)  # events are handled in order
    assert _row(db, run_id)["status"] == RunStatus.RUNNING


async def test_pod_whose_run_is_not_live_is_deleted(cluster: Cluster, db: Db) -> None:
    live = _run(db, RunStatus.RUNNING)
    live_pod = await _launch(cluster, db, live)
    cancelled = _run(db, RunStatus.RUNNING)
    cancelled_pod = await _launch(cluster, db, cancelled)
    await _until(lambda: cluster.watcher.pods.keys() >= {live_pod, cancelled_pod})
    db.execute("UPDATE runs SET status = 30, finished_at = now() WHERE id = %s", (cancelled,))
    await _until(lambda: cancelled_pod not in cluster.pod_names())  # found by the periodic sweep
    await asyncio.sleep(3 * cluster.settings.kubernetes.sweep_interval)
    assert live_pod in cluster.pod_names()


async def test_finished_pods_are_deleted_after_retention(cluster: Cluster, db: Db) -> None:
    run_id = _run(db, RunStatus.RUNNING)
    pod = await _launch(cluster, db, run_id)
    db.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (run_id,))  # the runner's outcome
    await cluster.set_status(pod, {"phase": "Succeeded", "containerStatuses": [_terminated("Completed", 0)]})
    seen = time.monotonic()
    await _until(lambda: pod in cluster.watcher.pods and cluster.watcher.pods[pod].terminal)
    await _until(lambda: pod not in cluster.pod_names())
    retention = cluster.settings.kubernetes.pod_retention_seconds
    assert time.monotonic() - seen >= retention - 0.1
    assert _row(db, run_id)["status"] == RunStatus.SUCCESS  # the watcher never touches a finished run


async def test_watch_410_gone_relists_and_keeps_reconciling(kmock: Any, cluster: Cluster, db: Db) -> None:
    """The first watch is scripted to answer ERROR 410; the watcher lists again and keeps watching."""
    expired = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    gone = kmock["watch pods"][:1] << (expired,)
    relists = cluster.watcher.relists
    await _until(lambda: cluster.watcher.relists > relists, timeout=10)
    assert len(list(gone)) == 1  # the 410 was served, and answered by a relist
    run_id = _run(db, RunStatus.RUNNING)
    pod = await _launch(cluster, db, run_id)
    await cluster.set_status(pod, {"phase": "Failed", "containerStatuses": [_terminated("OOMKilled", 137)]})
    await _until(lambda: _row(db, run_id)["status"] == RunStatus.ERROR)
