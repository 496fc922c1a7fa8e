"""``runplane orchestrator``: stand by until the leader lease is ours, then lead until stopped.

A leader whose lease may have expired (``LeadershipLost``), or that finds Postgres or RabbitMQ down,
stops leading at once (it must not keep sending messages another leader may contradict) and goes
back to standing by, after a bounded backoff: the process itself rides out a server restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from orchestrator import leadership
from orchestrator.leader import Leader
from orchestrator.ownership_store import PostgresOwnershipStore
from runplane.adapters.bus import AmqpBus
from runplane.adapters.db import close_pool, open_pool
from runplane.adapters.outages import Backoff, is_transient
from runplane.basics.settings import Settings
from runplane.basics.supervise import sleep_or_stop, spawn
from runplane.basics.wall_clock import SYSTEM_CLOCK, WallClock

log = logging.getLogger(__name__)


async def serve(settings: Settings, stop: asyncio.Event, *, wall_clock: WallClock = SYSTEM_CLOCK) -> None:
    leader_id = f"{socket.gethostname()}-{os.getpid()}"
    backoff = Backoff(first=1.0, cap=10.0)
    while not stop.is_set():
        try:
            await _lead_once(settings, leader_id, stop, wall_clock)
            backoff.reset()
        except Exception as exc:
            if not _lost(exc):
                raise
            pause = backoff.next()
            log.warning("stepped down; standing by again", extra={"error": repr(exc), "pause": round(pause, 2)})
            if await sleep_or_stop(stop, pause):
                return


def _lost(exc: BaseException) -> bool:
    """An exception group from the leader's tasks made only of lost leadership and outages."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_lost(e) for e in exc.exceptions)
    return isinstance(exc, leadership.LeadershipLost) or is_transient(exc)


async def _lead_once(settings: Settings, leader_id: str, stop: asyncio.Event, wall_clock: WallClock) -> None:
    """Stand by, then lead until stopped or until leading fails."""
    acquired = await leadership.acquire(settings.database_url, leader_id, stop)
    if acquired is None:
        return
    conn, term = acquired
    try:
        log.info("elected leader", extra={"term": term, "leader": leader_id})
        pool = await open_pool(settings.database_url, min_size=1, max_size=4, name="orchestrator")
        try:
            bus = await AmqpBus.connect(settings.amqp_url)
            try:
                store = PostgresOwnershipStore(pool, settings.database_url, term)
                leader = Leader(settings, store, bus, term, leader_id, wall_clock=wall_clock)
                async with asyncio.TaskGroup() as group:
                    spawn(group, "orchestrator:leadership", leadership.keep(conn, term, stop), eternal=True, stop=stop)
                    spawn(group, "orchestrator:leader", leader.run(stop), eternal=True, stop=stop)
            finally:
                await bus.close()
        finally:
            await close_pool(pool)
    finally:
        if stop.is_set():
            await leadership.release(conn, term)
        await conn.close()
