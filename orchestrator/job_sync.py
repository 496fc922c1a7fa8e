"""Job changes, for the leader: LISTEN/NOTIFY on jobs and accounts, healed by a sweep of versions
(``sweep``, which the leader's reconcile runs periodically); ownership is brought in line with what
the jobs say, in short holds of the lock."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from orchestrator.outbox import Outbox, Outgoing
from orchestrator.rows import Definition, JobState
from orchestrator.state import LeaderState
from runplane.basics.supervise import sleep_or_stop, wait_any

_NOTIFY_DEBOUNCE = 0.05


class JobSync:
    """Ownership brought in line with the jobs: what changed (notified) or drifted (a sweep)."""

    def __init__(self, state: LeaderState, outbox: Outbox) -> None:
        self.state = state
        self.outbox = outbox
        self._dirty: set[int] = set()
        self._dirty_accounts: set[int] = set()
        self._changed = asyncio.Event()
        self._full_sync = asyncio.Event()
        self._sweeping = asyncio.Lock()  # held through a full sweep: one at a time

    def request_sweep(self) -> None:
        """Have the sync loop sweep every job next (after a start, or once workers have registered)."""
        self._full_sync.set()

    @property
    def sweeping(self) -> bool:
        """A full sweep is under way."""
        return self._sweeping.locked()

    async def listen(self, stop: asyncio.Event) -> None:
        """Note the jobs and accounts Postgres says changed, for the sync loop, until ``stop``."""
        async for kind, key in self.state.store.changes(stop):
            if kind == "job":
                self._dirty.add(key)
            else:
                self._dirty_accounts.add(key)
            self._changed.set()

    async def sync_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if await wait_any(stop, self._changed, self._full_sync):
                return
            if self._full_sync.is_set():
                self._full_sync.clear()
                await self.sweep()
                continue
            await sleep_or_stop(stop, _NOTIFY_DEBOUNCE)  # let a burst of notifications collect
            self._changed.clear()
            job_ids, self._dirty = self._dirty, set()
            accounts, self._dirty_accounts = self._dirty_accounts, set()
            for account_id in accounts:
                job_ids.update(await self.state.store.account_jobs(account_id))
            if job_ids:
                await self.sync(sorted(job_ids))

    async def sweep(self) -> None:
        async with self._sweeping:
            await self.sync(await self.state.store.drift())

    async def sync(self, job_ids: list[int]) -> None:
        """Bring ownership in line with what the jobs say, one batch per hold of the lock.

        Short holds keep heartbeats and claims flowing while a large change is worked through; each
        batch re-reads its jobs under the lock, so it acts on current state.
        """
        size = self.state.settings.orchestrator.assign_batch_size
        for start in range(0, len(job_ids), size):
            batch = job_ids[start : start + size]
            async with self.state.lock:
                outgoing = await self._assign_new(batch)
                assigned = {r.job_id for assign in outgoing for r in assign.rows}
                rest = [job_id for job_id in batch if job_id not in assigned]
                if rest:
                    rows = await self.state.store.job_states(rest)
                    outgoing += await self.sync_locked(rows)
            # Recorded as pending under the lock; built and sent outside it, so that claims of the
            # previous batch are taken meanwhile. Nothing decides on a pending shared-queue Assign
            # before its claim comes back but the claim itself.
            await self.outbox.publish_assigns(outgoing)

    async def _assign_new(self, job_ids: list[int]) -> list[Outgoing]:
        """Record one Assign for those of ``job_ids`` that are schedulable and unowned (the caller
        holds the lock); the others are left to ``sync_locked``."""
        if not self.state.alive():
            return []  # assigned when the first worker registers
        stamp = self.state.clock.tick()
        now = int(self.state.wall_clock.now())
        rows = await self.state.store.assign_new(job_ids, stamp, now)
        if not rows:
            return []
        return [Outgoing(self.state.topology.assign, rows, stamp, {r.job_id: now for r in rows})]

    async def sync_locked(self, rows: list[JobState]) -> list[Outgoing]:
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
                await self.outbox.revoke(worker_id, job_ids)
            await self.state.store.delete_ownership(job_ids)
        if changed:
            await self.outbox.send_updates(changed)
        if not new or not self.state.alive():
            return []  # new jobs are assigned when the first worker registers
        now = int(self.state.wall_clock.now())
        return await self.outbox.record_assigns(new, worker_id=None, fires_after={r.job_id: now for r in new})
