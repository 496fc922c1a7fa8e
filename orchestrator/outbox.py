"""What the leader sends to workers: Assign (recorded as pending before it goes out), Update and
Revoke, every message stamped ``(term, clock)``.

The leader is composed of sections, one module each, every one handed the shared view
(``state.LeaderState``) and the sections it calls: ``outbox`` (messages to workers) is called by
``liveness`` (the passing of time: dead workers, lost Assigns, imbalance), ``job_sync`` (job changes)
and ``inbox`` (messages from workers); ``leader`` builds them and runs their tasks. The decisions
themselves are taken without I/O in ``decisions`` and ``balance``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from google.protobuf.message import Message

from orchestrator import metrics
from orchestrator.rows import Definition, JobState
from orchestrator.state import LeaderState
from runplane.basics.stamps import Stamp
from runplane.basics.types import JOB_TYPE_TO_PROTO, JobType
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
    """The messages the leader sends to workers: each recorded (when it changes ownership) before it
    goes out, and stamped from the term's clock."""

    def __init__(self, state: LeaderState) -> None:
        self.state = state

    async def assign(self, rows: Sequence[Definition], *, worker_id: str | None, fires_after: dict[int, int]) -> None:
        """Record and publish Assigns for ``rows`` (job definitions): on the shared queue, or on one
        worker's own queue when ``worker_id`` is given (rebalancing)."""
        await self.publish_assigns(await self.record_assigns(rows, worker_id=worker_id, fires_after=fires_after))

    async def record_assigns(
        self, rows: Sequence[Definition], *, worker_id: str | None, fires_after: dict[int, int]
    ) -> list[Outgoing]:
        """Stamp and record the Assigns for ``rows`` as pending; the caller publishes them."""
        queue = self.state.topology.assign if worker_id is None else self.state.topology.worker(worker_id)
        size = self.state.settings.orchestrator.assign_batch_size
        outgoing: list[Outgoing] = []
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            stamp = self.state.clock.tick()
            self.state.told(worker_id, stamp)
            await self.state.store.upsert_pending(
                [r.job_id for r in batch],
                [r.version for r in batch],
                worker_id,
                stamp,
                int(self.state.wall_clock.now()),
            )
            outgoing.append(Outgoing(queue, batch, stamp, fires_after))
        return outgoing

    async def publish_assigns(self, outgoing: list[Outgoing]) -> None:
        for assign in outgoing:
            await self.state.bus.publish(assign.queue, _assign_message(assign.rows, assign.stamp, assign.fires_after))
            metrics.jobs_assigned.add(len(assign.rows))

    async def resend(self, job_ids: list[int], worker_id: str | None, *, revoke_elsewhere: bool = False) -> None:
        """Assign again, under a new stamp, those of ``job_ids`` still pending for ``worker_id`` (None:
        the shared queue); ``revoke_elsewhere``: every other live worker is told to let them go first.

        A new stamp, not the recorded one: a worker told to drop everything after the first Assign
        (it was declared dead meanwhile, e.g. while the broker was away) refuses that stamp as stale,
        and when every worker had been told so, the same message sent again would be refused
        forever. A late claim of the old stamp no longer matches and is revoked from its sender.
        """
        rows = await self.state.store.pending_definitions(job_ids, worker_id)
        if not rows:
            return
        revoke_stamp = self.state.clock.tick()  # before the Assign: a worker that takes it keeps it
        fires_after = {r.job_id: r.fires_after for r in rows}
        outgoing = await self.record_assigns(rows, worker_id=worker_id, fires_after=fires_after)
        if revoke_elsewhere:
            for other in self.state.alive():
                if other != worker_id:
                    await self.revoke(other, [r.job_id for r in rows], revoke_stamp)
        await self.publish_assigns(outgoing)

    async def move(
        self, rows: Sequence[Definition], donor: str, *, to: str | None, fires_after: dict[int, int]
    ) -> None:
        """Give ``rows`` (job definitions ``donor`` owns) to ``to`` (None: whoever takes them from the
        shared queue): the new ownership is recorded, then ``donor`` is told to let go, then the
        Assign is sent.

        Recorded first, as every message the leader sends: a leader that stops between the two
        messages (a crash, or a stall past losing its lock, which makes its next write fail) leaves
        an Assign pending, which the next one sends again after revoking it from every other worker
        (``Liveness.resend_stale_pending``); sent first, the Revoke would leave the jobs owned by a
        worker that no longer holds them, firing nowhere until the ownership digest's repair. The
        Revoke is stamped before the Assign, so ``donor`` keeps the jobs if it is the one that takes
        them again from the shared queue."""
        revoke_stamp = self.state.clock.tick()
        outgoing = await self.record_assigns(rows, worker_id=to, fires_after=fires_after)
        await self.revoke(donor, [r.job_id for r in rows], revoke_stamp)
        await self.publish_assigns(outgoing)

    async def revoke(self, worker_id: str, job_ids: list[int], stamp: Stamp | None = None) -> None:
        """Tell a live worker to let go of ``job_ids``; ``stamp``: one taken earlier, when that was decided
        (so the Revoke is older than any Assign of those jobs sent since, which it must not undo)."""
        info = self.state.workers.get(worker_id)
        if info is None or not info.alive:
            return  # its queue is gone; a returning worker is told to drop everything
        if stamp is None:
            stamp = self.state.clock.tick()
        self.state.told(worker_id, stamp)
        revoke = bus_pb2.Revoke(stamp=stamp.to_proto(), job_ids=job_ids)
        await self.state.bus.publish(self.state.topology.worker(worker_id), revoke)
        metrics.jobs_revoked.add(len(job_ids))

    async def send_updates(self, rows: list[JobState]) -> None:
        """Send each owner the new definition of a job it owns (``rows``: jobs changed since it was sent one)."""
        sendable = [
            (r.worker_id, r.definition()) for r in rows if r.worker_id is not None and self.state.is_alive(r.worker_id)
        ]
        messages: list[tuple[str, Message]] = []
        for worker_id, definition in sendable:
            stamp = self.state.clock.tick()
            self.state.told(worker_id, stamp)
            assignment = bus_pb2.JobAssignment(job=_definition(definition), stamp=stamp.to_proto())
            update = bus_pb2.Update(stamp=stamp.to_proto(), job=assignment)
            messages.append((self.state.topology.worker(worker_id), update))
        await self._publish_many(messages)
        if sendable:
            await self.state.store.sent_versions(
                [d.job_id for _, d in sendable], [d.version for _, d in sendable], int(self.state.wall_clock.now())
            )
            metrics.jobs_updated.add(len(sendable))

    async def _publish_many(self, messages: list[tuple[str, Message]]) -> None:
        # One channel keeps per-queue order; publishing concurrently only overlaps the confirms.
        for start in range(0, len(messages), _PUBLISH_CONCURRENCY):
            chunk = messages[start : start + _PUBLISH_CONCURRENCY]
            await asyncio.gather(*(self.state.bus.publish(queue, message) for queue, message in chunk))


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
        catchup_window_seconds=row.catchup_window_seconds,
        catchup_all=row.catchup_all,
    )
