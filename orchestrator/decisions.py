"""The leader's decisions about its workers, without I/O.

Each function takes what the leader knows (its view of each worker, ownership rows it read, the time
on its monotonic clock) and answers with what to do; the leader's sections (``liveness``, ``inbox``)
read and write Postgres and send the messages. They change only the leader's own view of the
workers (``WorkerInfo``) and its logical clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.rows import Ownership
from runplane.basics.stamps import ZERO, LogicalClock, Stamp
from runplane.v1 import bus_pb2


@dataclass
class WorkerInfo:
    alive: bool
    last_seen: float  # monotonic time of its last heartbeat (or of this leader's start)
    alive_since: float
    jobs_owned: int = 0
    owned_digest: int = 0
    drifted_since: float | None = None  # monotonic time since its digest has differed from its rows
    # The newest stamp of what it was told (an Assign on its own queue, an Update, a Revoke) and when:
    # its digest is compared only when its beat says it had heard that, or it has had time to.
    told: Stamp = ZERO
    told_at: float = 0.0
    heard: Stamp = ZERO  # the newest stamp it had applied when it sent its last beat
    # While it is dead: the one stamp of every drop-everything sent to it for this death (so a late
    # copy drops nothing it was given after it re-registered), and the jobs whose claims it sent
    # meanwhile were refused, each with the stamp of its Revoke, taken when the claim was refused
    # (sent once it has re-registered and hears its queue again; see Inbox._refuse_claim).
    drop_stamp: Stamp | None = None
    refused: dict[int, Stamp] = field(default_factory=dict)
    # The newest drop-everything it was sent, kept across re-registering: it drops every job it took
    # from an Assign stamped at or before it, so a claim of one is refused (see ``claim_refused``).
    floor: Stamp = ZERO
    buried: bool = False  # declared dead by this leader (its queue deleted, its jobs reassigned)


# -- liveness -----------------------------------------------------------------------------------------


def silent_workers(
    workers: Mapping[str, WorkerInfo], *, now: float, late_tick: bool, hearing: bool, interval: float, dead_after: float
) -> list[str]:
    """The live workers silent for ``dead_after`` while the leader could hear them: to be declared dead.

    When the leader hears nobody — its bus is away (``hearing`` False), every live worker has missed
    two beats at once, or the leader itself did not run for a heartbeat interval (``late_tick``:
    frozen, starved) — the silence is the leader's own, not the workers' death: none is declared dead,
    and their deadlines start again now (DESIGN.md, "Exactly once, on time"). Otherwise an outage of
    the broker the beats travel on would bury every worker at once and put all their jobs on
    whichever beat first after it."""
    alive = [info for info in workers.values() if info.alive]
    newest_beat = max((info.last_seen for info in alive), default=now)
    if late_tick or not hearing or now - newest_beat > 2 * interval:
        for info in alive:
            info.last_seen = now
        return []
    return [w for w, i in workers.items() if i.alive and now - i.last_seen > dead_after]


def drifted(
    info: WorkerInfo, expected_digest: int, *, now: float, timeout: float, pending: bool, shared_pending: Stamp | None
) -> bool:
    """Whether what a worker holds has differed from what it owns for a claim timeout, with no message
    on its way that could explain it: the ownership digest's repair acts on it now.

    ``pending``: an Assign is pending for the worker; ``shared_pending``: the oldest Assign pending on
    the shared queue (the worker may hold it, its claim not in yet, when it had heard up to it).
    A beat counted before the worker had heard what it was told last, within a claim timeout of the
    telling, may be a beat built before a Revoke and delivered after it."""
    on_its_way = (
        pending
        or (shared_pending is not None and info.heard >= shared_pending)
        or (info.heard < info.told and now - info.told_at < timeout)
    )
    if not info.alive or on_its_way or info.owned_digest == expected_digest:
        info.drifted_since = None
        return False
    if info.drifted_since is None:
        info.drifted_since = now
        return False
    if now - info.drifted_since < timeout:
        return False
    info.drifted_since = None  # looked at again a claim timeout after the repair's Assign is claimed
    return True


# -- heartbeats ---------------------------------------------------------------------------------------


class Beat(enum.Enum):
    LIVE = "live"  # a live worker's beat: noted, nothing decided
    DROP_ALL = "drop all"  # declared dead or unknown: told to drop everything
    REGISTER = "register"  # registers (again)


def judge_beat(info: WorkerInfo | None, beat: bus_pb2.Heartbeat) -> Beat:
    """What a heartbeat means. A worker declared dead (or unknown) registers again only with a beat
    that says it is registering and that it applied the drop-everything sent for its death; any
    other beat of it, even a registering one sent before it heard of its death (it was starting, or
    had re-registered after an earlier death), is answered with the drop-everything."""
    if info is not None and info.alive:
        return Beat.LIVE
    if not beat.registering or not _dropped_as_told(info, beat):
        return Beat.DROP_ALL
    return Beat.REGISTER


def _dropped_as_told(info: WorkerInfo | None, beat: bus_pb2.Heartbeat) -> bool:
    if info is None or not info.buried:
        return True  # never declared dead
    return info.drop_stamp is not None and Stamp.from_proto(beat.dropped) >= info.drop_stamp


def registered(info: WorkerInfo | None, now: float) -> tuple[WorkerInfo, list[tuple[Stamp, list[int]]]]:
    """A worker's view once it registers, and the Revokes to send it first, oldest first: of the jobs
    whose claims were refused while it was dead (it may still hold what it took meanwhile), under the
    stamps taken when those claims were refused, newer than the Assigns it claimed and older than any
    sent for those jobs since (the shared queue may give it one of them again, which it keeps)."""
    refused, floor = (info.refused, info.floor) if info is not None else ({}, ZERO)
    by_stamp: dict[Stamp, list[int]] = {}
    for job_id, revoke_stamp in sorted(refused.items()):
        by_stamp.setdefault(revoke_stamp, []).append(job_id)
    return WorkerInfo(True, now, now, floor=floor), sorted(by_stamp.items())


# -- claims -------------------------------------------------------------------------------------------


def claim_refused(info: WorkerInfo | None, stamp: Stamp) -> bool:
    """A claim is refused from a worker not alive, or of an Assign stamped at or before its newest
    drop-everything (which made it drop that Assign; its two consumers run side by side, so the claim
    may come after it re-registered)."""
    return info is None or not info.alive or stamp <= info.floor


def claimed_by_another(rows: Iterable[Ownership], claimer: str, stamp: Stamp) -> list[Ownership]:
    """The jobs of this very Assign claimed already by another worker: the broker gave it out twice."""
    return [
        r
        for r in rows
        if r.state == "claimed" and r.worker_id not in (None, claimer) and Stamp(r.term, r.clock) == stamp
    ]


def revoke_stamps(
    rows: Iterable[Ownership], job_ids: list[int], stamp: Stamp, clock: LogicalClock
) -> dict[Stamp, list[int]]:
    """The stamps of the Revokes that take back ``job_ids``, claimed under ``stamp``: a job given out
    again on the shared queue since (its Assign resent, or its owner buried) is revoked one below
    that Assign, so the claimer keeps it if it is the one that takes it; any other job under one
    stamp taken now, before anything sent after (an Assign sent again for it included). Sending
    the pending Assign once more instead would make every late claim, queued behind others, send
    it again, and no claim would ever match."""
    rows = list(rows)
    plan: dict[Stamp, list[int]] = {}
    now: list[int] = []
    for job_id in job_ids:
        pending = next(
            (Stamp(r.term, r.clock) for r in rows if r.job_id == job_id and r.worker_id is None),
            None,
        )
        below = None if pending is None else Stamp(pending.term, pending.clock - 1)
        if below is not None and below > stamp:
            plan.setdefault(below, []).append(job_id)
        else:
            now.append(job_id)
    if now:
        plan.setdefault(clock.tick(), []).extend(now)
    return plan
