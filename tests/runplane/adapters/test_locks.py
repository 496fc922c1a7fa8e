"""The account locks on the real Redis: one holder per account, token-checked release, expiry, and
the "again" marks that hand a skipped account back to its holder."""

from __future__ import annotations

from runplane.adapters.locks import RedisAccountLocks
from runplane.basics.settings import Settings
from tests.support.polling import eventually


async def test_one_holder_per_account_and_a_batch_takes_only_the_free_ones(prefix: str) -> None:
    locks = RedisAccountLocks.from_url(Settings().redis_url, prefix=prefix, ttl_ms=5_000)
    try:
        first = await locks.acquire([1, 2, 2])
        assert (first.accounts, first.skipped) == ([1, 2], [])
        second = await locks.acquire([3, 2, 1, 4])
        assert (second.accounts, second.skipped) == ([3, 4], [2, 1])
        assert second.token != first.token
        # The first holder learns that accounts 1 and 2 were asked for while it held them.
        assert sorted(await first.release()) == [1, 2]
        assert await first.release() == []  # already released: nothing, and no mark twice
        third = await locks.acquire([1, 2, 3])
        assert (third.accounts, third.skipped) == ([1, 2], [3])
        assert await second.release() == [3]
        assert await third.release() == []
    finally:
        await locks.close()


async def test_an_expired_lock_can_be_taken_and_the_old_holder_cannot_release_it(prefix: str) -> None:
    locks = RedisAccountLocks.from_url(Settings().redis_url, prefix=prefix, ttl_ms=150)
    try:
        stale = await locks.acquire([9])
        assert stale.accounts == [9]
        fresh = await eventually(
            lambda: locks.acquire([9]), 2, until=lambda held: held.accounts, interval=0.02, what="the expired lock"
        )
        assert fresh.accounts == [9]
        await stale.release()
        # The stale holder's release left the fresh holder's lock in place.
        assert (await locks.acquire([9])).skipped == [9]
        assert await fresh.release() == [9]
        assert (await locks.acquire([9])).accounts == [9]
    finally:
        await locks.close()
