"""The account lock on the real Redis: one holder, token-checked release and extend, expiry."""

from __future__ import annotations

import asyncio

from runplane.locks import RedisAccountLocks
from runplane.settings import Settings


async def test_one_holder_at_a_time_and_only_the_holder_releases(prefix: str) -> None:
    locks = RedisAccountLocks.from_url(Settings().redis_url, prefix=prefix, ttl_ms=5_000)
    try:
        first = await locks.acquire(1)
        assert first is not None
        assert await locks.acquire(1) is None
        other_account = await locks.acquire(2)
        assert other_account is not None
        assert await first.release()
        assert not await first.release()  # already gone: a stale holder changes nothing
        second = await locks.acquire(1)
        assert second is not None and second.token != first.token
        assert not await first.extend()  # the old token cannot extend the new holder's lock
        assert await second.extend()
        await second.release()
        await other_account.release()
    finally:
        await locks.close()


async def test_an_expired_lock_can_be_taken_and_the_old_holder_cannot_release_it(prefix: str) -> None:
    locks = RedisAccountLocks.from_url(Settings().redis_url, prefix=prefix, ttl_ms=150)
    try:
        stale = await locks.acquire(9)
        assert stale is not None
        fresh = None
        for _ in range(100):
            fresh = await locks.acquire(9)
            if fresh:
                break
            await asyncio.sleep(0.02)
        assert fresh is not None
        assert not await stale.release()
        assert await fresh.release()
    finally:
        await locks.close()
