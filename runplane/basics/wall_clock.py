"""Time as a service reads it: wall time (the current unix time, and sleeping for a span of it) and
monotonic time (for deadlines and timeouts).

Services that act at wall-clock instants (a queuer worker firing at a cron minute) take a
``WallClock``, and services that time things out (the leader's heartbeat deadlines) a
``MonotonicClock``, so that tests and the deterministic simulator can move time on instead of
waiting for it; production uses ``SYSTEM_CLOCK`` and ``SYSTEM_MONOTONIC``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from runplane.basics.supervise import wait_any


class WallClock(Protocol):
    def now(self) -> float:
        """Unix seconds."""
        ...

    async def sleep(self, seconds: float, stop: asyncio.Event, *events: asyncio.Event) -> None:
        """Return once ``seconds`` of this clock have passed, or as soon as ``stop`` or one of
        ``events`` is set."""
        ...


class MonotonicClock(Protocol):
    def now(self) -> float:
        """Seconds from an arbitrary origin; never goes back."""
        ...


class SystemMonotonic:
    """The machine's monotonic clock."""

    def now(self) -> float:
        return time.monotonic()


SYSTEM_MONOTONIC = SystemMonotonic()


class SystemClock:
    """The machine's clock."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float, stop: asyncio.Event, *events: asyncio.Event) -> None:
        await wait_any(stop, *events, timeout=seconds)


SYSTEM_CLOCK = SystemClock()
