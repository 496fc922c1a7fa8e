"""The passing of time, for the leader: workers silent too long are declared dead and their jobs
reassigned, Assigns nobody claimed are sent again, a worker that does not hold what it owns is sent
it again, and loads out of tolerance are rebalanced."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from orchestrator import metrics
from orchestrator.balance import balanced, plan_moves, spread
from orchestrator.decisions import WorkerInfo, drifted, silent_workers
from orchestrator.outbox import Outbox
from orchestrator.state import LeaderState
from runplane.basics.errors import ServiceUnavailable
from runplane.basics.ownership import job_digest
from runplane.basics.stamps import Stamp
from runplane.basics.supervise import sleep_or_stop
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)


class Liveness:
    """The leader's watch over its workers as time passes; keeps what it needs to judge silence."""

    def __init__(self, state: LeaderState, outbox: Outbox) -> None:
        self.state = state
        self.outbox = outbox
        cfg = state.settings.orchestrator
        self._dead_after = cfg.heartbeat_interval * cfg.dead_after_intervals
        self._last_tick = state.monotonic.now()  # the loop's last look at the workers
        self._sole_consumer = True  # no other consumer on the orchestrator queue (a frozen predecessor's)

    async def run(self, stop: asyncio.Event) -> None:
        """Look at the workers ten times per heartbeat interval until ``stop``."""
        interval = self.state.settings.orchestrator.heartbeat_interval
        tick = 0
        self._last_tick = self.state.monotonic.now()
        while not await sleep_or_stop(stop, interval / 10):
            tick += 1
            if tick % 10 == 1:
                await self.count_orchestrator_consumers()
            await self.declare_dead()
            if tick % 10 == 0:
                await self.rebalance()

    async def count_orchestrator_consumers(self) -> None:
        """Whether this leader's consumer is the only one on the orchestrator queue. Another one is
        a previous leader's that stood still with its connection open (frozen; its lease long
        gone): it holds up to a prefetch of messages, heartbeats among them, and round robin keeps
        handing it more until that process runs again and steps down, or the broker drops its
        connection. Meanwhile this leader does not hear every beat, so it declares nobody dead
        (``decisions.silent_workers``: the silence is the leader's): judged by beats another
        process held, a healthy worker was declared dead. Nothing is dropped to end it: what that
        consumer holds comes back to this leader when it goes (at-least-once on the bus)."""
        try:
            consumers = await self.state.bus.consumers(self.state.topology.orchestrator)
        except ServiceUnavailable:
            return  # the broker is away: ``bus.connected`` says so already
        sole = consumers <= 1
        if sole != self._sole_consumer:
            log.warning(
                "hearing every heartbeat again" if sole else "another consumer holds heartbeats: declaring nobody dead",
                extra={"consumers": consumers},
            )
        self._sole_consumer = sole

    async def declare_dead(self) -> None:
        """Bury the workers silent for ``dead_after`` while this leader could hear them
        (``decisions.silent_workers``)."""
        now = self.state.monotonic.now()
        interval = self.state.settings.orchestrator.heartbeat_interval
        late_tick, self._last_tick = now - self._last_tick > interval, now
        dead = silent_workers(
            self.state.workers,
            now=now,
            late_tick=late_tick,
            hearing=self.state.bus.connected and self._sole_consumer,
            interval=interval,
            dead_after=self._dead_after,
        )
        for worker_id in dead:
            await self.bury(worker_id)

    async def bury(self, worker_id: str) -> None:
        """Declare a worker dead (once per death: its queue deleted, the death logged and counted) and
        reassign everything it still owns."""
        async with self.state.lock:
            now = self.state.monotonic.now()
            info = self.state.workers.setdefault(worker_id, WorkerInfo(False, now, now))
            first = not info.buried
            info.alive, info.buried = False, True
            if first:
                await self.state.store.mark_dead(worker_id)
                await self.state.bus.delete(self.state.topology.worker(worker_id))
            job_ids = await self.state.store.owned_by(worker_id)
        if first:
            log.warning("queuer worker dead", extra={"worker_id": worker_id, "jobs": len(job_ids)})
            metrics.workers_declared_dead.add(1)
        await self._reassign(job_ids, worker_id)

    async def reassign_orphans(self) -> None:
        """Jobs still owned by workers that are not alive (a previous leader died mid-way)."""
        for worker_id in await self.state.store.owners():
            if not self.state.is_alive(worker_id):
                await self.bury(worker_id)

    async def _reassign(self, job_ids: list[int], dead: str) -> None:
        """Give the jobs of a dead worker to the live workers, on their own queues (``balance.spread``
        says why not the shared queue), the least loaded first.

        A job still pending for it was being moved to it (rebalancing): its donor may hold it yet,
        the move's Revoke unsent (a leader stopped before it), so every other live worker lets go of
        it first, under a stamp older than the new Assign."""
        size = self.state.settings.orchestrator.assign_batch_size
        loads = {w: self.state.workers[w].jobs_owned for w in self.state.alive()}
        for start in range(0, len(job_ids), size):
            async with self.state.lock:
                # Only what the dead worker still owns: the batch may have changed since.
                rows = await self.state.store.definitions(job_ids[start : start + size], dead, claimed=False)
                revoke_stamp = self.state.clock.tick()
                fires_after = {r.job_id: r.fires_after for r in rows}
                loads = {w: n for w, n in loads.items() if self.state.is_alive(w)}
                outgoing = []
                for target, share in spread(rows, loads):
                    outgoing += await self.outbox.record_assigns(share, worker_id=target, fires_after=fires_after)
                    if target is not None:
                        loads[target] += len(share)
                if moving := [r.job_id for r in rows if r.state == "pending"]:
                    for other in self.state.alive():
                        await self.outbox.revoke(other, moving, revoke_stamp)
                await self.outbox.publish_assigns(outgoing)

    async def resend_stale_pending(self) -> None:
        rows = await self.state.store.stale_pending(self.state.settings.orchestrator.claim_timeout)
        by_target: dict[str | None, list[int]] = defaultdict(list)
        for row in rows:
            by_target[row.worker_id].append(row.job_id)
        size = self.state.settings.orchestrator.assign_batch_size
        for worker_id, job_ids in by_target.items():
            if worker_id is not None and not self.state.is_alive(worker_id):
                continue  # the dead-worker path reassigns them
            log.info("resending unclaimed Assigns", extra={"jobs": len(job_ids), "worker_id": worker_id})
            for start in range(0, len(job_ids), size):
                async with self.state.lock:
                    # Whoever else may hold them (a move's Revoke never sent: its leader stopped
                    # between recording the move and telling the donor) lets go first.
                    await self.outbox.resend(job_ids[start : start + size], worker_id, revoke_elsewhere=True)

    async def heal_drift(self) -> None:
        """Assign again everything a worker owns when what it holds has differed from what it owns.

        A worker's heartbeat carries the digest of the (job, version) pairs it holds
        (``runplane.basics.ownership``) and the newest stamp it had applied then; the leader computes
        the same digest from the ownership rows. A difference is normal while a message is on its
        way, so only one that lasts a claim timeout counts: the worker lost jobs or missed an Update,
        and would never fire them, or holds jobs it does not own (a Revoke that went nowhere: its
        queue was deleted under it). A look does not count, and the drift starts again, when the
        difference can be a message still on its way: an Assign pending for the worker; an Assign
        pending on the shared queue stamped before what the worker had heard (it may hold that
        one, its claim not in yet); or a beat counted before the worker had heard what it was told
        last, within a claim timeout of the telling (a beat built before a Revoke and delivered
        after it). A drift that counts is healed so: the worker is told to drop everything, then
        assigned all it owns, on its own queue and in that order; it ends holding exactly what it
        owns. The protocol does not rely on this (DESIGN.md, "Exactly once, on time"); it is the
        safety net, counted and alerted on.
        """
        now = self.state.monotonic.now()
        timeout = self.state.settings.orchestrator.claim_timeout
        expected: dict[str, int] = defaultdict(int)
        owned: dict[str, list[int]] = defaultdict(list)
        pending: set[str] = set()
        shared_pending: Stamp | None = None  # the oldest Assign pending on the shared queue
        for row in await self.state.store.claimed_versions():
            if row.state == "pending":
                if row.worker_id is not None:
                    pending.add(row.worker_id)
                else:
                    stamp = Stamp(row.term, row.clock)
                    shared_pending = stamp if shared_pending is None else min(shared_pending, stamp)
                continue
            worker_id = str(row.worker_id)
            expected[worker_id] ^= job_digest(row.job_id, row.version)
            owned[worker_id].append(row.job_id)
        for worker_id, info in list(self.state.workers.items()):
            if not drifted(
                info,
                expected[worker_id],
                now=now,
                timeout=timeout,
                pending=worker_id in pending,
                shared_pending=shared_pending,
            ):
                continue
            log.warning(
                "queuer worker does not hold what it owns; assigning its jobs again",
                extra={"worker_id": worker_id, "jobs_held": info.jobs_owned, "jobs_owned": len(owned[worker_id])},
            )
            metrics.workers_drifted.add(1)
            size = self.state.settings.orchestrator.assign_batch_size
            job_ids = owned[worker_id]
            for start in range(0, max(len(job_ids), 1), size):
                async with self.state.lock:
                    if not self.state.is_alive(worker_id):
                        return  # buried meanwhile: the dead-worker path reassigns its jobs
                    if start == 0:
                        info.floor = self.state.clock.tick()  # a claim of an older Assign is refused now
                        self.state.told(worker_id, info.floor)
                        drop = bus_pb2.Revoke(stamp=info.floor.to_proto(), drop_all=True)
                        await self.state.bus.publish(self.state.topology.worker(worker_id), drop)
                    rows = await self.state.store.definitions(job_ids[start : start + size], worker_id, claimed=True)
                    fires_after = {r.job_id: r.fires_after for r in rows}
                    await self.outbox.assign(rows, worker_id=worker_id, fires_after=fires_after)

    async def rebalance(self) -> None:
        """Move jobs (Revoke, then Assign to the new owner's queue) until loads are within tolerance."""
        if not self.state.alive():
            return
        if await self.state.store.pending_count():
            return  # wait until every Assign is claimed: counts are not final before
        settled = self.state.monotonic.now() - self.state.settings.orchestrator.heartbeat_interval
        if any(i.alive_since > settled for i in self.state.workers.values() if i.alive):
            return  # a worker just joined; let it take its share of any Assigns first
        counts = {w: 0 for w in self.state.alive()}
        for worker_id, n in (await self.state.store.claimed_counts()).items():
            if worker_id in counts:
                counts[worker_id] = n
        if balanced(counts, self.state.settings.orchestrator.rebalance_tolerance):
            return
        owned: dict[str, list[int]] = {w: [] for w in counts}
        for worker_id, job_ids in (await self.state.store.claimed_by_worker()).items():
            if worker_id in owned:
                owned[worker_id] = job_ids
        moves = plan_moves(owned, self.state.settings.orchestrator.rebalance_tolerance)
        if not moves:
            return
        log.info("rebalancing", extra={"moves": len(moves), "jobs": sum(len(m.job_ids) for m in moves)})
        size = self.state.settings.orchestrator.assign_batch_size
        for move in moves:
            for start in range(0, len(move.job_ids), size):
                async with self.state.lock:
                    if not (self.state.is_alive(move.donor) and self.state.is_alive(move.target)):
                        return  # the next pass plans again
                    batch = move.job_ids[start : start + size]
                    rows = await self.state.store.definitions(batch, move.donor, claimed=True)
                    if not rows:
                        continue
                    # Revoke first, then Assign: the new owner queues a fire that fell in between
                    # (its missed-fire grace), and the idempotency key makes a fire queued by both one run.
                    fires_after = {r.job_id: r.fires_after for r in rows}
                    await self.outbox.move(rows, move.donor, to=move.target, fires_after=fires_after)
