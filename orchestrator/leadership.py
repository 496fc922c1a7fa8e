"""Leadership: one Postgres advisory lock, held on a dedicated connection for the leader's life.

A standby polls the lock. Losing the connection loses the lock, so the leader watches it and
raises ``LeadershipLost``: the process exits at once and its supervisor (``runplane up``,
Kubernetes) notices; meanwhile a standby takes the lock and leads with the next term.
"""

from __future__ import annotations

import asyncio
import logging

from runplane.adapters.db import Connection, connect, database_errors, fetch_value
from runplane.basics.errors import RunplaneError, ServiceUnavailable
from runplane.basics.supervise import sleep_or_stop
from runplane.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("orchestrator")

# Any fixed 64-bit number; it names the "orchestrator leader" advisory lock.
LEADER_LOCK_KEY = 0x72706F7263686573  # "rporches"
STANDBY_POLL_SECONDS = 1.0
WATCH_SECONDS = 1.0


class LeadershipLost(RunplaneError):
    """The connection holding the leader lock failed: stop leading now."""


async def acquire(database_url: str, stop: asyncio.Event) -> Connection | None:
    """Wait as a standby until the lock is ours; the connection holding it, or None when stopped."""
    conn: Connection | None = None
    announced = False
    while not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = await connect(database_url)
            with database_errors():
                locked = await fetch_value(conn, "SELECT pg_try_advisory_lock(%(key)s)", {"key": LEADER_LOCK_KEY}, bool)
            if locked:
                return conn
        except ServiceUnavailable as exc:
            log.warning("leader lock not reachable", extra={"error": str(exc)})
            if conn is not None:
                await conn.close()
            conn = None
        if not announced:
            log.info("standing by: another orchestrator leads")
            announced = True
        await sleep_or_stop(stop, STANDBY_POLL_SECONDS)
    if conn is not None:
        await conn.close()
    return None


async def start_term(conn: Connection, leader: str) -> int:
    """Increment and persist the term; returns the new one."""
    term = await fetch_value(conn, QUERIES["bump_term"], {"leader": leader}, int)
    assert term is not None  # orchestrator_term holds one row
    return term


async def watch(conn: Connection, stop: asyncio.Event) -> None:
    """Raise ``LeadershipLost`` as soon as the lock's connection stops answering."""
    while not await sleep_or_stop(stop, WATCH_SECONDS):
        try:
            with database_errors():
                await asyncio.wait_for(conn.execute("SELECT 1"), timeout=5 * WATCH_SECONDS)
        except (RunplaneError, TimeoutError) as exc:
            raise LeadershipLost(f"the leader lock's connection failed: {exc!r}") from exc
