"""Pickups: the hint that tells dispatchers an account may have work. Built and sent only here.

Who sends one: the API after a trigger, a queuer worker after a tick, the scheduler loop every
pass for every account with due runs, and whoever ends a run (a slot may have freed; a retry or a
completion trigger was queued). A Pickup is only a hint: the scheduler loop's pass finds every due
run anyway, so :func:`hint_pickups` never fails its caller; :func:`send_pickups` raises for the
callers that count a failed send (the scheduler loop, a queuer worker's tick).

At most one scheduler Pickup per account waits on the bus (Redis marks; efficiency only). The
scheduler loop resends a Pickup every interval for every account with due runs. When dispatchers
fall behind, those would pile up: several Pickups of one account waiting, each costing a dispatch
pass that finds nothing new. So the loop marks an account when it sends its Pickup and skips marked
accounts (:class:`PendingPickups`); the dispatcher clears the mark when it takes the Pickup, before
it reads anything, so a change made after that point gets a Pickup of its own. The mark expires on
its own (a lost Pickup delays the account by at most ``ttl``), and when Redis is away every Pickup
is sent. Pickups from other senders are never held back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runplane import instruments
from runplane.bus import Bus, Topology
from runplane.errors import ServiceUnavailable
from runplane.settings import Settings
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)

PUBLISH_CONCURRENCY = 64


def pickup(account_id: int) -> bus_pb2.Pickup:
    """The Pickup message of an account, stamped now (dispatchers measure its time on the bus)."""
    return bus_pb2.Pickup(account_id=account_id, sent_at_ms=int(time.time() * 1000))


async def send_pickups(bus: Bus, topology: Topology, account_ids: Iterable[int], *, source: str) -> int:
    """Publish a Pickup per account, concurrently; raises ``ServiceUnavailable`` when one fails."""
    accounts = sorted(set(account_ids))
    if not accounts:
        return 0
    gate = asyncio.Semaphore(PUBLISH_CONCURRENCY)

    async def publish(account_id: int) -> None:
        async with gate:
            await bus.publish(topology.pickup, pickup(account_id))

    await asyncio.gather(*(publish(account_id) for account_id in accounts))
    instruments.pickups_published.add(len(accounts), {"source": source})
    return len(accounts)


async def hint_pickups(bus: Bus | None, topology: Topology, account_ids: Iterable[int], *, source: str) -> None:
    """:func:`send_pickups`, best effort: a bus that does not answer is logged (the scheduler loop resends)."""
    if bus is None:
        return
    try:
        await send_pickups(bus, topology, account_ids, source=source)
    except ServiceUnavailable as exc:
        log.warning("pickups not published; the scheduler loop resends them", extra={"error": str(exc)})


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
