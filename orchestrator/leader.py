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

from orchestrator.decisions import WorkerInfo
from orchestrator.inbox import Inbox
from runplane.basics.supervise import spawn

log = logging.getLogger(__name__)


class Leader(Inbox):
    """Start (take over what a previous leader knew) and the leader's tasks, until ``stop``."""

    async def run(self, stop: asyncio.Event) -> None:
        await self._load()
        async with asyncio.TaskGroup() as group:
            spawn(group, "orchestrator:listen", self._listen(stop), eternal=True, stop=stop)
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

    async def _load(self) -> None:
        """Take over the workers a previous leader knew; give the live ones a full grace period."""
        now = self.monotonic.now()
        for row in await self.store.workers():
            alive = row.state == "alive"
            # A worker found dead was declared dead by an earlier leader: it registers again only
            # after dropping what it held, on this leader's word.
            self.workers[row.worker_id] = WorkerInfo(alive, now, now, buried=not alive)
        log.info(
            "leading",
            extra={"term": self.term, "leader": self.leader_id, "workers": sum(w.alive for w in self.workers.values())},
        )
        await self._reassign_orphans()
        self._full_sync.set()
