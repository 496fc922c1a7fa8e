"""A wall clock a test moves by hand, for services that act at wall-clock instants."""

from __future__ import annotations

import asyncio
import math

from runplane.basics.supervise import wait_any


class FakeClock:
    """Stands still until ``advance_to``; a sleeper wakes when the clock reaches its deadline.

    ``sleepers_until`` is the test's sync point: a service parked until an instant has done
    everything it does before that instant.
    """

    def __init__(self, start: float) -> None:
        self._now = start
        self._moved = asyncio.Event()
        self._deadlines: list[float] = []

    def now(self) -> float:
        return self._now

    def advance_to(self, moment: float) -> None:
        assert moment >= self._now, f"a wall clock does not go back ({moment} < {self._now})"
        self._now = moment
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    def sleepers_until(self, moment: float) -> int:
        """How many sleepers on this clock wait until ``moment``."""
        return sum(math.isclose(deadline, moment, abs_tol=1e-3) for deadline in self._deadlines)

    async def sleep(self, seconds: float, stop: asyncio.Event, *events: asyncio.Event) -> None:
        deadline = self._now + seconds
        self._deadlines.append(deadline)
        try:
            while self._now < deadline and not await wait_any(stop, *events, self._moved):
                if any(event.is_set() for event in events):
                    return
        finally:
            self._deadlines.remove(deadline)
