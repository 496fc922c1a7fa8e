"""An in-memory ``PodOutcomes`` that records calls; the Postgres one is tested in test_pod_watcher.py."""

from __future__ import annotations

from collections.abc import Sequence

from runplane.types import RunId


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
