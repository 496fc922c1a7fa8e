"""The order a queuer worker acts in, seen from outside: terms only grow, and nothing older counts.

The checker keeps its own account of what each worker (one process, one memory) has been told and
judges every change the worker makes to its heap while it handles a message (a job taken, replaced
or let go) against the protocol's rules (DESIGN.md, "Term and logical clock"):

- once it has been told anything in a term, it acts on nothing from an older term;
- once it has been told to drop everything, it acts on nothing stamped at or before that;
- for one job, it never acts on a stamp older than one it already acted on.

Other rules back these up (the leader refuses a dead worker's claim; a deposed leader's writes are
fenced), so breaking one of them alone seldom loses or doubles a fire. The worker's own order is
what keeps a revived worker from briefly holding a job beside its owner; it is checked here, at
the moment it acts, not only by its consequences.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from google.protobuf.message import Message

from queuer_worker.heap import CronHeap, Definition
from runplane.basics.stamps import ZERO, Stamp
from runplane.v1 import bus_pb2


@dataclass(frozen=True)
class _Handling:
    order: WorkerOrder
    message: Message
    told: Stamp  # the message's own stamp
    seen_term: int  # the newest term the worker had been told of before this message
    floor: Stamp  # its newest drop-everything before this message


_HANDLING: ContextVar[_Handling | None] = ContextVar("handling", default=None)


@dataclass
class WorkerOrder:
    name: str
    violated: Callable[[str], None]
    seen_term: int = 0
    floor: Stamp = ZERO
    acted: dict[int, Stamp] = field(default_factory=dict)

    @contextlib.contextmanager
    def handling(self, message: Message) -> Iterator[None]:
        """While the worker handles ``message``: what it does to its heap is judged against it."""
        stamp = getattr(message, "stamp", None)
        if stamp is None or not message.HasField("stamp"):
            yield
            return
        told = Stamp.from_proto(stamp)
        handling = _Handling(self, message, told, self.seen_term, self.floor)
        if isinstance(message, bus_pb2.Revoke) and message.drop_all and told.term >= self.seen_term:
            self.floor = max(self.floor, told)
        self.seen_term = max(self.seen_term, told.term)
        token = _HANDLING.set(handling)
        try:
            yield
        finally:
            _HANDLING.reset(token)

    def acts(self, handling: _Handling, job_id: int) -> None:
        stamp = _stamp_for(handling.message, job_id, handling.told)
        what = f"{self.name} acted on job {job_id} under {stamp.term}.{stamp.clock}"
        last = self.acted.get(job_id)
        if stamp.term < handling.seen_term:
            self.violated(f"{what}, a term older than {handling.seen_term} it had been told of")
        elif stamp <= handling.floor:
            self.violated(f"{what}, at or before its drop-everything at {handling.floor.term}.{handling.floor.clock}")
        elif last is not None and stamp < last:
            self.violated(f"{what}, after acting on it under {last.term}.{last.clock}")
        self.acted[job_id] = stamp if last is None else max(last, stamp)


class WatchedHeap(CronHeap):
    """A worker's heap that reports each change made while a message of ``order``'s worker is handled
    (the fire loop's own rescheduling is not a message's doing, and is not reported)."""

    def __init__(self, order: WorkerOrder) -> None:
        super().__init__()
        self._order = order

    def _acting(self, job_id: int) -> None:
        handling = _HANDLING.get()
        if handling is not None and handling.order is self._order:
            self._order.acts(handling, job_id)

    def assign(self, defn: Definition, *, last_fire_ts: int, now: float) -> int:
        self._acting(defn.job_id)
        return super().assign(defn, last_fire_ts=last_fire_ts, now=now)

    def update(self, defn: Definition, *, now: float) -> int:
        self._acting(defn.job_id)
        return super().update(defn, now=now)

    def remove(self, job_id: int) -> bool:
        removed = super().remove(job_id)
        if removed:
            self._acting(job_id)
        return removed


def _stamp_for(message: Message, job_id: int, told: Stamp) -> Stamp:
    """The stamp under which ``message`` (stamped ``told``) speaks of ``job_id``."""
    if isinstance(message, bus_pb2.Assign):
        for assignment in message.jobs:
            if assignment.job.job_id == job_id and assignment.HasField("stamp"):
                return Stamp.from_proto(assignment.stamp)
    elif isinstance(message, bus_pb2.Update) and message.job.HasField("stamp"):
        return Stamp.from_proto(message.job.stamp)
    return told
