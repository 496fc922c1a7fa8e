"""The leader: which worker owns which job, kept true in Postgres and told to the workers.

Inputs: job changes (LISTEN/NOTIFY, healed by a periodic reconcile of versions), Claimed and
Heartbeat messages from workers, and the passing of time (dead workers, lost Assigns, imbalance).
Outputs: Assign on the shared queue (or on one worker's queue when rebalancing), Update and Revoke
on the owner's queue, every message stamped ``(term, clock)``.

Ownership rows are written before the message that makes them true is sent, and all decisions are
taken under one lock, so each decision sees the effect of the previous one. A sweep's Assigns are
built and published after the lock is released, so that claims are taken while they go out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from orchestrator import metrics
from orchestrator.balance import balanced, plan_moves
from runplane.bus import AmqpBus, Delivery, Topology
from runplane.db import Connection, connect
from runplane.settings import Settings
from runplane.sql import load_queries
from runplane.stamps import LogicalClock, Stamp
from runplane.supervise import sleep_or_stop, spawn, wait_any
from runplane.types import JOB_TYPE_TO_PROTO, JobType
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)

QUERIES = load_queries("orchestrator")

DIGEST_HEADER = "owned_digest"
_NOTIFY_DEBOUNCE = 0.05
_PUBLISH_CONCURRENCY = 64

Row = dict[str, Any]  # psycopg's values: int for bigint, str for text


@dataclass(frozen=True)
class Outgoing:
    """An Assign recorded in ``job_ownership``, to be published."""

    queue: str
    rows: list[Row]
    stamp: Stamp
    fires_after: dict[int, int]


@dataclass
class WorkerInfo:
    alive: bool
    last_seen: float  # time.monotonic() of its last heartbeat (or of this leader's start)
    alive_since: float
    jobs_owned: int = 0
    owned_digest: int = 0


class Leader:
    def __init__(
        self, settings: Settings, pool: AsyncConnectionPool[Connection], bus: AmqpBus, term: int, leader_id: str
    ) -> None:
        self.settings = settings
        self.pool = pool
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
        metrics.observe(
            lambda: self.clock.term,
            lambda: {w: time.monotonic() - i.last_seen for w, i in self.workers.items() if i.alive},
            lambda: {w: i.jobs_owned for w, i in self.workers.items() if i.alive},
        )

    @property
    def term(self) -> int:
        return self.clock.term

    async def run(self, stop: asyncio.Event) -> None:
        await self._load()
        listen_conn = await connect(self.settings.database_url)
        try:
            await listen_conn.execute("LISTEN runplane_jobs")
            await listen_conn.execute("LISTEN runplane_accounts")
            async with asyncio.TaskGroup() as group:
                spawn(group, "orchestrator:listen", self._listen(listen_conn, stop), eternal=True, stop=stop)
                spawn(
                    group,
                    "orchestrator:inbox",
                    self.bus.consume(self.topology.orchestrator, self.on_message, prefetch=64, stop=stop),
                    eternal=True,
                    stop=stop,
                )
                spawn(group, "orchestrator:sync", self._sync_loop(stop), eternal=True, stop=stop)
                spawn(group, "orchestrator:reconcile", self._reconcile_loop(stop), eternal=True, stop=stop)
                spawn(group, "orchestrator:liveness", self._liveness_loop(stop), eternal=True, stop=stop)
        finally:
            await listen_conn.close()

    # -- start ------------------------------------------------------------------------------------

    async def _load(self) -> None:
        """Take over the workers a previous leader knew; give the live ones a full grace period."""
        now = time.monotonic()
        async with self.pool.connection() as conn:
            for row in await (await conn.execute(QUERIES["workers"])).fetchall():
                alive = row["state"] == "alive"
                self.workers[str(row["worker_id"])] = WorkerInfo(alive, now, now)
        log.info(
            "leading",
            extra={"term": self.term, "leader": self.leader_id, "workers": sum(w.alive for w in self.workers.values())},
        )
        await self._reassign_orphans()
        self._full_sync.set()

    # -- job changes ------------------------------------------------------------------------------

    async def _listen(self, conn: Connection, stop: asyncio.Event) -> None:
        while not stop.is_set():
            async for notify in conn.notifies(timeout=0.5):
                try:
                    payload = json.loads(notify.payload)
                except ValueError:
                    continue
                if notify.channel == "runplane_jobs":
                    self._dirty.add(int(payload["job_id"]))
                else:
                    self._dirty_accounts.add(int(payload["account_id"]))
                self._changed.set()

    async def _sync_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if await wait_any(stop, self._changed, self._full_sync):
                return
            if self._full_sync.is_set():
                self._full_sync.clear()
                await self._sweep()
                continue
            await sleep_or_stop(stop, _NOTIFY_DEBOUNCE)  # let a burst of notifications collect
            self._changed.clear()
            job_ids, self._dirty = self._dirty, set()
            accounts, self._dirty_accounts = self._dirty_accounts, set()
            for account_id in accounts:
                rows = await self._fetch(QUERIES["account_jobs"], {"account_id": account_id})
                job_ids.update(r["id"] for r in rows)
            if job_ids:
                await self._sync(sorted(job_ids))

    async def _reconcile_loop(self, stop: asyncio.Event) -> None:
        """Heal lost notifications and lost Assigns."""
        while not await sleep_or_stop(stop, self.settings.orchestrator.reconcile_interval):
            if self._sweeping.locked():
                # A sweep is under way: it is the reconcile. Claims of the Assigns it sends wait
                # behind it in the inbox, so they are not lost yet either.
                continue
            await self._sweep()
            await self._resend_stale_pending()
            await self._reassign_orphans()

    async def _sweep(self) -> None:
        async with self._sweeping:
            await self._sync(await self._drift())

    async def _drift(self) -> list[int]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(QUERIES["drift"])
            return [job_id for (job_id,) in await cur.fetchall()]

    async def _sync(self, job_ids: list[int]) -> None:
        """Bring ownership in line with what the jobs say, one batch per hold of the lock.

        Short holds keep heartbeats and claims flowing while a large change is worked through; each
        batch re-reads its jobs under the lock, so it acts on current state.
        """
        size = self.settings.orchestrator.assign_batch_size
        for start in range(0, len(job_ids), size):
            batch = job_ids[start : start + size]
            async with self._lock:
                outgoing = await self._assign_new(batch)
                assigned = {r["job_id"] for assign in outgoing for r in assign.rows}
                rest = [job_id for job_id in batch if job_id not in assigned]
                if rest:
                    rows = await self._fetch(QUERIES["job_states"], {"job_ids": rest})
                    outgoing += await self._sync_locked(rows)
            # Recorded as pending under the lock; built and sent outside it, so that claims of the
            # previous batch are taken meanwhile. Nothing decides on a pending shared-queue Assign
            # before its claim comes back but the claim itself.
            await self._publish_assigns(outgoing)

    async def _assign_new(self, job_ids: list[int]) -> list[Outgoing]:
        """Record one Assign for those of ``job_ids`` that are schedulable and unowned (the caller
        holds the lock); the others are left to ``_sync_locked``."""
        if not self._alive():
            return []  # assigned when the first worker registers
        stamp = self.clock.tick()
        now = int(time.time())
        rows = await self._fetch(
            QUERIES["assign_new"], {"job_ids": job_ids, "term": stamp.term, "clock": stamp.clock, "now": now}
        )
        if not rows:
            return []
        return [Outgoing(self.topology.assign, rows, stamp, {r["job_id"]: now for r in rows})]

    async def _sync_locked(self, rows: list[Row]) -> list[Outgoing]:
        """Act on the given job states (the caller holds the lock); returns the Assigns of new jobs,
        recorded but not yet published."""
        new: list[Row] = []
        gone: dict[str | None, list[int]] = defaultdict(list)
        changed: list[Row] = []
        for row in rows:
            if row["schedulable"] and not row["owned"]:
                new.append(row)
            elif row["owned"] and not row["schedulable"]:
                gone[_opt_str(row["worker_id"])].append(row["job_id"])
            elif row["owned"] and row["state"] == "claimed" and row["version"] != row["sent_version"]:
                changed.append(row)
        for worker_id, job_ids in gone.items():
            await self._execute(QUERIES["delete_ownership"], {"job_ids": job_ids})
            # A pending Assign on the shared queue has no owner yet: its claim will be refused.
            if worker_id is not None:
                await self._revoke(worker_id, job_ids)
        if changed:
            await self._send_updates(changed)
        if not new or not self._alive():
            return []  # new jobs are assigned when the first worker registers
        now = int(time.time())
        return await self._record_assigns(new, worker_id=None, fires_after={r["job_id"]: now for r in new})

    # -- messages to workers ----------------------------------------------------------------------

    async def _assign(self, rows: list[Row], *, worker_id: str | None, fires_after: dict[int, int]) -> None:
        """Record and publish Assigns for ``rows`` (job definitions): on the shared queue, or on one
        worker's own queue when ``worker_id`` is given (rebalancing)."""
        await self._publish_assigns(await self._record_assigns(rows, worker_id=worker_id, fires_after=fires_after))

    async def _record_assigns(
        self, rows: list[Row], *, worker_id: str | None, fires_after: dict[int, int]
    ) -> list[Outgoing]:
        """Stamp and record the Assigns for ``rows`` as pending; the caller publishes them."""
        queue = self.topology.assign if worker_id is None else self.topology.worker(worker_id)
        size = self.settings.orchestrator.assign_batch_size
        outgoing: list[Outgoing] = []
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            stamp = self.clock.tick()
            await self._execute(
                QUERIES["upsert_pending"],
                {
                    "job_ids": [r["job_id"] for r in batch],
                    "versions": [r["version"] for r in batch],
                    "worker_id": worker_id,
                    "term": stamp.term,
                    "clock": stamp.clock,
                    "now": int(time.time()),
                },
            )
            outgoing.append(Outgoing(queue, batch, stamp, fires_after))
        return outgoing

    async def _publish_assigns(self, outgoing: list[Outgoing]) -> None:
        for assign in outgoing:
            await self.bus.publish(assign.queue, _assign_message(assign.rows, assign.stamp, assign.fires_after))
            metrics.jobs_assigned.add(len(assign.rows))

    async def _resend(self, job_ids: list[int], worker_id: str | None) -> None:
        """Publish again the pending Assigns of ``job_ids`` with their recorded stamps."""
        rows = await self._fetch(QUERIES["definitions"], {"job_ids": job_ids, "worker_id": worker_id, "claimed": False})
        by_stamp: dict[tuple[int, int], list[Row]] = defaultdict(list)
        for row in rows:
            by_stamp[(row["term"], row["clock"])].append(row)
        queue = self.topology.assign if worker_id is None else self.topology.worker(worker_id)
        for (term, clock), batch in by_stamp.items():
            fires_after = {r["job_id"]: r["fires_after"] for r in batch}
            await self.bus.publish(queue, _assign_message(batch, Stamp(term, clock), fires_after))
        await self._execute(QUERIES["touch_pending"], {"job_ids": job_ids})

    async def _revoke(self, worker_id: str, job_ids: list[int]) -> None:
        info = self.workers.get(worker_id)
        if info is None or not info.alive:
            return  # its queue is gone; a returning worker is told to drop everything
        stamp = self.clock.tick()
        await self.bus.publish(self.topology.worker(worker_id), bus_pb2.Revoke(stamp=stamp.to_proto(), job_ids=job_ids))
        metrics.jobs_revoked.add(len(job_ids))

    async def _send_updates(self, rows: list[Row]) -> None:
        sendable = [r for r in rows if self._is_alive(_opt_str(r["worker_id"]))]
        messages: list[tuple[str, Message]] = []
        for row in sendable:
            stamp = self.clock.tick()
            assignment = bus_pb2.JobAssignment(job=_definition(row), stamp=stamp.to_proto())
            messages.append(
                (self.topology.worker(str(row["worker_id"])), bus_pb2.Update(stamp=stamp.to_proto(), job=assignment))
            )
        await self._publish_many(messages)
        if sendable:
            await self._execute(
                QUERIES["sent_versions"],
                {
                    "job_ids": [r["job_id"] for r in sendable],
                    "versions": [r["version"] for r in sendable],
                    "now": int(time.time()),
                },
            )
            metrics.jobs_updated.add(len(sendable))

    async def _publish_many(self, messages: list[tuple[str, Message]]) -> None:
        # One channel keeps per-queue order; publishing concurrently only overlaps the confirms.
        for start in range(0, len(messages), _PUBLISH_CONCURRENCY):
            chunk = messages[start : start + _PUBLISH_CONCURRENCY]
            await asyncio.gather(*(self.bus.publish(queue, message) for queue, message in chunk))

    # -- messages from workers --------------------------------------------------------------------

    async def on_message(self, message: Message, delivery: Delivery) -> None:
        if isinstance(message, bus_pb2.Heartbeat):
            info = self.workers.get(message.worker_id)
            if info is not None and info.alive:
                # A live worker's beat decides nothing, so it does not wait for the lock: a long
                # sweep would otherwise delay it, and the claims queued behind it.
                await self._on_live_heartbeat(info, message, delivery)
                return
        async with self._lock:
            if isinstance(message, bus_pb2.Heartbeat):
                await self._on_heartbeat(message, delivery)
            elif isinstance(message, bus_pb2.Claimed):
                await self._on_claimed(message)
            else:
                log.warning("unexpected message on the orchestrator queue", extra={"type": type(message).__name__})

    async def _on_live_heartbeat(self, info: WorkerInfo, beat: bus_pb2.Heartbeat, delivery: Delivery) -> None:
        info.last_seen = time.monotonic()
        info.jobs_owned = beat.jobs_owned
        info.owned_digest = int(str(delivery.headers.get(DIGEST_HEADER, "0")))
        # Only while the row says alive: a burial that got in first stays a burial.
        await self._execute(
            QUERIES["beat"],
            {"worker_id": beat.worker_id, "jobs_owned": beat.jobs_owned, "owned_digest": info.owned_digest},
        )

    async def _on_heartbeat(self, beat: bus_pb2.Heartbeat, delivery: Delivery) -> None:
        """A beat from a worker not known to be alive (the caller holds the lock)."""
        worker_id = beat.worker_id
        info = self.workers.get(worker_id)
        if info is not None and info.alive:
            await self._on_live_heartbeat(info, beat, delivery)  # registered while this one waited
            return
        if not beat.registering:
            # Declared dead (or unknown to us): whatever it holds was given to others.
            await self._drop_all(worker_id)
            return
        now = time.monotonic()
        info = WorkerInfo(True, now, now)
        self.workers[worker_id] = info
        log.info("queuer worker registered", extra={"worker_id": worker_id})
        # Jobs may be waiting for workers: assign them once the workers starting together are in.
        asyncio.get_running_loop().call_later(self.settings.orchestrator.heartbeat_interval, self._full_sync.set)
        info.jobs_owned = beat.jobs_owned
        info.owned_digest = int(str(delivery.headers.get(DIGEST_HEADER, "0")))
        await self._execute(
            QUERIES["heartbeat"],
            {"worker_id": worker_id, "jobs_owned": beat.jobs_owned, "owned_digest": info.owned_digest},
        )

    async def _drop_all(self, worker_id: str) -> None:
        stamp = self.clock.tick()
        log.warning("telling a worker declared dead to drop everything", extra={"worker_id": worker_id})
        await self.bus.publish(self.topology.worker(worker_id), bus_pb2.Revoke(stamp=stamp.to_proto(), drop_all=True))

    async def _on_claimed(self, claimed: bus_pb2.Claimed) -> None:
        claimer = claimed.worker_id
        job_ids = list(claimed.job_ids)
        stamp = (claimed.stamp.term, claimed.stamp.clock)
        if not self._is_alive(claimer):
            # Refused: what a dead worker took from the shared queue goes out again to the others.
            rows = await self._fetch(QUERIES["ownership"], {"job_ids": job_ids})
            unclaimed = [r["job_id"] for r in rows if r["worker_id"] is None and (r["term"], r["clock"]) == stamp]
            if unclaimed:
                await self._resend(unclaimed, None)
            return
        # Accepted: what is still pending under this very Assign, for this worker or the shared queue.
        accepted = await self._fetch(
            QUERIES["claim"], {"worker_id": claimer, "job_ids": job_ids, "term": stamp[0], "clock": stamp[1]}
        )
        if len(accepted) < len(job_ids):
            taken = {r["job_id"] for r in accepted}
            rest = [job_id for job_id in job_ids if job_id not in taken]
            rows = await self._fetch(QUERIES["ownership"], {"job_ids": rest})
            # A job it holds already is a duplicate or older claim; any other was deleted,
            # deactivated or given to another worker since, and the claimer must let it go.
            holds = {r["job_id"] for r in rows if r["worker_id"] == claimer}
            refused = [job_id for job_id in rest if job_id not in holds]
            if refused:
                await self._revoke(claimer, refused)
        # An update that arrived while the claim was pending goes to the owner now.
        behind = [r["job_id"] for r in accepted if r["job_version"] is not None and r["job_version"] != r["version"]]
        if behind:
            fresh = await self._fetch(QUERIES["job_states"], {"job_ids": behind})
            await self._publish_assigns(await self._sync_locked(fresh))

    # -- time -------------------------------------------------------------------------------------

    async def _liveness_loop(self, stop: asyncio.Event) -> None:
        interval = self.settings.orchestrator.heartbeat_interval
        tick = 0
        while not await sleep_or_stop(stop, interval / 10):
            tick += 1
            await self._declare_dead()
            if tick % 10 == 0:
                await self._rebalance()

    async def _declare_dead(self) -> None:
        now = time.monotonic()
        dead = [w for w, i in self.workers.items() if i.alive and now - i.last_seen > self._dead_after]
        for worker_id in dead:
            await self._bury(worker_id)

    async def _bury(self, worker_id: str) -> None:
        """Declare a worker dead: delete its queue and reassign everything it owned."""
        async with self._lock:
            now = time.monotonic()
            info = self.workers.setdefault(worker_id, WorkerInfo(False, now, now))
            info.alive = False
            await self._execute(QUERIES["mark_dead"], {"worker_id": worker_id})
            await self.bus.delete(self.topology.worker(worker_id))
            job_ids = [r["job_id"] for r in await self._fetch(QUERIES["owned_by"], {"worker_id": worker_id})]
        log.warning("queuer worker dead", extra={"worker_id": worker_id, "jobs": len(job_ids)})
        metrics.workers_declared_dead.add(1)
        await self._reassign(job_ids, worker_id)

    async def _reassign_orphans(self) -> None:
        """Jobs still owned by workers that are not alive (a previous leader died mid-way)."""
        for row in await self._fetch(QUERIES["owners"], {}):
            worker_id = str(row["worker_id"])
            if not self._is_alive(worker_id):
                await self._bury(worker_id)

    async def _reassign(self, job_ids: list[int], dead: str) -> None:
        """Give the jobs of a dead worker to whoever takes them from the shared queue."""
        size = self.settings.orchestrator.assign_batch_size
        for start in range(0, len(job_ids), size):
            async with self._lock:
                # Only what the dead worker still owns: the batch may have changed since.
                rows = await self._fetch(
                    QUERIES["definitions"],
                    {"job_ids": job_ids[start : start + size], "worker_id": dead, "claimed": False},
                )
                fires_after = {r["job_id"]: r["fires_after"] for r in rows}
                await self._assign(rows, worker_id=None, fires_after=fires_after)

    async def _resend_stale_pending(self) -> None:
        rows = await self._fetch(QUERIES["stale_pending"], {"timeout": self.settings.orchestrator.claim_timeout})
        by_target: dict[str | None, list[int]] = defaultdict(list)
        for row in rows:
            by_target[_opt_str(row["worker_id"])].append(row["job_id"])
        size = self.settings.orchestrator.assign_batch_size
        for worker_id, job_ids in by_target.items():
            if worker_id is not None and not self._is_alive(worker_id):
                continue  # the dead-worker path reassigns them
            log.info("resending unclaimed Assigns", extra={"jobs": len(job_ids), "worker_id": worker_id})
            for start in range(0, len(job_ids), size):
                async with self._lock:
                    await self._resend(job_ids[start : start + size], worker_id)

    async def _rebalance(self) -> None:
        """Move jobs (Revoke, then Assign to the new owner's queue) until loads are within tolerance."""
        if not self._alive():
            return
        pending = await self._fetch(QUERIES["pending_count"], {})
        if pending and pending[0]["n"]:
            return  # wait until every Assign is claimed: counts are not final before
        settled = time.monotonic() - self.settings.orchestrator.heartbeat_interval
        if any(i.alive_since > settled for i in self.workers.values() if i.alive):
            return  # a worker just joined; let it take its share of any Assigns first
        counts = {w: 0 for w in self._alive()}
        for row in await self._fetch(QUERIES["claimed_counts"], {}):
            if str(row["worker_id"]) in counts:
                counts[str(row["worker_id"])] = row["n"]
        if balanced(counts, self.settings.orchestrator.rebalance_tolerance):
            return
        owned: dict[str, list[int]] = {w: [] for w in counts}
        for row in await self._fetch(QUERIES["claimed_by_worker"], {}):
            worker_id = str(row["worker_id"])
            if worker_id in owned:
                owned[worker_id] = list(row["job_ids"])
        moves = plan_moves(owned, self.settings.orchestrator.rebalance_tolerance)
        if not moves:
            return
        log.info("rebalancing", extra={"moves": len(moves), "jobs": sum(len(m.job_ids) for m in moves)})
        size = self.settings.orchestrator.assign_batch_size
        for move in moves:
            for start in range(0, len(move.job_ids), size):
                async with self._lock:
                    if not (self._is_alive(move.donor) and self._is_alive(move.target)):
                        return  # the next pass plans again
                    rows = await self._fetch(
                        QUERIES["definitions"],
                        {"job_ids": move.job_ids[start : start + size], "worker_id": move.donor, "claimed": True},
                    )
                    if not rows:
                        continue
                    # Revoke first, then Assign: the new owner queues a fire that fell in between
                    # (its missed-fire grace), and the idempotency key makes a fire queued by both one run.
                    await self._revoke(move.donor, [r["job_id"] for r in rows])
                    fires_after = {r["job_id"]: r["fires_after"] for r in rows}
                    await self._assign(rows, worker_id=move.target, fires_after=fires_after)

    # -- helpers ----------------------------------------------------------------------------------

    def _alive(self) -> list[str]:
        return [w for w, i in self.workers.items() if i.alive]

    def _is_alive(self, worker_id: str | None) -> bool:
        info = self.workers.get(worker_id) if worker_id is not None else None
        return info is not None and info.alive

    async def _fetch(self, query: str, params: dict[str, object]) -> list[Row]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchall()

    async def _execute(self, query: str, params: dict[str, object]) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(query, params)


def _assign_message(rows: Iterable[Row], stamp: Stamp, fires_after: dict[int, int]) -> bus_pb2.Assign:
    proto_stamp = stamp.to_proto()
    return bus_pb2.Assign(
        stamp=proto_stamp,
        jobs=[
            bus_pb2.JobAssignment(job=_definition(r), stamp=proto_stamp, last_fire_ts=fires_after.get(r["job_id"], 0))
            for r in rows
        ],
    )


def _definition(row: Row) -> bus_pb2.JobDefinition:
    return bus_pb2.JobDefinition(
        job_id=row["job_id"],
        account_id=row["account_id"],
        version=row["version"],
        cron=str(row["cron"] or ""),
        timezone=str(row["timezone"] or "UTC"),
        active=bool(row["cron"]),
        missed_run_grace_seconds=row["missed_run_grace_seconds"],
        job_type=JOB_TYPE_TO_PROTO[JobType(str(row["job_type"]))],
        priority=row["priority"],
    )


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
