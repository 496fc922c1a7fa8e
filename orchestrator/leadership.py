"""Leadership: a lease in Postgres (``orchestrator_term``), renewed every second on a dedicated
connection, and lost by a leader that has not renewed it within ``LEASE_SECONDS``.

A lease, not a session: a leader frozen (SIGSTOP, a paused VM) keeps its connections open, and a
session lock (an advisory lock) held by it kept every standby out for as long as it stood still.
Now a standby takes an expired lease with the next term, and the leader stops leading as soon as
its own clock says the lease may have expired (``LeadershipLost``): it counts from before it asked
for the renewal, so it gives up no later than Postgres lets a standby in. Whatever it does in the
moment before it notices is refused by the term fence on every write (``queries.sql`` ``fence``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from runplane.adapters.db import Connection, connect, database_errors, fetch_value
from runplane.basics.errors import RunplaneError, ServiceUnavailable
from runplane.basics.supervise import sleep_or_stop
from runplane.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("orchestrator")

LEASE_SECONDS = 5.0
STANDBY_POLL_SECONDS = 1.0
WATCH_SECONDS = 1.0  # how often the leader renews its lease


class LeadershipLost(RunplaneError):
    """The lease was not renewed in time, or another leader took it: stop leading now."""


async def acquire(database_url: str, leader: str, stop: asyncio.Event) -> tuple[Connection, int] | None:
    """Wait as a standby until the lease is ours: the connection to renew it on and the new term, or
    None when stopped."""
    conn: Connection | None = None
    announced = False
    while not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = await connect(database_url)
            with database_errors():
                term = await fetch_value(conn, QUERIES["take_lease"], {"leader": leader, "lease": LEASE_SECONDS}, int)
            if term is not None:
                return conn, term
        except ServiceUnavailable as exc:
            log.warning("leader lease not reachable", extra={"error": str(exc)})
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


async def keep(conn: Connection, term: int, stop: asyncio.Event) -> None:
    """Renew the lease every ``WATCH_SECONDS``; raise ``LeadershipLost`` once it may have expired
    (a renewal failed, was slow, or the process stood still) or another leader holds it."""
    valid_until = time.monotonic() + LEASE_SECONDS  # taken just now, from before this was called
    while not await sleep_or_stop(stop, WATCH_SECONDS):
        asked = time.monotonic()
        if asked >= valid_until:
            raise LeadershipLost(f"the lease of term {term} was not renewed in time ({asked - valid_until:.1f}s over)")
        try:
            with database_errors():
                renewed = await asyncio.wait_for(
                    fetch_value(conn, QUERIES["renew_lease"], {"term": term, "lease": LEASE_SECONDS}, int),
                    timeout=valid_until - asked,
                )
        except (RunplaneError, TimeoutError) as exc:
            raise LeadershipLost(f"the lease of term {term} could not be renewed: {exc!r}") from exc
        if renewed is None:
            raise LeadershipLost(f"term {term} is over: another leader took the lease")
        valid_until = asked + LEASE_SECONDS


async def release(conn: Connection, term: int) -> None:
    """Give the lease up (a leader that stops): a standby takes over at its next poll."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.execute(QUERIES["release_lease"], {"term": term}), timeout=WATCH_SECONDS)
