"""The local launcher: one runner process per run on this machine (the default of ``runplane up``).

The runner is ``python -m runplane runner --run-id N`` in its own session, so it outlives a
dispatcher restart the way a Pod outlives the dispatcher that created it; it reads the same
``RUNPLANE_*`` environment. Finished runners are reaped on every launch and on close.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from dispatcher.launcher import LaunchRequest, LaunchResult
from runplane.errors import LaunchError

log = logging.getLogger(__name__)


class LocalLauncher:
    name = "local"

    def __init__(self, cluster: str) -> None:
        self._cluster = cluster
        self._children: set[int] = set()

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        self._reap()
        argv = [sys.executable, "-m", "runplane", "runner", "--run-id", str(request.run_id)]
        try:
            # posix_spawn (vfork) keeps the event loop's pause to well under a millisecond.
            pid = os.posix_spawn(  # noqa: ASYNC221
                sys.executable,
                argv,
                os.environ,
                file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)],
                setsid=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start a runner process: {exc}", retryable=True) from exc
        self._children.add(pid)
        log.info("runner started", extra={"run_id": request.run_id, "pid": pid})
        return LaunchResult(cluster=self._cluster, pod_name=f"pid:{pid}")

    def _reap(self) -> None:
        for pid in list(self._children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._children.discard(pid)

    async def close(self) -> None:
        """Reap what has finished; runners still working carry on (their lease keeps them honest)."""
        with contextlib.suppress(OSError):
            self._reap()
