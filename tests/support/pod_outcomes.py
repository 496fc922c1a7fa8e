"""An in-memory ``PodOutcomes`` that records its calls and keeps runs as the Postgres one does.

Its conformance with ``PostgresPodOutcomes`` is tested in
tests/dispatcher/kubernetes/test_pod_outcomes_conformance.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from runplane.basics.types import RunId, RunStatus


@dataclass
class TwinRun:
    status: RunStatus
    pod_name: str = ""
    finished_at: float | None = None


class RecordedOutcomes:
    def __init__(self, orphan_grace: float = 60.0) -> None:
        self.calls: list[tuple[str, int, str]] = []
        self.runs: dict[RunId, TwinRun] = {}
        self.orphan_grace = orphan_grace

    async def memory_limit_exceeded(self, run_id: RunId, pod_name: str) -> bool:
        self.calls.append(("memory_limit_exceeded", run_id, pod_name))
        run = self._locked(run_id, pod_name, (RunStatus.STARTING, RunStatus.RUNNING))
        if run is None:
            return False
        run.status, run.finished_at = RunStatus.ERROR, time.time()
        return True

    async def failed_before_claim(self, run_id: RunId, pod_name: str, reason: str) -> bool:
        self.calls.append(("failed_before_claim", run_id, reason))
        run = self._locked(run_id, pod_name, (RunStatus.STARTING,))
        if run is None:
            return False
        run.status, run.pod_name = RunStatus.QUEUED, ""  # relaunched (the twin has no launch budget)
        return True

    async def runner_pod_failed(self, run_id: RunId, pod_name: str, reason: str) -> bool:
        self.calls.append(("runner_pod_failed", run_id, reason))
        run = self.runs.get(run_id)
        if run is None or run.status != RunStatus.RUNNING or run.pod_name != pod_name:
            return False
        run.status, run.finished_at = RunStatus.ERROR, time.time()
        return True

    async def live_pods(self, pods: Sequence[tuple[RunId, str]]) -> set[str]:
        live = set()
        for run_id, name in pods:
            run = self.runs.get(run_id)
            if run is None:
                continue
            recent = run.finished_at is not None and run.finished_at > time.time() - self.orphan_grace
            if run.status == RunStatus.STARTING or (
                run.pod_name in (name, "") and (run.status == RunStatus.RUNNING or recent)
            ):
                live.add(name)
        return live

    def _locked(self, run_id: RunId, pod_name: str, statuses: tuple[RunStatus, ...]) -> TwinRun | None:
        run = self.runs.get(run_id)
        if run is None or run.status not in statuses or run.pod_name not in (pod_name, ""):
            return None
        return run
