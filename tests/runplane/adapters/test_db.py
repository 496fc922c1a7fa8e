"""The database-error edge: what psycopg raises on a pooled connection arrives as runplane's errors; and
the typed fetches of one column."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest

from runplane.adapters.db import connect, database_errors, fetch_value, fetch_values, open_pool
from runplane.basics.errors import Contention, DatabaseError, ServiceUnavailable


async def test_a_refused_statement_is_a_database_error_caused_by_psycopgs(database_url: str) -> None:
    pool = await open_pool(database_url, max_size=1)
    try:
        with pytest.raises(DatabaseError) as caught:
            async with pool.connection() as conn:
                await conn.execute("SELECT 1 / 0")
        assert isinstance(caught.value.__cause__, psycopg.errors.DivisionByZero)
        async with pool.connection() as conn:  # the connection went back to the pool usable
            cur = await conn.execute("SELECT 2 AS two")
            assert await cur.fetchone() == {"two": 2}
    finally:
        await pool.close()


async def test_a_lock_held_by_another_transaction_is_contention(database_url: str) -> None:
    pool = await open_pool(database_url, max_size=1)
    holder = await connect(database_url, autocommit=False)
    try:
        await holder.execute("CREATE TABLE IF NOT EXISTS db_edge_probe (id int PRIMARY KEY)")
        await holder.execute("INSERT INTO db_edge_probe VALUES (1) ON CONFLICT DO NOTHING")
        await holder.commit()
        await holder.execute("SELECT id FROM db_edge_probe WHERE id = 1 FOR UPDATE")
        with pytest.raises(Contention) as caught:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '50ms'")
                await conn.execute("SELECT id FROM db_edge_probe WHERE id = 1 FOR UPDATE")
        assert isinstance(caught.value, ServiceUnavailable)  # nothing changed: callers may try again
        assert isinstance(caught.value.__cause__, psycopg.errors.LockNotAvailable)
    finally:
        await holder.rollback()
        await holder.close()
        await pool.close()


async def test_a_connection_that_went_away_is_service_unavailable(database_url: str) -> None:
    conn = await connect(database_url)
    await conn.close()
    with pytest.raises(ServiceUnavailable) as caught, database_errors():
        await conn.execute("SELECT 1")
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)


async def test_a_one_column_fetch_gives_the_values_as_their_type(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        many = "SELECT n, 'x' AS other FROM generate_series(1, %(last)s) AS n"
        assert await fetch_values(conn, many, {"last": 3}, int) == [1, 2, 3]
        assert await fetch_values(conn, many, {"last": 0}, int) == []
        assert await fetch_value(conn, many, {"last": 3}, int) == 1
        assert await fetch_value(conn, many, {"last": 0}, int) is None  # no row
        assert await fetch_value(conn, "SELECT false", {}, bool) is False  # a row, its value false
        with pytest.raises(TypeError, match="expected str"):
            await fetch_values(conn, many, {"last": 1}, str)
        with pytest.raises(TypeError, match="expected int"):
            await fetch_value(conn, "SELECT NULL::bigint", {}, int)  # a NULL is not "no row"
    finally:
        await conn.close()
