"""The cron heap: the jobs a worker owns, ordered by their next fire time.

Per-job state is kept small (a ``__slots__`` object, interned cron and zone strings, one heap
tuple): a worker holds hundreds of thousands of jobs. Next fire times are computed on demand by
``runplane.basics.cron`` (cached per expression), never held as per-job iterators.

Heap entries are ``(due_ts, job_id)``: a fire is due its job's jitter offset after the cron's instant
(``runplane.basics.jitter``; 0 without jitter). The fire keeps the cron's instant (``fire_ts``: its
idempotency key, the schedule in force at it); only when it is taken off the heap moves. An entry
whose job is gone or was rescheduled is skipped when it reaches the top (lazy deletion), so updates
and revokes are O(1).
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from runplane.basics.cron import NeverFires, next_fire, previous_fire
from runplane.basics.jitter import jitter_offset
from runplane.basics.ownership import job_digest


class OwnedJob:
    """What a worker needs to schedule one job (everything else is re-read from Postgres at fire)."""

    __slots__ = ("cron", "grace", "job_id", "last_fire", "next_fire", "offset", "timezone", "version")

    def __init__(  # noqa: PLR0917
        self, job_id: int, version: int, cron: str, timezone: str, grace: int, next_fire: int, offset: int = 0
    ) -> None:
        self.job_id = job_id
        self.version = version
        self.cron = cron
        self.timezone = timezone
        self.grace = grace
        self.next_fire = next_fire
        self.offset = offset  # its jitter: each fire is due this many seconds after the cron's instant
        self.last_fire: int | None = None  # the newest fire taken off the heap for this job

    @property
    def next_due(self) -> int:
        """When the pending fire is due: its instant plus the job's jitter offset."""
        return self.next_fire + self.offset


@dataclass(frozen=True, slots=True)
class Definition:
    """A job's schedule as the orchestrator sent it."""

    job_id: int
    version: int
    cron: str
    timezone: str
    missed_run_grace_seconds: int
    jitter_seconds: int = 0
    catchup_window_seconds: int = 0  # fires missed longer than the grace are still queued this far back
    catchup_all: bool = False  # every missed fire within the window, not only the newest

    @property
    def offset(self) -> int:
        return jitter_offset(self.job_id, self.jitter_seconds)


class Due(NamedTuple):
    """One fire taken off the heap, with the schedule it was computed from: Postgres queues its run
    only when that schedule is the one in force at ``fire_ts``; the run is due ``offset`` seconds later."""

    job_id: int
    fire_ts: int
    cron: str
    timezone: str
    offset: int = 0


def missed_fire(defn: Definition, *, last_fire_ts: int, now: float) -> int | None:
    """The newest fire at or before ``now`` that is after ``last_fire_ts`` and within the job's
    missed-run grace; None when there is none (grace 0 skips missed fires)."""
    if defn.missed_run_grace_seconds <= 0:
        return None
    prev = previous_fire(defn.cron, defn.timezone, now)
    if prev is None or prev <= last_fire_ts or now - prev > defn.missed_run_grace_seconds:
        return None
    return prev


# At most this many missed fires of one job are recorded as given up when a new owner takes it; older
# ones are not looked for (a long outage of an every-minute job would otherwise mean thousands).
MISSED_RECORD_LIMIT = 100


def catchup_fire(defn: Definition, *, last_fire_ts: int, upcoming: int, now: float) -> int | None:
    """The first missed fire a new owner still queues: before ``upcoming``, after ``last_fire_ts``
    and within the grace or the catch-up window, whichever reaches further back; the newest such
    fire, or with ``catchup_all`` the oldest (``reschedule`` then walks through the rest, each due
    at once). None when there is none."""
    if defn.catchup_window_seconds <= 0 and not defn.catchup_all:
        missed = missed_fire(defn, last_fire_ts=last_fire_ts, now=now)  # the grace alone, as before
        return missed if missed is not None and missed < upcoming else None
    reach = max(defn.missed_run_grace_seconds, defn.catchup_window_seconds)
    first: int | None = None
    fire = previous_fire(defn.cron, defn.timezone, upcoming - 1)
    while fire is not None and fire > last_fire_ts and now - fire <= reach:
        first = fire
        if not defn.catchup_all:
            break
        fire = previous_fire(defn.cron, defn.timezone, fire - 1)
    return first


