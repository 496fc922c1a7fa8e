"""``runplane orchestrator``: stand by until the leader lock is ours, then lead until stopped.

A leader that loses its lock's connection raises ``LeadershipLost`` and the process exits
non-zero at once rather than keep sending messages another leader may contradict.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from orchestrator import leadership
from orchestrator.leader import Leader
from runplane.bus import AmqpBus
from runplane.db import open_pool
from runplane.settings import Settings
from runplane.supervise import spawn

log = logging.getLogger(__name__)


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    leader_id = f"{socket.gethostname()}-{os.getpid()}"
    conn = await leadership.acquire(settings.database_url, stop)
    if conn is None:
        return
    try:
        term = await leadership.start_term(conn, leader_id)
        log.info("elected leader", extra={"term": term, "leader": leader_id})
        pool = await open_pool(settings.database_url, min_size=1, max_size=4, name="orchestrator")
        try:
            bus = await AmqpBus.connect(settings.amqp_url)
            try:
                leader = Leader(settings, pool, bus, term, leader_id)
                async with asyncio.TaskGroup() as group:
                    spawn(group, "orchestrator:leadership", leadership.watch(conn, stop), eternal=True, stop=stop)
                    spawn(group, "orchestrator:leader", leader.run(stop), eternal=True, stop=stop)
            finally:
                await bus.close()
        finally:
            await pool.close()
    finally:
        await conn.close()
