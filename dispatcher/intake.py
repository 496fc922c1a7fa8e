"""How many runs a dispatcher takes from the pickup queue now: what its cluster can start soon.

Several dispatchers, one per cluster, consume the one pickup queue. A Pickup names accounts, and one
Pickup can name the whole top of the hour, so the bound is on runs, not on messages: a dispatcher
holds (has moved to starting and not launched yet) at most

    bound = min(room, max(1, ceil(create_rate * horizon)))

runs, where ``room`` is what its cluster has left (``kubernetes.capacity`` minus the active run Pods;
no limit without a capacity), ``create_rate`` the runs per second it launched, measured over each
batch of its own launches (an EWMA), and ``horizon`` is ``kubernetes.intake_horizon``. A dispatch
pass starts at most ``bound - held`` runs; the accounts whose due runs it leaves queued get a Pickup
again at once, before it launches, so a dispatcher of another cluster with credit takes them. A
batch that finds no credit waits for some up to ``horizon`` and then hands all its accounts back the
same way. So a cluster whose API is slow (its launches take long, its rate falls) or that is full
keeps less of the peak, and the others take the rest; the run's compare-and-set (queued → starting)
keeps a run from starting twice whichever dispatcher reads it.

No I/O here: the dispatcher hands :class:`Intake` each batch's count and duration, and a ``room`` callable.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

from runplane.adapters import instruments

RATE_WEIGHT = 0.5  # of the newest batch's rate in the EWMA: a slowing cluster sheds within a batch or two
SHORTEST_BATCH = 0.001  # seconds: a batch timed shorter than this is timed this long
LOOK_AGAIN = 0.2  # seconds between looks at the room while waiting for credit


@dataclass(slots=True)
class CreateRate:
    """Runs launched per second: an EWMA over batches of launches, starting from a prior."""

    per_second: float
    weight: float = RATE_WEIGHT

    def observe(self, launched: int, seconds: float) -> float:
        """Fold in one batch: ``launched`` runs got a runner in ``seconds`` of wall time."""
        sample = launched / max(SHORTEST_BATCH, seconds)
        self.per_second = self.weight * sample + (1.0 - self.weight) * self.per_second
        return self.per_second


def intake_bound(*, room: int | None, rate: float, horizon: float) -> int:
    """Runs a dispatcher may hold: what it creates in ``horizon`` seconds at ``rate`` (at least one),
    within the ``room`` its cluster has left (None: no limit)."""
    by_rate = max(1, math.ceil(rate * horizon))
    return by_rate if room is None else max(0, min(room, by_rate))


class Intake:
    """A dispatcher's credit of runs: taken before a pass, given back for what the pass did not
    start, settled when the pass's launches are done. One per dispatcher process (its consumers share it)."""

    def __init__(
        self, *, rate: float, horizon: float, room: Callable[[], int | None] = lambda: None, cluster: str = ""
    ) -> None:
        self.rate = CreateRate(rate)
        self.horizon = horizon
        self._room = room
        self._labels = {"cluster": cluster}
        self.held = 0
        self._changed = asyncio.Event()

    def bound(self) -> int:
        return intake_bound(room=self._room(), rate=self.rate.per_second, horizon=self.horizon)

    def credit(self) -> int:
        return max(0, self.bound() - self.held)

    def take(self) -> int:
        """Take the whole credit now (0 when there is none)."""
        bound = self.bound()
        taken = max(0, bound - self.held)
        self.held += taken
        instruments.intake_bound.set(bound, self._labels)
        return taken

    async def take_within(self, seconds: float) -> int:
        """:meth:`take`, waiting up to ``seconds`` for credit to free; 0 if none did."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            taken = self.take()
            left = deadline - loop.time()
            if taken or left <= 0:
                return taken
            self._changed.clear()
            # Look again after a while even without a launch of ours ending: the room changes on its own.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, LOOK_AGAIN))

    def give_back(self, runs: int) -> None:
        """Credit taken for runs a pass did not start."""
        self._release(runs)

    def launched(self, held: int, *, started: int, seconds: float) -> None:
        """A batch of ``held`` runs went through their launches in ``seconds``; ``started`` got a runner."""
        self.rate.observe(started, seconds)
        instruments.create_rate.set(self.rate.per_second, self._labels)
        self._release(held)

    def _release(self, runs: int) -> None:
        self.held = max(0, self.held - runs)
        self._changed.set()
