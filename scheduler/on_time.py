"""The per-account on-time gauge (``runplane.accounts.by_on_time_ratio``), read from the run rows once a minute.

Every scheduler loop sets it from the same query, so any of them may be scraped; the reading is a
few index ranges per account with runs in the window (``runplane/sql/status.sql``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from runplane.adapters import instruments
from runplane.adapters.db import Connection, fetch_all
from runplane.basics import on_time
from runplane.basics.settings import SchedulerSettings
from runplane.sql import load_queries

Q = load_queries("runplane.sql", "status.sql")


@dataclass(frozen=True)
class _AccountOnTime:
    account_id: int
    account_name: str
    considered: int
    on_time: int


class OnTimeGauge:
    def __init__(self, pool: AsyncConnectionPool[Connection], settings: SchedulerSettings) -> None:
        self._pool = pool
        self._settings = settings
        self._next_at = 0.0

    async def observe_when_due(self) -> dict[str, int] | None:
        """Read and set the gauge when ``on_time_interval`` has passed since the last reading."""
        now = time.monotonic()
        if now < self._next_at:
            return None
        self._next_at = now + self._settings.on_time_interval
        return await self.observe()

    async def observe(self) -> dict[str, int]:
        """Set the gauge; returns how many accounts are at or below each bound."""
        params = {"window_seconds": self._settings.on_time_window, "on_time_seconds": on_time.ON_TIME_SECONDS}
        async with self._pool.connection() as conn:
            rows = await fetch_all(conn, Q["accounts_on_time"], params, _AccountOnTime)
        counts = on_time.accounts_at_or_below(on_time.ratio(r.on_time, r.considered) for r in rows)
        for le, accounts in counts.items():
            instruments.accounts_by_on_time_ratio.set(accounts, {"at_most": le})
        return counts
