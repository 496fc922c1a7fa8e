"""The leader's state and what it sends to workers: Assign (recorded as pending before it goes out),
Update and Revoke, every message stamped ``(term, clock)``.

The leader is built in layers, one module per section of its work, each using only the ones
below it: ``decisions`` (what to do about a worker, without I/O) < ``outbox`` (state, messages to
workers) < ``liveness`` (the passing of time: dead
workers, lost Assigns, imbalance) < ``job_sync`` (job changes) < ``inbox`` (messages from workers)
< ``leader`` (start and the tasks it runs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from google.protobuf.message import Message

from orchestrator import metrics
from orchestrator.decisions import WorkerInfo
from orchestrator.ownership_store import OwnershipStore
from orchestrator.rows import Definition, JobState
from runplane.adapters.bus import Bus, Topology
from runplane.basics.settings import Settings
from runplane.basics.stamps import LogicalClock, Stamp
from runplane.basics.types import JOB_TYPE_TO_PROTO, JobType
from runplane.basics.wall_clock import SYSTEM_CLOCK, SYSTEM_MONOTONIC, MonotonicClock, WallClock
from runplane.v1 import bus_pb2

_PUBLISH_CONCURRENCY = 64


@dataclass(frozen=True)
class Outgoing:
    """An Assign recorded in ``job_ownership``, to be published."""

    queue: str
    rows: Sequence[Definition]
    stamp: Stamp
    fires_after: dict[int, int]


class Outbox:
    """What every section of the leader shares, and the messages it sends to workers."""

    def __init__(
        self,
        settings: Settings,
        store: OwnershipStore,
        bus: Bus,
        term: int,
        leader_id: str,
        *,
        wall_clock: WallClock = SYSTEM_CLOCK,
        monotonic: MonotonicClock = SYSTEM_MONOTONIC,
    ) -> None:
        self.settings = settings
        self.wall_clock = wall_clock  # the fire times a new owner queues after (``fires_after``)
        self.monotonic = monotonic  # heartbeats, deadlines and timeouts
        self.store = store
        self.bus = bus
        self.leader_id = leader_id
        self.clock = LogicalClock(term)
        self.topology = Topology(settings.bus_prefix)
        self.workers: dict[str, WorkerInfo] = {}
        self._lock = asyncio.Lock()
        self._dirty: set[int] = set()
        self._dirty_accounts: set[int] = set()
        self._changed = asyncio.Event()
        self._full_sync = asyncio.Event()
        self._sweeping = asyncio.Lock()  # held through a full sweep: one at a time
        cfg = settings.orchestrator
        self._dead_after = cfg.heartbeat_interval * cfg.dead_after_intervals
        self._last_tick = self.monotonic.now()  # the liveness loop's last look at the workers
        self._sole_consumer = True  # no other consumer on the orchestrator queue (a frozen predecessor's)
        metrics.observe(
            lambda: self.clock.term,
            lambda: {w: self.monotonic.now() - i.last_seen for w, i in self.workers.items() if i.alive},
            lambda: {w: i.jobs_owned for w, i in self.workers.items() if i.alive},
        )

    @property
    def term(self) -> int:
        return self.clock.term

    async def _assign(self, rows: Sequence[Definition], *, worker_id: str | None, fires_after: dict[int, int]) -> None:
        """Record and publish Assigns for ``rows`` (job definitions): on the shared queue, or on one
        worker's own queue when ``worker_id`` is given (rebalancing)."""
        await self._publish_assigns(await self._record_assigns(rows, worker_id=worker_id, fires_after=fires_after))

    async def _record_assigns(
        self, rows: Sequence[Definition], *, worker_id: str | None, fires_after: dict[int, int]
    ) -> list[Outgoing]:
        """Stamp and record the Assigns for ``rows`` as pending; the caller publishes them."""
        queue = self.topology.assign if worker_id is None else self.topology.worker(worker_id)
        size = self.settings.orchestrator.assign_batch_size
        outgoing: list[Outgoing] = []
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            stamp = self.clock.tick()
            self._told(worker_id, stamp)
            await self.store.upsert_pending(
                [r.job_id for r in batch],
                [r.version for r in batch],
                worker_id,
                stamp,
                int(self.wall_clock.now()),
            )
            outgoing.append(Outgoing(queue, batch, stamp, fires_after))
        return outgoing

    async def _publish_assigns(self, outgoing: list[Outgoing]) -> None:
        for assign in outgoing:
            await self.bus.publish(assign.queue, _assign_message(assign.rows, assign.stamp, assign.fires_after))
            metrics.jobs_assigned.add(len(assign.rows))

    async def _resend(self, job_ids: list[int], worker_id: str | None, *, revoke_elsewhere: bool = False) -> None:
        """Assign again, under a new stamp, those of ``job_ids`` still pending for ``worker_id`` (None:
        the shared queue); ``revoke_elsewhere``: every other live worker is told to let them go first.

        A new stamp, not the recorded one: a worker told to drop everything after the first Assign
        (it was declared dead meanwhile, e.g. while the broker was away) refuses that stamp as stale,
        and when every worker had been told so, the same message sent again would be refused
        forever. A late claim of the old stamp no longer matches and is revoked from its sender.
        """
        rows = await self.store.pending_definitions(job_ids, worker_id)
        if not rows:
            return
        revoke_stamp = self.clock.tick()  # before the Assign: a worker that takes it keeps it
        fires_after = {r.job_id: r.fires_after for r in rows}
        outgoing = await self._record_assigns(rows, worker_id=worker_id, fires_after=fires_after)
        if revoke_elsewhere:
            for other in self._alive():
                if other != worker_id:
                    await self._revoke(other, [r.job_id for r in rows], revoke_stamp)
        await self._publish_assigns(outgoing)

    async def _move(
        self, rows: Sequence[Definition], donor: str, *, to: str | None, fires_after: dict[int, int]
    ) -> None:
        """Give ``rows`` (job definitions ``donor`` owns) to ``to`` (None: whoever takes them from the
        shared queue): the new ownership is recorded, then ``donor`` is told to let go, then the
        Assign is sent.

        Recorded first, as every message the leader sends: a leader that stops between the two
        messages (a crash, or a stall past losing its lock, which makes its next write fail) leaves
        an Assign pending, which the next one sends again after revoking it from every other worker
        (``Liveness._resend_stale_pending``); sent first, the Revoke would leave the jobs owned by a
        worker that no longer holds them, firing nowhere until the ownership digest's repair. The
        Revoke is stamped before the Assign, so ``donor`` keeps the jobs if it is the one that takes
        them again from the shared queue."""
        revoke_stamp = self.clock.tick()
        outgoing = await self._record_assigns(rows, worker_id=to, fires_after=fires_after)
        await self._revoke(donor, [r.job_id for r in rows], revoke_stamp)
        await self._publish_assigns(outgoing)

    async def _revoke(self, worker_id: str, job_ids: list[int], stamp: Stamp | None = None) -> None:
        """Tell a live worker to let go of ``job_ids``; ``stamp``: one taken earlier, when that was decided
        (so the Revoke is older than any Assign of those jobs sent since, which it must not undo)."""
        info = self.workers.get(worker_id)
        if info is None or not info.alive:
            return  # its queue is gone; a returning worker is told to drop everything
        if stamp is None:
            stamp = self.clock.tick()
        self._told(worker_id, stamp)
        await self.bus.publish(self.topology.worker(worker_id), bus_pb2.Revoke(stamp=stamp.to_proto(), job_ids=job_ids))
        metrics.jobs_revoked.add(len(job_ids))

    async def _send_updates(self, rows: list[JobState]) -> None:
        """Send each owner the new definition of a job it owns (``rows``: jobs changed since it was sent one)."""
        sendable = [
            (r.worker_id, r.definition()) for r in rows if r.worker_id is not None and self._is_alive(r.worker_id)
        ]
        messages: list[tuple[str, Message]] = []
        for worker_id, definition in sendable:
            stamp = self.clock.tick()
            self._told(worker_id, stamp)
            assignment = bus_pb2.JobAssignment(job=_definition(definition), stamp=stamp.to_proto())
            messages.append((self.topology.worker(worker_id), bus_pb2.Update(stamp=stamp.to_proto(), job=assignment)))
        await self._publish_many(messages)
        if sendable:
            await self.store.sent_versions(
                [d.job_id for _, d in sendable], [d.version for _, d in sendable], int(self.wall_clock.now())
            )
            metrics.jobs_updated.add(len(sendable))

    async def _publish_many(self, messages: list[tuple[str, Message]]) -> None:
        # One channel keeps per-queue order; publishing concurrently only overlaps the confirms.
        for start in range(0, len(messages), _PUBLISH_CONCURRENCY):
            chunk = messages[start : start + _PUBLISH_CONCURRENCY]
            await asyncio.gather(*(self.bus.publish(queue, message) for queue, message in chunk))

    def _told(self, worker_id: str | None, stamp: Stamp) -> None:
        """Note that ``worker_id`` (None: the shared queue, nobody yet) is being told something stamped ``stamp``."""
        info = self.workers.get(worker_id) if worker_id is not None else None
        if info is not None:
            info.told = max(info.told, stamp)
            info.told_at = self.monotonic.now()

    def _alive(self) -> list[str]:
        return [w for w, i in self.workers.items() if i.alive]

    def _is_alive(self, worker_id: str | None) -> bool:
        info = self.workers.get(worker_id) if worker_id is not None else None
        return info is not None and info.alive


def _assign_message(rows: Iterable[Definition], stamp: Stamp, fires_after: dict[int, int]) -> bus_pb2.Assign:
    proto_stamp = stamp.to_proto()
    return bus_pb2.Assign(
        stamp=proto_stamp,
        jobs=[
            bus_pb2.JobAssignment(job=_definition(r), stamp=proto_stamp, last_fire_ts=fires_after.get(r.job_id, 0))
            for r in rows
        ],
    )


def _definition(row: Definition) -> bus_pb2.JobDefinition:
    return bus_pb2.JobDefinition(
        job_id=row.job_id,
        account_id=row.account_id,
        version=row.version,
        cron=row.cron or "",
        timezone=row.timezone or "UTC",
        active=bool(row.cron),
        missed_run_grace_seconds=row.missed_run_grace_seconds,
        job_type=JOB_TYPE_TO_PROTO[JobType(row.job_type)],
        priority=row.priority,
        jitter_seconds=row.jitter_seconds,
    )
