"""Term and logical clock: the order of everything the orchestrator says.

The leader increments and persists its term on election and counts a clock from 0; every message
carries ``(term, clock)``. A receiver applies a message for a job only when its stamp is newer than
the last it applied for that job, and never one from a term older than the newest it has seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import total_ordering

from runplane.v1 import bus_pb2


@total_ordering
@dataclass(frozen=True, slots=True)
class Stamp:
    term: int
    clock: int

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Stamp):
            return NotImplemented
        return (self.term, self.clock) < (other.term, other.clock)

    def to_proto(self) -> bus_pb2.Stamp:
        return bus_pb2.Stamp(term=self.term, clock=self.clock)

    @classmethod
    def from_proto(cls, msg: bus_pb2.Stamp) -> Stamp:
        return cls(msg.term, msg.clock)


ZERO = Stamp(0, 0)


@dataclass
class LogicalClock:
    """The leader's side: one term, a clock incremented per message."""

    term: int
    clock: int = 0

    def tick(self) -> Stamp:
        self.clock += 1
        return Stamp(self.term, self.clock)


@dataclass
class StampGate:
    """The receiver's side: decides whether a message is new enough to apply."""

    newest_term: int = 0
    applied: dict[int, Stamp] = field(default_factory=dict)
    floor: Stamp = ZERO  # nothing at or below it is admitted, for any job (see ``void_before``)
    newest: Stamp = ZERO  # the newest stamp admitted or voided before: what the holder has heard up to

    def observe_term(self, term: int) -> bool:
        """Note a term; False when it is older than the newest seen (drop the message)."""
        if term < self.newest_term:
            return False
        self.newest_term = term
        return True

    def admit(self, job_id: int, stamp: Stamp) -> bool:
        """True (and recorded) when ``stamp`` is newer than everything applied for ``job_id``."""
        if not self.observe_term(stamp.term):
            return False
        last = self.applied.get(job_id)
        if stamp <= self.floor or (last is not None and stamp <= last):
            return False
        self.applied[job_id] = stamp
        self.newest = max(self.newest, stamp)
        return True

    def void_before(self, stamp: Stamp) -> bool:
        """Refuse, from now on, every message stamped before ``stamp`` for any job, including those of
        jobs never seen (an Assign still on its way); False when ``stamp``'s term is older than the newest."""
        if not self.observe_term(stamp.term):
            return False
        self.floor = max(self.floor, stamp)
        self.newest = max(self.newest, stamp)
        return True

    def restore(self, job_id: int, stamp: Stamp | None) -> None:
        """Undo an ``admit`` whose effect was undone: ``stamp`` is what was applied before (None: nothing)."""
        if stamp is None:
            self.applied.pop(job_id, None)
        else:
            self.applied[job_id] = stamp

    def forget(self, job_id: int) -> None:
        self.applied.pop(job_id, None)
