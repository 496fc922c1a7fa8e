"""At most one scheduler Pickup per account waiting on the bus (Redis marks; efficiency only).

The scheduler loop resends a Pickup every interval for every account with due runs. When
dispatchers fall behind, those would pile up: several Pickups of one account waiting, each costing
a dispatch pass that finds nothing new. So the loop marks an account when it sends its Pickup and
skips marked accounts; the dispatcher clears the mark when it takes the Pickup, before it reads
anything, so a change made after that point gets a Pickup of its own. The mark expires on its own
(a lost Pickup delays the account by at most ``ttl``), and when Redis is away every Pickup is sent.
Pickups from other senders (the API, queuer workers, runners) are never held back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runplane.settings import Settings

log = logging.getLogger(__name__)


def pending_pickup_ttl_ms(settings: Settings) -> int:
    """How long a sent Pickup holds back the next one of its account: a few scheduler passes."""
    return int(max(5.0, 5 * settings.scheduler.interval) * 1000)


class PendingPickups:
    def __init__(self, client: aioredis.Redis, *, prefix: str, ttl_ms: int) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_ms = ttl_ms

    @classmethod
    def from_url(cls, url: str, *, prefix: str, ttl_ms: int) -> PendingPickups:
        return cls(
            aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2), prefix=prefix, ttl_ms=ttl_ms
        )

    def key(self, account_id: int) -> str:
        return f"{self._prefix}:pickup:account:{account_id}"

    async def mark(self, account_ids: Sequence[int]) -> list[int]:
        """Mark the accounts; those that were not marked yet (whose Pickup should be sent)."""
        if not account_ids:
            return []
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for account_id in account_ids:
                    pipe.set(self.key(account_id), b"1", nx=True, px=self._ttl_ms)
                taken = await pipe.execute()
        except RedisError as exc:
            log.warning("pickup marks unavailable; sending every pickup", extra={"error": str(exc)})
            return list(account_ids)
        return [account_id for account_id, new in zip(account_ids, taken, strict=True) if new]

    async def clear(self, account_id: int) -> None:
        with contextlib.suppress(RedisError):  # the mark expires on its own
            await self._client.delete(self.key(account_id))

    async def close(self) -> None:
        await self._client.aclose()
