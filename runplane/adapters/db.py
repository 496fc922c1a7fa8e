"""Postgres access: connection pools, and the one place psycopg errors become runplane's.

Every psycopg error raised while a pooled connection is in use (:class:`Pool` wraps
``pool.connection()``), or inside :func:`database_errors`, becomes a :class:`runplane.basics.errors.RunplaneError`:

- the database not there, the connection lost, no pooled connection in time: ``ServiceUnavailable``;
- a lock not available, a deadlock, a serialization failure: ``Contention`` (a ``ServiceUnavailable``:
  nothing changed, try again);
- anything else Postgres refused: ``DatabaseError``.

Services catch these, never ``psycopg.*``; the original error is the new one's ``__cause__``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.conninfo import make_conninfo
from psycopg.rows import BaseRowFactory, RowMaker, class_row, dict_row, scalar_row
from psycopg_pool import AsyncConnectionPool

from runplane.adapters import readiness
from runplane.basics.errors import Contention, DatabaseError, ServiceUnavailable

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_CHECK_TIMEOUT = 2.0

Connection = psycopg.AsyncConnection[dict[str, object]]
RowT = TypeVar("RowT", bound="DataclassInstance")
ValueT = TypeVar("ValueT")

_CONTENTION = (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


@contextlib.contextmanager
def database_errors() -> Iterator[None]:
    """Turn what psycopg raises inside the block into runplane's errors (see the module's docstring)."""
    try:
        yield
    except _CONTENTION as exc:
        raise Contention(f"a concurrent transaction was in the way: {exc}") from exc
    except psycopg.OperationalError as exc:  # includes psycopg_pool.PoolTimeout
        raise ServiceUnavailable(f"database unavailable: {exc}") from exc
    except psycopg.Error as exc:
        raise DatabaseError(f"{type(exc).__name__}: {exc}") from exc


class Pool(AsyncConnectionPool[Connection]):
    """A connection pool whose connections raise runplane's errors, not psycopg's."""

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[Connection]:
        with database_errors():
            async with super().connection(timeout) as conn:
                yield conn


async def open_pool(
    database_url: str, *, min_size: int = 1, max_size: int = 10, name: str = "runplane"
) -> AsyncConnectionPool[Connection]:
    """Open a pool whose connections return rows as dicts; fails fast when Postgres is down."""
    pool = Pool(
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


async def connect(database_url: str, *, autocommit: bool = True, options: str = "") -> Connection:
    """A single connection outside any pool (leadership locks, LISTEN); use it inside :func:`database_errors`."""
    try:
        conninfo = make_conninfo(database_url, options=options) if options else database_url
        return await psycopg.AsyncConnection.connect(conninfo, autocommit=autocommit, row_factory=dict_row)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(f"cannot reach Postgres at {redact(database_url)}: {exc}") from exc


@contextlib.asynccontextmanager
async def transaction(pool: AsyncConnectionPool[Connection]) -> AsyncIterator[Connection]:
    """A pooled connection inside one transaction."""
    async with pool.connection() as conn, conn.transaction():
        yield conn


def _row_factory(row: type[RowT]) -> BaseRowFactory[RowT]:
    """psycopg's ``class_row``, but positional when the columns are the dataclass's fields in order
    (a hot query's thousands of rows then skip building a keyword dict each)."""
    by_name = class_row(row)
    fields = tuple(field.name for field in dataclasses.fields(row))

    def factory(cursor: Any) -> RowMaker[RowT]:
        description = cursor.description or ()
        if tuple(column.name for column in description) == fields:
            return lambda values: row(*values)
        return by_name(cursor)

    return factory


async def fetch_all(
    conn: Connection, query: str, params: Mapping[str, Any], row: type[RowT], *, prepare: bool | None = None
) -> list[RowT]:
    """Every row of ``query`` as a ``row`` (a dataclass whose fields are the query's columns); ``prepare``
    as psycopg's ``execute`` takes it (False: planned for these parameters each time)."""
    async with conn.cursor(row_factory=_row_factory(row)) as cur:
        await cur.execute(query, params, prepare=prepare)
        return await cur.fetchall()


async def fetch_one(conn: Connection, query: str, params: Mapping[str, Any], row: type[RowT]) -> RowT | None:
    """The first row of ``query`` as a ``row``, or None."""
    async with conn.cursor(row_factory=_row_factory(row)) as cur:
        await cur.execute(query, params)
        return await cur.fetchone()


async def fetch_values(conn: Connection, query: str, params: Mapping[str, Any], kind: type[ValueT]) -> list[ValueT]:
    """The first column of every row of ``query``, each a ``kind`` as psycopg reads the column (``text`` a
    ``str``, ``bigint`` an ``int``, ``boolean`` a ``bool``)."""
    async with conn.cursor(row_factory=scalar_row) as cur:
        await cur.execute(query, params)
        return [_value_of(kind, value) for value in await cur.fetchall()]


async def fetch_value(conn: Connection, query: str, params: Mapping[str, Any], kind: type[ValueT]) -> ValueT | None:
    """The first column of the first row of ``query`` as a ``kind``, or None without a row."""
    async with conn.cursor(row_factory=scalar_row) as cur:
        await cur.execute(query, params)
        if cur.rowcount == 0:
            return None
        return _value_of(kind, await cur.fetchone())


def _value_of(kind: type[ValueT], value: object) -> ValueT:
    """``value``, which must be a ``kind``: anything else (a NULL) means the query and its caller disagree."""
    if not isinstance(value, kind):
        raise TypeError(f"expected {kind.__name__} from the query, got {value!r}")
    return value


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}" if user else f"{scheme}://{host}"
