"""What every section of the leader shares: its outside systems and clocks, its term's logical clock,
its view of the workers, and the one lock its decisions are taken under.

Each section (``outbox``, ``liveness``, ``job_sync``, ``inbox``) is handed this view and keeps its own
state itself; nothing else is shared between them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from orchestrator.decisions import WorkerInfo
from orchestrator.ownership_store import OwnershipStore
from runplane.adapters.bus import Bus, Topology
from runplane.basics.settings import Settings
from runplane.basics.stamps import LogicalClock, Stamp
from runplane.basics.wall_clock import MonotonicClock, WallClock


@dataclass
class LeaderState:
    """The leader's shared view; ``lock`` is held by every decision, so each sees the previous one's effect."""

    settings: Settings
    store: OwnershipStore
    bus: Bus
    clock: LogicalClock
    leader_id: str
    wall_clock: WallClock  # the fire times a new owner queues after (``fires_after``)
    monotonic: MonotonicClock  # heartbeats, deadlines and timeouts
    topology: Topology
    workers: dict[str, WorkerInfo] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def term(self) -> int:
        return self.clock.term

    def told(self, worker_id: str | None, stamp: Stamp) -> None:
        """Note that ``worker_id`` (None: the shared queue, nobody yet) is being told something stamped ``stamp``."""
        info = self.workers.get(worker_id) if worker_id is not None else None
        if info is not None:
            info.told = max(info.told, stamp)
            info.told_at = self.monotonic.now()

    def alive(self) -> list[str]:
        """The workers this leader believes alive, in the order it first heard of them."""
        return [w for w, i in self.workers.items() if i.alive]

    def is_alive(self, worker_id: str | None) -> bool:
        info = self.workers.get(worker_id) if worker_id is not None else None
        return info is not None and info.alive
