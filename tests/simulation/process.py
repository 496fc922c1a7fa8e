"""A simulated OS process: its tasks, and whether it is frozen (SIGSTOP) or running.

The code under test cannot be stopped between two lines, so a frozen process is modelled at its
edges: its clocks stand still at the instant it froze (a decision it takes is taken at that
instant) and every call it makes to the outside (bus, stores) and every message delivered to it
waits until it runs again. That is the process frozen just before its next call out, which is one
of the interleavings a real SIGSTOP makes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z: simulated time 0 in wall-clock seconds


class Process:
    def __init__(self, name: str) -> None:
        self.name = name
        self.frozen_at: float | None = None
        self._thawed = asyncio.Event()
        self._thawed.set()
        self.task: asyncio.Task[None] | None = None
        self.stop = asyncio.Event()
        # Called (once) when the process is about to send its next stamped message: a fault that
        # stops it between a decision it recorded and the message that tells it.
        self.before_send: Callable[[], None] | None = None

    @property
    def frozen(self) -> bool:
        return self.frozen_at is not None

    def freeze(self) -> None:
        if self.frozen_at is None:
            self.frozen_at = asyncio.get_running_loop().time()
            self._thawed.clear()

    def thaw(self) -> None:
        self.frozen_at = None
        self._thawed.set()

    async def running(self) -> None:
        """Return at once while running; while frozen, when thawed."""
        if not self._thawed.is_set():
            await self._thawed.wait()

    def monotonic(self) -> float:
        return self.frozen_at if self.frozen_at is not None else asyncio.get_running_loop().time()

    def wall(self) -> float:
        return EPOCH + self.monotonic()


class ProcessMonotonic:
    """``MonotonicClock`` as one simulated process reads it."""

    def __init__(self, process: Process) -> None:
        self.process = process

    def now(self) -> float:
        return self.process.monotonic()


class ProcessWallClock:
    """``WallClock`` as one simulated process reads it."""

    def __init__(self, process: Process) -> None:
        self.process = process

    def now(self) -> float:
        return self.process.wall()

    async def sleep(self, seconds: float, stop: asyncio.Event, *events: asyncio.Event) -> None:
        waiters = [asyncio.ensure_future(e.wait()) for e in (stop, *events)]
        try:
            await asyncio.wait(waiters, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
