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
import logging

from orchestrator import metrics
from orchestrator.decisions import WorkerInfo
from orchestrator.inbox import Inbox
from orchestrator.job_sync import JobSync
from orchestrator.liveness import Liveness
from orchestrator.outbox import Outbox
from orchestrator.ownership_store import OwnershipStore
from orchestrator.state import LeaderState
from runplane.adapters.bus import Bus, Topology
from runplane.basics.settings import Settings
from runplane.basics.stamps import LogicalClock
from runplane.basics.supervise import sleep_or_stop, spawn
from runplane.basics.wall_clock import SYSTEM_CLOCK, SYSTEM_MONOTONIC, MonotonicClock, WallClock

log = logging.getLogger(__name__)


class Leader:
    """Start (take over what a previous leader knew) and the leader's tasks, until ``stop``.

    Composed of its sections, each handed the shared ``LeaderState`` and the sections it calls."""

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
        self.state = state = LeaderState(
            settings=settings,
            store=store,
            bus=bus,
            clock=LogicalClock(term),
            leader_id=leader_id,
            wall_clock=wall_clock,
            monotonic=monotonic,
            topology=Topology(settings.bus_prefix),
        )
        self.outbox = Outbox(state)
        self.liveness = Liveness(state, self.outbox)
        self.job_sync = JobSync(state, self.outbox)
        self.inbox = Inbox(state, self.outbox, self.job_sync)
        metrics.observe(
            lambda: state.clock.term,
            lambda: {w: state.monotonic.now() - i.last_seen for w, i in state.workers.items() if i.alive},
            lambda: {w: i.jobs_owned for w, i in state.workers.items() if i.alive},
        )

    @property
    def term(self) -> int:
        return self.state.term

    @property
    def workers(self) -> dict[str, WorkerInfo]:
        """The workers as this leader sees them."""
        return self.state.workers

    async def run(self, stop: asyncio.Event) -> None:
        state = self.state
        await self._load()
        async with asyncio.TaskGroup() as group:
            spawn(group, "orchestrator:listen", self.job_sync.listen(stop), eternal=True, stop=stop)
            spawn(
                group,
                "orchestrator:inbox",
                state.bus.consume(state.topology.orchestrator, self.inbox.on_message, prefetch=64, stop=stop),
                eternal=True,
                stop=stop,
            )
            spawn(group, "orchestrator:sync", self.job_sync.sync_loop(stop), eternal=True, stop=stop)
            spawn(group, "orchestrator:reconcile", self._reconcile_loop(stop), eternal=True, stop=stop)
            spawn(group, "orchestrator:liveness", self.liveness.run(stop), eternal=True, stop=stop)

    async def _load(self) -> None:
        """Take over the workers a previous leader knew; give the live ones a full grace period."""
        state = self.state
        now = state.monotonic.now()
        for row in await state.store.workers():
            alive = row.state == "alive"
            # A worker found dead was declared dead by an earlier leader: it registers again only
            # after dropping what it held, on this leader's word.
            state.workers[row.worker_id] = WorkerInfo(alive, now, now, buried=not alive)
        log.info(
            "leading",
            extra={"term": state.term, "leader": state.leader_id, "workers": len(state.alive())},
        )
        await self.liveness.reassign_orphans()
        self.job_sync.request_sweep()

    async def _reconcile_loop(self, stop: asyncio.Event) -> None:
        """Heal lost notifications and lost Assigns."""
        while not await sleep_or_stop(stop, self.state.settings.orchestrator.reconcile_interval):
            if self.job_sync.sweeping:
                # A sweep is under way: it is the reconcile. Claims of the Assigns it sends wait
                # behind it in the inbox, so they are not lost yet either.
                continue
            await self.job_sync.sweep()
            await self.liveness.resend_stale_pending()
            await self.liveness.reassign_orphans()
            await self.liveness.heal_drift()
