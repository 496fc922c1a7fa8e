"""Retention: finished runs older than their account's ``run_retention_days`` are deleted, with their
steps, logs and artifacts, in bounded batches.

Each batch is one short transaction of at most ``batch`` runs of one account, read oldest first
through ``runs_retention_idx``; a pass does at most ``max_batches`` of them, so a backlog is worked
off over several passes without long locks. How the runs table stays fast as it grows and shrinks:
the hot paths (queued runs, active runs, a job's latest runs) use partial or leading-column indexes
that finished-and-deleted rows do not bloat, and the foreign keys that a delete follows are indexed
(migration ``0014_run_retention.sql``); autovacuum reclaims the space.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from runplane.adapters.db import Connection, fetch_all
from runplane.sql import load_queries

log = logging.getLogger(__name__)

Q = load_queries("scheduler", "retention.sql")


@dataclass(frozen=True)
class _Retention:
    id: int
    run_retention_days: int


BATCH = 200
MAX_BATCHES = 10


async def delete_expired_runs(
    pool: AsyncConnectionPool[Connection], *, batch: int = BATCH, max_batches: int = MAX_BATCHES
) -> int:
    """Delete at most ``max_batches`` batches of expired runs; how many runs were deleted."""
    async with pool.connection() as conn:
        rows = await fetch_all(conn, Q["accounts_keeping_runs_for_a_while"], {}, _Retention)
    accounts = [(r.id, r.run_retention_days) for r in rows]
    deleted = batches = 0
    for account_id, days in accounts:
        while batches < max_batches:
            async with pool.connection() as conn:
                cur = await conn.execute(
                    Q["delete_expired_runs"], {"account_id": account_id, "days": days, "batch": batch}
                )
                count = cur.rowcount
            batches += 1
            deleted += count
            if count:
                log.info("expired runs deleted", extra={"account_id": account_id, "runs": count})
            if count < batch:
                break
        async with pool.connection() as conn:
            # A skipped occurrence is kept as long as a run would have been.
            params = {"account_id": account_id, "days": days, "batch": batch}
            await conn.execute(Q["delete_expired_skipped_occurrences"], params)
    return deleted
