"""The noop launcher, for benchmarks only: it claims and finishes each run at once, without a runner.

Launches of one dispatch pass arrive together; the first caller writes every pending run in one
statement (the others wait for it), so the database sees one round trip per batch, not per run.
"""

from __future__ import annotations

import asyncio

from psycopg_pool import AsyncConnectionPool

from dispatcher.launcher import LaunchRequest, LaunchResult
from runplane.db import Connection
from runplane.errors import LaunchError
from runplane.sql import load_queries

Q = load_queries("dispatcher", "noop.sql")


class NoopLauncher:
    name = "noop"

    def __init__(self, pool: AsyncConnectionPool[Connection], cluster: str) -> None:
        self._pool = pool
        self._cluster = cluster
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._flushing = False

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[request.run_id] = done
        if not self._flushing:
            await self._flush()
        await done
        return LaunchResult(cluster=self._cluster, pod_name="")

    async def _flush(self) -> None:
        self._flushing = True
        try:
            await asyncio.sleep(0)  # let the rest of the pass enqueue
            while self._pending:
                batch, self._pending = self._pending, {}
                try:
                    async with self._pool.connection() as conn, conn.transaction():
                        await conn.execute("SET LOCAL synchronous_commit = off")
                        await conn.execute(Q["claim_and_finish"], {"ids": list(batch)})
                except Exception as exc:  # any failure fails the batch's launches
                    for future in batch.values():
                        future.set_exception(LaunchError(f"noop launch failed: {exc}", retryable=True))
                    continue
                for future in batch.values():
                    future.set_result(None)
        finally:
            self._flushing = False

    async def close(self) -> None:
        return None
