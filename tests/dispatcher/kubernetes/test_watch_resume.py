"""Watch bookkeeping on a scripted API (kmock's stateless ``KubernetesScaffold``): the emulator keeps
no resourceVersions, so the versions here are scripted to check that the watcher resumes from the
list's version, then from the last event's, and lists again after 410 Gone.

Reconciling goes to an in-memory ``PodOutcomes`` that records calls; the Postgres one is tested
against the real database in test_pod_watcher.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import kmock as kmocklib
import pytest

from dispatcher.kubernetes.watch import PodWatcher
from runplane.types import RunId
from tests.dispatcher.kubernetes.conftest import client_config, k8s_settings


class RecordedOutcomes:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str]] = []

    async def memory_limit_exceeded(self, run_id: RunId, pod_name: str) -> bool:
        self.calls.append(("memory_limit_exceeded", run_id, pod_name))
        return True

    async def failed_before_claim(self, run_id: RunId, pod_name: str, reason: str) -> bool:
        self.calls.append(("failed_before_claim", run_id, reason))
        return True

    async def live_pods(self, pods: Sequence[tuple[RunId, str]]) -> set[str]:
        return {name for _, name in pods}


def _pod(name: str, run_id: int, version: str, status: dict[str, Any]) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "runplane", "runplane.dev/run-id": str(run_id)}
    return {"metadata": {"name": name, "labels": labels, "resourceVersion": version}, "status": status}


def _listing(version: str, *pods: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": version}, "items": list(pods)}


async def _until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.kmock(cls=kmocklib.KubernetesScaffold)
async def test_watch_resumes_from_versions_and_relists_on_410(kmock: Any) -> None:
    evicted = _pod("runplane-run-5-1", 5, "120", {"phase": "Failed", "reason": "Evicted"})
    lists = kmock["list pods"]
    first_list = lists[:1] << _listing("100", _pod("runplane-run-4-1", 4, "90", {"phase": "Running"}))
    second_list = lists << _listing("300")
    watches = kmock["watch pods"]
    watches[:1] << ({"type": "MODIFIED", "object": evicted},)  # then the server ends the watch
    watches[1:2] << ({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}},)
    watches << (lambda: asyncio.sleep(1),)  # later watches: quiet for a second, then over

    outcomes = RecordedOutcomes()
    settings = k8s_settings(watch_timeout_seconds=30, sweep_interval=60)
    watcher = PodWatcher(settings, outcomes, configuration=client_config(kmock.url))
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop), name="test:pod-watcher")
    try:
        await _until(lambda: len(list(watches)) >= 3)
        assert ("failed_before_claim", 5, "Evicted") in outcomes.calls
        assert watcher.relists == 2
        assert (len(list(first_list)), len(list(second_list))) == (1, 1)
        versions = [request.params.get("resourceVersion") for request in watches]
        assert versions[:3] == ["100", "120", "300"]  # list, last event, relist after 410
        for request in watches:
            assert request.params["labelSelector"] == "app.kubernetes.io/managed-by=runplane"
            assert request.params["allowWatchBookmarks"] == "true"
    finally:
        stop.set()
        started = time.monotonic()
        await asyncio.wait_for(task, timeout=5)
    assert time.monotonic() - started < 2  # a quiet watch does not hold up stopping