class MissedFire(NamedTuple):
    """A fire a new owner gives up, with the schedule it was computed from (Postgres records it only
    if that schedule was in force then) and what the record tells the user."""

    job_id: int
    fire_ts: int
    cron: str
    timezone: str
    detail: str


def given_up(defn: Definition, *, last_fire_ts: int, first: int, now: float) -> list[MissedFire]:
    """The fires after ``last_fire_ts`` and before ``first`` (the job's next fire once taken) that
    the new owner will not queue, newest first, at most ``MISSED_RECORD_LIMIT``: recorded as skipped
    occurrences (Postgres keeps only those with no run, of the schedule in force). With ``catchup_all``
    every fire from the first on is queued, so all of them are before it; without, the newest alone
    is queued and the older ones in the window are given up too. ``last_fire_ts`` 0 (unknown) gives
    nothing up: nothing says those fires were not queued."""
    if last_fire_ts <= 0:
        return []
    reach = max(defn.missed_run_grace_seconds, defn.catchup_window_seconds)
    fires: list[MissedFire] = []
    fire = previous_fire(defn.cron, defn.timezone, first - 1)
    while fire is not None and fire > last_fire_ts and len(fires) < MISSED_RECORD_LIMIT:
        late = math.floor(now - fire)
        if late > reach:
            why = (
                f"{late} s late, beyond the job's catch-up window ({defn.catchup_window_seconds} s) and "
                f"missed-run grace ({defn.missed_run_grace_seconds} s)"
            )
        else:
            why = f"{late} s late; a newer missed occurrence was queued instead (catch-up of every missed fire is off)"
        detail = f"Missed: no worker queued this occurrence while runplane or the account was down; found {why}"
        fires.append(MissedFire(defn.job_id, fire, defn.cron, defn.timezone, detail))
        fire = previous_fire(defn.cron, defn.timezone, fire - 1)
    return fires


