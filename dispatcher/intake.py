"""How many runs a dispatcher takes from the pickup queue now: what its cluster can start soon.

Several dispatchers, one per cluster, consume the one pickup queue. A Pickup names accounts, and one
Pickup can name the whole top of the hour, so the bound is on runs, not on messages: a dispatcher
holds (has moved to starting and not launched yet) at most

    bound = min(room, max(1, ceil(create_rate * horizon)))

runs, where ``room`` is what its cluster has left (``kubernetes.capacity`` minus the active run Pods;
no limit without a capacity), ``create_rate`` the runs per second its own launches got a runner
(an EWMA over the time it has launches in flight), and ``horizon`` is ``kubernetes.intake_horizon``.
A local dispatcher's cluster is its machine: its room is ``dispatcher.local_capacity`` minus the
runners it gave a run that are still alive; a fork takes milliseconds, so the room is what binds.
A dispatch pass starts at most ``bound - held`` runs; the accounts whose due runs it leaves queued
get a Pickup again at once, before it launches, so a dispatcher of another cluster with credit takes
them. Each launch that ends frees its run's credit; a batch waits for at least half the bound to be
free (up to ``horizon``), then takes what there is, or hands all its accounts back the same way. So
a cluster whose API is slow (its launches take long, its rate falls) or that is full keeps less of
the peak, and the others take the rest; the run's compare-and-set (queued → starting)
keeps a run from starting twice whichever dispatcher reads it. Where the room has a known size with
nothing running (``full``, a local machine's capacity), a batch waits for half of that instead of
half of what is left, so a full machine takes runs in batches rather than one per runner that exits.

No I/O here: the dispatcher tells :class:`Intake` when launches start and end (with the time), and
gives it a ``room`` callable.
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
SAMPLE_SECONDS = 1.0  # of launches in flight, at most, between two samples of the create rate


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
    """A dispatcher's credit of runs: taken before a pass, given back for what the pass did not start,
    and freed run by run as launches end. One per dispatcher process (its consumers share it).

    The create rate is measured while launches are in flight: runs that got a runner over the seconds
    with at least one launch under way, folded in at least every ``SAMPLE_SECONDS`` of that and
    whenever the last launch ends, so batches that overlap are measured together."""

    def __init__(
        self,
        *,
        rate: float,
        horizon: float,
        room: Callable[[], int | None] = lambda: None,
        full: int | None = None,
        cluster: str = "",
    ) -> None:
        self.rate = CreateRate(rate)
        self.horizon = horizon
        self._room = room
        self._full = full  # the room with nothing running, when it is known
        self._labels = {"cluster": cluster}
        self.held = 0
        self._launching = 0
        self._busy_since = 0.0  # when launches were last seen in flight with no sample since
        self._started = 0  # runs that got a runner since then
        self._changed = asyncio.Event()

    def bound(self) -> int:
        return intake_bound(room=self._room(), rate=self.rate.per_second, horizon=self.horizon)

    def batch(self) -> int:
        """The runs a batch waits for (half of them) before it takes what there is: the bound with nothing
        running where that is known, else the bound now."""
        if self._full is None:
            return self.bound()
        return intake_bound(room=self._full, rate=self.rate.per_second, horizon=self.horizon)

    def credit(self) -> int:
        return max(0, self.bound() - self.held)

    def take(self, *, at_least: int = 1) -> int:
        """Take the whole credit now if it is ``at_least`` runs; else take none (0)."""
        bound = self.bound()
        credit = max(0, bound - self.held)
        instruments.intake_bound.set(bound, self._labels)
        if credit < max(1, at_least):
            return 0
        self.held += credit
        return credit

    async def take_within(self, seconds: float, *, wanted: int | None = None) -> int:
        """Take the credit once it is half the batch or more (a pass over a few runs costs about what
        one over many does), or the ``wanted`` runs when fewer are asked for, waiting up to ``seconds``;
        then whatever there is (0: none)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            left = deadline - loop.time()
            half = (self.batch() + 1) // 2
            enough = half if wanted is None else min(wanted, half)
            taken = self.take(at_least=enough if left > 0 else 1)
            if taken or left <= 0:
                return taken
            self._changed.clear()
            # Look again after a while even without a launch of ours ending: the room changes on its own.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, LOOK_AGAIN))

    def give_back(self, runs: int) -> None:
        """Credit taken for runs that will not be launched (a pass did not start them)."""
        self.held = max(0, self.held - runs)
        self._changed.set()

    def launching(self, runs: int, now: float) -> None:
        """``runs`` of the credit go to their launches at ``now`` (monotonic seconds)."""
        if runs <= 0:
            return
        if self._launching == 0:
            self._busy_since = now
        self._launching += runs

    def abandon(self, runs: int) -> None:
        """``runs`` that went to their launches will not be launched (cancelled): their credit is freed unmeasured."""
        self._launching = max(0, self._launching - runs)
        self.give_back(runs)

    def launch_ended(self, *, started: bool, now: float) -> None:
        """One launch is over; ``started``: its run got a runner. Frees its credit."""
        self._launching = max(0, self._launching - 1)
        self._started += started
        busy = now - self._busy_since
        if self._launching == 0 or busy >= SAMPLE_SECONDS:
            self.rate.observe(self._started, busy)
            instruments.create_rate.set(self.rate.per_second, self._labels)
            self._started, self._busy_since = 0, now
        self.give_back(1)
