"""An in-memory ``Launcher``: it records launch requests and starts nothing.

Its conformance with the real launchers is tested in tests/dispatcher/test_launcher_conformance.py.
"""

from __future__ import annotations

from dispatcher.launcher import LaunchRequest, LaunchResult
from runplane.basics.errors import LaunchError


class HoldingLauncher:
    """Records launch requests and starts nothing, so dispatched runs stay ``starting``."""

    name = "holding"

    def __init__(self, fail_with: LaunchError | None = None, cluster: str = "test") -> None:
        self.requests: list[LaunchRequest] = []
        self.fail_with = fail_with
        self.cluster = cluster

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        if not request.token:
            raise LaunchError(f"run {request.run_id} has no run token", retryable=False)
        self.requests.append(request)
        if self.fail_with is not None:
            raise self.fail_with
        return LaunchResult(cluster=self.cluster, pod_name=f"held-{request.run_id}")

    async def close(self) -> None:
        return None
