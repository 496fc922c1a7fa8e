"""A warehouse directory is held by one environment: of two saves naming it at once, the one that
commits first holds it, and the other learns so even though its statement waited on the first."""

from __future__ import annotations

import asyncio

from api.store import Store
from runplane.adapters.db import close_pool, open_pool
from runplane.basics.types import AccountId
from tests.support.polling import eventually
from tests.support.records import Conn, create_account, create_environment

DIRECTORY = "/var/lib/runplane/warehouses/shop"


def waiting_on_a_lock(db: Conn) -> bool:
    """Whether a statement of the test's database waits on a lock (the second claim on the first's row)."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    ).fetchone()
    return row is not None and int(row[0]) > 0


async def test_of_two_saves_claiming_one_directory_at_once_the_first_to_commit_holds_it(
    db: Conn, database_url: str
) -> None:
    first_account, second_account = AccountId(create_account(db, name="a")), AccountId(create_account(db, name="b"))
    first, second = create_environment(db, first_account, "1.10"), create_environment(db, second_account, "1.10")
    pool = await open_pool(database_url, max_size=2)
    store = Store(pool)
    try:
        claimed = asyncio.Event()
        release = asyncio.Event()

        async def first_save() -> int:
            async with store.transaction() as conn:
                holder = await store.claim_warehouse_directory(conn, first_account, first, DIRECTORY)
                claimed.set()
                await release.wait()  # the second save's statement waits on this uncommitted claim
            return holder

        async def second_save() -> int:
            await claimed.wait()
            async with store.transaction() as conn:
                return await store.claim_warehouse_directory(conn, second_account, second, DIRECTORY)

        first_task = asyncio.create_task(first_save())
        second_task = asyncio.create_task(second_save())
        await claimed.wait()
        await eventually(lambda: waiting_on_a_lock(db), timeout=60, what="the second save to wait on the first")
        release.set()
        assert await first_task == first
        assert await second_task == first  # not "none": the holder is read again after the wait
        async with store.transaction() as conn:
            assert await store.claim_warehouse_directory(conn, first_account, first, DIRECTORY) == first
    finally:
        await close_pool(pool)
