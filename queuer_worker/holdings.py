"""What a queuer worker holds, and what each of the orchestrator's messages does to it: the worker's
decisions, without I/O.

``Holdings`` takes a message (and the time) and answers with what to do about it: the Claimed to
send, the schedules to deactivate, the heartbeat to send. ``QueuerWorker`` (``worker.py``) does the
sending and the storing, and tells ``Holdings`` what came of it (a Claimed that could not be sent).

Every message is gated by ``(term, clock)``: a job's state changes only for a stamp newer than the
last one applied to it, and nothing from a term older than the newest seen is applied.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from queuer_worker.heap import CronHeap, Definition, MissedFire, given_up
from runplane.basics.cron import NeverFires
from runplane.basics.stamps import Stamp, StampGate
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)

# Heartbeats that say "registering" after a start or a drop-everything, so one lost message (no
# leader at that moment) does not leave the worker unknown.
REGISTERING_BEATS = 3


@dataclass
class Taken:
    """What an Assign did: the Claimed to send (None: nothing taken), and the schedules found never
    to fire (their jobs are deactivated, with the reason)."""

    claimed: bus_pb2.Claimed | None
    never_fires: list[Definition]
    # What the gate had applied before, for each job taken anew: to undo it if the claim fails.
    before: dict[int, Stamp | None] = field(default_factory=dict)
    # Fires the jobs taken missed and the worker gives up: recorded as skipped occurrences.
    missed: list[MissedFire] = field(default_factory=list)


class Holdings:
    def __init__(self, worker_id: str, heap: CronHeap | None = None) -> None:
        self.worker_id = worker_id
        self.heap = heap if heap is not None else CronHeap()
        self.gate = StampGate()
        self.registering_beats = REGISTERING_BEATS
        self.releases: list[bus_pb2.Claimed] = []  # Claimed(released) not yet confirmed

    # -- messages -----------------------------------------------------------------------------------

    def assign(self, message: bus_pb2.Assign, now: float) -> Taken:
        stamp = Stamp.from_proto(message.stamp)
        taken = Taken(claimed=None, never_fires=[])
        if not self.gate.observe_term(stamp.term):
            return taken
        job_ids: list[int] = []
        for assignment in message.jobs:
            job = assignment.job
            job_stamp = Stamp.from_proto(assignment.stamp) if assignment.HasField("stamp") else stamp
            previous = self.gate.applied.get(job.job_id)
            if not self.gate.admit(job.job_id, job_stamp):
                if self.gate.applied.get(job.job_id) == job_stamp and job.job_id in self.heap:
                    # This very Assign again (its Claimed was not sent: the broker went away while the
                    # handler ran, and the message came back): claim again what it gave.
                    job_ids.append(job.job_id)
                continue
            if job.active and job.cron:
                defn = definition(job)
                try:
                    first = self.heap.assign(defn, last_fire_ts=assignment.last_fire_ts, now=now)
                    taken.missed += given_up(defn, last_fire_ts=assignment.last_fire_ts, first=first, now=now)
                except NeverFires:
                    self.heap.remove(job.job_id)
                    taken.never_fires.append(definition(job))
                    continue
                job_ids.append(job.job_id)
                taken.before[job.job_id] = previous
            else:
                self.heap.remove(job.job_id)
        if job_ids:
            taken.claimed = bus_pb2.Claimed(worker_id=self.worker_id, stamp=message.stamp, job_ids=job_ids)
        return taken

    def claim_failed(self, taken: Taken) -> None:
        """The Claimed of ``taken`` could not be sent: the Assign goes back to its queue and may go to
        another worker, who claims it, so hold none of it meanwhile (taken here again, it is applied
        again). The Claimed may still have reached the leader (routed, no confirm): say, with the next
        heartbeats, that it was let go."""
        assert taken.claimed is not None
        for job_id in taken.claimed.job_ids:
            self.heap.remove(job_id)
            if job_id in taken.before:
                self.gate.restore(job_id, taken.before[job_id])
        released = bus_pb2.Claimed()
        released.CopyFrom(taken.claimed)
        released.released = True
        self.releases.append(released)

    def update(self, message: bus_pb2.Update, now: float) -> tuple[bool, Definition | None]:
        """(applied, a schedule found never to fire)."""
        assignment = message.job
        stamp = Stamp.from_proto(assignment.stamp) if assignment.HasField("stamp") else Stamp.from_proto(message.stamp)
        job = assignment.job
        if not self.gate.admit(job.job_id, stamp):
            return False, None
        if not (job.active and job.cron):
            self.heap.remove(job.job_id)
            return True, None
        try:
            if job.job_id in self.heap:
                self.heap.update(definition(job), now=now)
            else:
                # The orchestrator believes this worker owns the job: hold it.
                self.heap.assign(definition(job), last_fire_ts=assignment.last_fire_ts, now=now)
        except NeverFires:
            self.heap.remove(job.job_id)
            return True, definition(job)
        return True, None

    def revoke(self, message: bus_pb2.Revoke) -> bool:
        """Let go of the Revoke's jobs, or of everything (``drop_all``); False when it was refused."""
        stamp = Stamp.from_proto(message.stamp)
        if message.drop_all:
            applied = self.gate.void_before(stamp)
            if applied:
                self._drop_older_than(stamp)
            return applied
        for job_id in message.job_ids:
            if self.gate.admit(job_id, stamp):
                self.heap.remove(job_id)
        return True

    def _drop_older_than(self, stamp: Stamp) -> None:
        """Drop every job assigned before ``stamp`` (the worker was declared dead) and re-register.

        The gate refuses older stamps from now on: an Assign of the shared queue taken after this
        (sent before the worker was declared dead, and given to others since) would otherwise be held
        here unknown to the leader, who refused its claim while the worker was dead."""
        dropped = 0
        for job_id in self.heap.job_ids():
            applied = self.gate.applied.get(job_id)
            if applied is None or applied < stamp:
                self.heap.remove(job_id)
                dropped += 1
        self.registering_beats = REGISTERING_BEATS
        log.warning("told to drop everything", extra={"worker_id": self.worker_id, "jobs_dropped": dropped})

    # -- heartbeats ---------------------------------------------------------------------------------

    def next_release(self) -> bus_pb2.Claimed | None:
        """The oldest Assign let go after its Claimed got no confirm, to tell the leader of until it
        hears; a job taken again under that very Assign since is held, and left out. None: nothing
        (left) to tell. ``release_sent`` once it is sent."""
        while self.releases:
            release = self.releases[0]
            stamp = Stamp.from_proto(release.stamp)
            let_go = [j for j in release.job_ids if not (j in self.heap and self.gate.applied.get(j) == stamp)]
            if let_go:
                del release.job_ids[:]
                release.job_ids.extend(let_go)
                return release
            self.releases.pop(0)
        return None

    def release_sent(self) -> None:
        self.releases.pop(0)

    def heartbeat(self, now: float) -> bus_pb2.Heartbeat:
        """The beat to send now; ``beat_sent`` once it is sent."""
        return bus_pb2.Heartbeat(
            worker_id=self.worker_id,
            newest_term=self.gate.newest_term,
            jobs_owned=len(self.heap),
            sent_at_ms=int(now * 1000),
            registering=self.registering_beats > 0,
            owned_digest=self.heap.digest,
            dropped=self.gate.floor.to_proto(),
            applied=self.gate.newest.to_proto(),
        )

    def beat_sent(self, beat: bus_pb2.Heartbeat) -> None:
        if beat.registering:
            self.registering_beats -= 1


def definition(job: bus_pb2.JobDefinition) -> Definition:
    return Definition(
        job.job_id,
        job.version,
        job.cron,
        job.timezone or "UTC",
        job.missed_run_grace_seconds,
        job.jitter_seconds,
        job.catchup_window_seconds,
        job.catchup_all,
    )
