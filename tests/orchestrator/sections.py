"""One section of the leader on its own: the shared ``LeaderState`` over the in-memory ownership store
(``tests/simulation/twins.py``, held to the Postgres store's behaviour by
``tests/simulation/test_store_conformance.py``) and the simulated broker, which keeps every message
published to a queue declared on it for the test to read."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from google.protobuf.message import Message

from orchestrator.decisions import WorkerInfo
from orchestrator.state import LeaderState
from runplane.adapters.bus import Topology
from runplane.basics.settings import Settings
from runplane.basics.stamps import LogicalClock
from runplane.basics.wall_clock import SYSTEM_CLOCK
from tests.simulation.broker import Broker, SimBus
from tests.simulation.process import Process
from tests.simulation.twins import MemoryDatabase, MemoryOwnershipStore
from tests.support.polling import eventually

HEARTBEAT = 2.0  # the default heartbeat interval: dead after three silent ones


class HandClock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.at = 1000.0

    def now(self) -> float:
        return self.at


@dataclass
class Sections:
    """A leader's shared view, the rows under it and the queues its messages go to."""

    db: MemoryDatabase
    state: LeaderState
    broker: Broker
    clock: HandClock
    trace: list[str] = field(default_factory=list)

    def worker(self, worker_id: str, *, alive: bool = True, jobs_owned: int = 0) -> WorkerInfo:
        """A worker this leader knows, its queue declared (so what is sent to it can be read)."""
        now = self.clock.now()
        info = self.state.workers[worker_id] = WorkerInfo(alive, now, now, jobs_owned=jobs_owned)
        self.broker.declare(self.state.topology.worker(worker_id))
        return info

    def job(self, cron: str | None = "*/5 * * * *") -> int:
        return self.db.add_job(1, cron).id

    async def received(self, queue: str, count: int) -> list[Message]:
        """The first ``count`` messages that reached ``queue`` (they arrive after the network's delay)."""
        ready = self.broker.declare(queue).ready
        await eventually(lambda: len(ready) >= count, 5, what=f"{count} messages on {queue}")
        return [envelope.message for envelope in list(ready)[:count]]

    def queued(self, queue: str) -> list[Message]:
        return [envelope.message for envelope in self.broker.declare(queue).ready]


def sections(**orchestrator: object) -> Sections:
    """A leader's state in term 1, with no worker yet; ``orchestrator``: settings to change."""
    settings = Settings(bus_prefix="sections")
    leader = settings.orchestrator.model_copy(update={"heartbeat_interval": HEARTBEAT, **orchestrator})
    settings = settings.model_copy(update={"orchestrator": leader})
    db = MemoryDatabase(now=time.time)
    term = db.bump_term()
    clock = HandClock()
    trace: list[str] = []
    broker = Broker(random.Random(0), lambda who, what: trace.append(f"{who} {what}"))
    topology = Topology(settings.bus_prefix)
    for queue in (topology.assign, topology.orchestrator):
        broker.declare(queue)
    state = LeaderState(
        settings=settings,
        store=MemoryOwnershipStore(db, term),
        bus=SimBus(broker, Process("leader"), lambda: 0.0),
        clock=LogicalClock(term),
        leader_id="leader",
        wall_clock=SYSTEM_CLOCK,
        monotonic=clock,
        topology=topology,
    )
    return Sections(db, state, broker, clock, trace)