class CronHeap:
    """Owned jobs by next fire time."""

    def __init__(self) -> None:
        self._jobs: dict[int, OwnedJob] = {}
        self._heap: list[tuple[int, int]] = []
        self.digest = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._jobs

    def get(self, job_id: int) -> OwnedJob | None:
        return self._jobs.get(job_id)

    def job_ids(self) -> list[int]:
        return list(self._jobs)

    def jobs(self) -> Iterable[OwnedJob]:
        """The owned jobs, each with its pending fire (for the forecast of demand)."""
        return self._jobs.values()

    def assign(self, defn: Definition, *, last_fire_ts: int, now: float) -> int:
        """Take (or replace) a job; returns its next fire, which is the missed fire when one is due.

        A schedule that never fires raises ``NeverFires`` and leaves the heap as it was."""
        # A fire in this very second counts, and so does an earlier one whose offset is still ahead.
        upcoming = next_fire(defn.cron, defn.timezone, now - 1 - defn.offset)
        missed = catchup_fire(defn, last_fire_ts=last_fire_ts, upcoming=upcoming, now=now)
        first = upcoming if missed is None else missed
        self._put(defn, first)
        return first

    def update(self, defn: Definition, *, now: float) -> int:
        """Apply a changed definition; a job whose schedule is unchanged keeps its pending fire.

        A schedule that never fires raises ``NeverFires`` and leaves the heap as it was."""
        current = self._jobs.get(defn.job_id)
        if current is not None and current.cron == defn.cron and current.timezone == defn.timezone:
            fire = current.next_fire  # a changed jitter moves only when it is due (``_put``)
        else:
            fire = next_fire(defn.cron, defn.timezone, now - 1 - defn.offset)
            if current is not None and current.last_fire is not None:
                # A fire taken under the old schedule that came late (the worker stood still, the
                # Update waited behind it) was refused by Postgres if the new one was in force by
                # then: the new schedule's own occurrence at or after it, within grace, is taken
                # again (Postgres decides; a run queued already is one run by its key).
                missed = missed_fire(defn, last_fire_ts=current.last_fire - 1, now=now)
                if missed is not None and missed < fire:
                    fire = missed
        self._put(defn, fire)
        return fire

    def remove(self, job_id: int) -> bool:
        job = self._jobs.pop(job_id, None)
        if job is None:
            return False
        self.digest ^= job_digest(job_id, job.version)
        return True

    def clear(self) -> None:
        self._jobs.clear()
        self._heap.clear()
        self.digest = 0

    def next_due(self) -> int | None:
        """When the earliest pending fire is due, or None when nothing is owned."""
        while self._heap:
            due_ts, job_id = self._heap[0]
            job = self._jobs.get(job_id)
            if job is not None and job.next_due == due_ts:
                return due_ts
            heapq.heappop(self._heap)  # stale entry
        return None

    def pop_due(self, now: float) -> list[Due]:
        """Every fire due at ``now``, with its schedule; ``reschedule`` moves each job to its following
        fire once the tick is queued."""
        due: list[Due] = []
        heap = self._heap
        jobs = self._jobs
        while heap and heap[0][0] <= now:
            due_ts, job_id = heapq.heappop(heap)
            job = jobs.get(job_id)
            if job is None or job.next_due != due_ts:
                continue
            due.append(Due(job_id, job.next_fire, job.cron, job.timezone, job.offset))
        # Rescheduling after collecting keeps the insert of this tick from waiting on cron maths.
        return due

    def still_due(self, due: list[Due]) -> list[Due]:
        """Those of ``due`` (taken by pop_due) that were neither revoked, rescheduled nor given another
        schedule since (a new cron may keep the same next fire: that fire is taken again, under it)."""
        jobs = self._jobs
        return [
            d
            for d in due
            if (job := jobs.get(d.job_id)) is not None
            and job.next_fire == d.fire_ts
            and job.cron == d.cron
            and job.timezone == d.timezone
        ]

    def reschedule(self, due: list[Due]) -> list[tuple[OwnedJob, NeverFires]]:
        """Push the fire after each of ``due`` (called once the tick's runs are queued).

        A job with no fire after this one is taken off the heap and returned with the reason: it is
        that job's error, for the caller to record, and never stops the others."""
        never: list[tuple[OwnedJob, NeverFires]] = []
        for job_id, fire, cron, timezone, _ in due:
            job = self._jobs.get(job_id)
            if job is None or job.next_fire != fire or job.cron != cron or job.timezone != timezone:
                continue  # revoked or updated meanwhile
            job.last_fire = fire
            try:
                job.next_fire = next_fire(job.cron, job.timezone, fire)
            except NeverFires as exc:
                self.remove(job_id)
                never.append((job, exc))
                continue
            heapq.heappush(self._heap, (job.next_due, job_id))
        self._compact()
        return never

    def _put(self, defn: Definition, fire: int) -> None:
        old = self._jobs.get(defn.job_id)
        if old is not None:
            self.digest ^= job_digest(defn.job_id, old.version)
        job = self._jobs[defn.job_id] = OwnedJob(
            defn.job_id,
            defn.version,
            sys.intern(defn.cron),
            sys.intern(defn.timezone),
            defn.missed_run_grace_seconds,
            fire,
            defn.offset,
        )
        if old is not None:
            job.last_fire = old.last_fire
        self.digest ^= job_digest(defn.job_id, defn.version)
        heapq.heappush(self._heap, (job.next_due, defn.job_id))
        self._compact()

    def _compact(self) -> None:
        # Updates leave stale entries behind; rebuild when they outnumber the live ones.
        if len(self._heap) > 2 * len(self._jobs) + 1024:
            self._heap = [(job.next_due, job.job_id) for job in self._jobs.values()]
            heapq.heapify(self._heap)
