"""The noop launcher, for benchmarks only: it claims and finishes each run at once, without a runner.

It lives with the dispatcher, not the bench, because a dispatcher process picks its launcher from
its settings (``dispatcher.launcher = noop``) and a service never imports the bench; its status
change is a transition like any other (``noop_claim_and_finish`` in ``runplane/runs/transitions.sql``).

Launches of one dispatch pass arrive together; the first caller writes every pending run in one
statement (the others wait for it), so the database sees one round trip per batch, not per run.
It writes on its own connection, without waiting for durability: a benchmark measures dispatch,
not the noop launcher's commits. As the end of a real run does, the end of its runs tells
dispatchers that their accounts have free slots again (``on_ended``: a Pickup).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dispatcher.launcher import LaunchRequest, LaunchResult
from runplane.adapters.db import Connection, connect, database_errors, fetch_all
from runplane.basics.errors import LaunchError, RunplaneError
from runplane.runs.transitions import TRANSITIONS


@dataclass(frozen=True)
class _Ended:
    account_id: int  # an account whose runs ended and that has queued runs left


class NoopLauncher:
    name = "noop"

    def __init__(self, database_url: str, cluster: str) -> None:
        self._database_url = database_url
        self._cluster = cluster
        self._conn: Connection | None = None
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._flushing = False
        # Told the accounts whose runs it ended (the dispatcher sends them a Pickup).
        self.on_ended: Callable[[list[int]], Awaitable[None]] | None = None

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
                    conn = await self._connection()
                    with database_errors():
                        rows = await fetch_all(conn, TRANSITIONS["noop_claim_and_finish"], {"ids": list(batch)}, _Ended)
                    ended = [row.account_id for row in rows]
                except RunplaneError as exc:
                    await self.close()
                    for future in batch.values():
                        future.set_exception(LaunchError(f"noop launch failed: {exc}", retryable=True))
                    continue
                for future in batch.values():
                    future.set_result(None)
                if ended and self.on_ended is not None:
                    await self.on_ended(ended)
        finally:
            self._flushing = False

    async def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            self._conn = await connect(self._database_url, options="-c synchronous_commit=off")
        return self._conn

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(RunplaneError), database_errors():
                await self._conn.close()
            self._conn = None
