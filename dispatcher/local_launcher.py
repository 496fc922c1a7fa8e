"""The local launcher: one runner process per run on this machine (the default of ``runplane up``).

By default runners are forked from a pre-loaded runner (``python -m runner.fork_server``, one per
dispatcher), so a run starts in milliseconds instead of the second a fresh interpreter spends
importing; with ``dispatcher.local_fork_server`` off, each run gets a fresh
``python -m runplane runner --run-id N``. Either way the runner lives in its own session, so it
outlives a dispatcher restart the way a Pod outlives the dispatcher that created it, and reads the
same ``RUNPLANE_*`` environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys

from dispatcher.launcher import LaunchRequest, LaunchResult
from runplane.errors import LaunchError

log = logging.getLogger(__name__)

FORK_SERVER_MODULE = "runner.fork_server"
FORK_SERVER_ANSWER_TIMEOUT = 30.0  # covers the server's own start (imports) on a busy machine


class ForkServer:
    """The dispatcher's end of ``runner.fork_server``: a run id in, the forked runner's pid out."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            await self._ensure_started()

    async def _ensure_started(self) -> asyncio.subprocess.Process:
        if self._process is not None and self._process.returncode is None:
            return self._process
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                FORK_SERVER_MODULE,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start the runner fork server: {exc}", retryable=True) from exc
        process = self._process
        assert process.stdout is not None
        try:
            ready = await asyncio.wait_for(process.stdout.readline(), timeout=FORK_SERVER_ANSWER_TIMEOUT)
        except TimeoutError:
            ready = b""
        if ready.strip() != b"ready":
            await self._discard(process)
            raise LaunchError(f"runner fork server did not start: {ready!r}", retryable=True)
        log.info("runner fork server ready", extra={"pid": process.pid})
        return process

    async def fork(self, run_id: int) -> int:
        async with self._lock:
            process = await self._ensure_started()
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(f"{run_id}\n".encode())
                await process.stdin.drain()
                answer = await asyncio.wait_for(process.stdout.readline(), timeout=FORK_SERVER_ANSWER_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                await self._discard(process)
                raise LaunchError(f"runner fork server did not answer: {exc!r}", retryable=True) from exc
            parts = answer.split()
            if len(parts) != 2 or int(parts[0]) != run_id or int(parts[1]) <= 0:
                await self._discard(process)
                raise LaunchError(f"runner fork server answered {answer!r}", retryable=True)
            return int(parts[1])

    async def _discard(self, process: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        self._process = None

    async def close(self) -> None:
        """Close its stdin: the server exits; runners it forked carry on."""
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout=5)
        except TimeoutError:
            await self._discard(process)
        self._process = None


class LocalLauncher:
    name = "local"

    def __init__(self, cluster: str, *, fork_server: bool = True) -> None:
        self._cluster = cluster
        self._fork_server = ForkServer() if fork_server else None
        self._children: set[int] = set()

    async def start(self) -> None:
        """Load the fork server ahead of the first run."""
        if self._fork_server is not None:
            await self._fork_server.start()

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        if self._fork_server is not None:
            pid = await self._fork_server.fork(request.run_id)
        else:
            pid = self._spawn(request.run_id)
        log.info("runner started", extra={"run_id": request.run_id, "pid": pid})
        return LaunchResult(cluster=self._cluster, pod_name=f"pid:{pid}")

    def _spawn(self, run_id: int) -> int:
        self._reap()
        argv = [sys.executable, "-m", "runplane", "runner", "--run-id", str(run_id)]
        try:
            # posix_spawn (vfork) keeps the event loop's pause to well under a millisecond.
            pid = os.posix_spawn(
                sys.executable,
                argv,
                os.environ,
                file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)],
                setsid=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start a runner process: {exc}", retryable=True) from exc
        self._children.add(pid)
        return pid

    def _reap(self) -> None:
        for pid in list(self._children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._children.discard(pid)

    async def close(self) -> None:
        """Runners still working carry on (their lease keeps them honest)."""
        if self._fork_server is not None:
            await self._fork_server.close()
        with contextlib.suppress(OSError):
            self._reap()
