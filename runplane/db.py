"""Postgres access: connection pools and the error boundary.

psycopg errors that mean "the database is not there" become ``ServiceUnavailable``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from runplane import readiness
from runplane.errors import ServiceUnavailable

_CHECK_TIMEOUT = 2.0

Connection = psycopg.AsyncConnection[dict[str, object]]


async def open_pool(
    database_url: str, *, min_size: int = 1, max_size: int = 10, name: str = "runplane"
) -> AsyncConnectionPool[Connection]:
    """Open a pool whose connections return rows as dicts; fails fast when Postgres is down."""
    pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
        database_url,
        min_size=min_size,
        max_size=max_size,
        name=name,
        open=False,
        kwargs={"row_factory": dict_row, "autocommit": True},
    )
    try:
        await pool.open(wait=True, timeout=15)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(f"cannot reach Postgres at {redact(database_url)}: {exc}") from exc
    except Exception as exc:  # psycopg_pool.PoolTimeout
        await pool.close()
        raise ServiceUnavailable(f"cannot reach Postgres at {redact(database_url)}: {exc}") from exc

    async def reachable() -> bool:
        if pool.closed:
            return False
        async with pool.connection(timeout=_CHECK_TIMEOUT) as conn:
            await conn.execute("SELECT 1")
        return True

    readiness.register(f"postgres:{name}", reachable)
    return pool


async def close_pool(pool: AsyncConnectionPool[Connection]) -> None:
    """Close a pool from ``open_pool`` and stop reporting on it."""
    readiness.forget(f"postgres:{pool.name}")
    await pool.close()


async def connect(database_url: str, *, autocommit: bool = True) -> Connection:
    """A single connection outside any pool (leadership locks, LISTEN)."""
    try:
        return await psycopg.AsyncConnection.connect(database_url, autocommit=autocommit, row_factory=dict_row)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(f"cannot reach Postgres at {redact(database_url)}: {exc}") from exc


@contextlib.asynccontextmanager
async def transaction(pool: AsyncConnectionPool[Connection]) -> AsyncIterator[Connection]:
    """A pooled connection inside one transaction."""
    async with pool.connection() as conn, conn.transaction():
        yield conn


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}" if user else f"{scheme}://{host}"
