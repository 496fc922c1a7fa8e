"""Job changes, for the leader: LISTEN/NOTIFY on jobs and accounts, healed by a periodic reconcile
of versions; ownership is brought in line with what the jobs say, in short holds of the lock."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from orchestrator.liveness import Liveness
from orchestrator.outbox import Outgoing
from orchestrator.rows import Definition, JobState
from runplane.basics.supervise import sleep_or_stop, wait_any

_NOTIFY_DEBOUNCE = 0.05


class JobSync(Liveness):
    async def _listen(self, stop: asyncio.Event) -> None:
        async for kind, key in self.store.changes(stop):
            if kind == "job":
                self._dirty.add(key)
            else:
                self._dirty_accounts.add(key)
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
                job_ids.update(await self.store.account_jobs(account_id))
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
            await self._heal_drift()

    async def _sweep(self) -> None:
        async with self._sweeping:
            await self._sync(await self.store.drift())

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
                assigned = {r.job_id for assign in outgoing for r in assign.rows}
                rest = [job_id for job_id in batch if job_id not in assigned]
                if rest:
                    rows = await self.store.job_states(rest)
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
        now = int(self.wall_clock.now())
        rows = await self.store.assign_new(job_ids, stamp, now)
        if not rows:
            return []
        return [Outgoing(self.topology.assign, rows, stamp, {r.job_id: now for r in rows})]

    async def _sync_locked(self, rows: list[JobState]) -> list[Outgoing]:
        """Act on the given job states (the caller holds the lock); returns the Assigns of new jobs,
        recorded but not yet published."""
        new: list[Definition] = []
        gone: dict[str | None, list[int]] = defaultdict(list)
        changed: list[JobState] = []
        for row in rows:
            if row.schedulable and not row.owned:
                new.append(row.definition())
            elif row.owned and not row.schedulable:
                gone[row.worker_id].append(row.job_id)
            elif row.owned and row.state == "claimed" and row.version != row.sent_version:
                changed.append(row)
        for worker_id, job_ids in gone.items():
            # The Revoke first: when it cannot be sent (the broker is away) the row stays, and the
            # next leader or sweep finds the job owned but not schedulable and revokes it again.
            # A pending Assign on the shared queue has no owner yet: its claim will be refused.
            if worker_id is not None:
                await self._revoke(worker_id, job_ids)
            await self.store.delete_ownership(job_ids)
        if changed:
            await self._send_updates(changed)
        if not new or not self._alive():
            return []  # new jobs are assigned when the first worker registers
        now = int(self.wall_clock.now())
        return await self._record_assigns(new, worker_id=None, fires_after={r.job_id: now for r in new})
