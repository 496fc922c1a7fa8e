"""Pickups: the hint that tells dispatchers accounts may have work. Built and sent only here.

Who sends one: the API after a trigger, a queuer worker after a tick, the scheduler loop every
pass for every account with due runs, whoever ends a run (a slot may have freed; a retry or a
completion trigger was queued), and a dispatcher for accounts it found locked by another. A Pickup
is only a hint: the scheduler loop's pass finds every due run anyway, so :func:`hint_pickups` never
fails its caller; :func:`send_pickups` raises for the callers that count a failed send (the
scheduler loop, a queuer worker's tick).

One Pickup names up to :data:`MAX_ACCOUNTS_PER_PICKUP` accounts: when many accounts become ready at
once (the top of the hour), a sender publishes a few messages, not one per account, and a
dispatcher takes them in batches. This stays correct when messages are lost or doubled, because a
Pickup carries no state: a lost one (or an account in it that a dispatcher could not take) is made
up by the scheduler loop's sweep, which sends every account with due runs (after a grace for the
cron runs a queuer just queued and sent Pickups for); a doubled one, or
one that arrives after its runs started, finds nothing queued and changes nothing, since the
dispatch pass re-reads the account under its row lock and starts runs with a compare-and-set.

At most one scheduler Pickup per account waits on the bus (Redis marks; efficiency only). The
scheduler loop resends a Pickup every interval for every account with due runs. When dispatchers
fall behind, those would pile up: several Pickups of one account waiting, each costing a dispatch
pass that finds nothing new. So the loop marks an account when it sends its Pickup and skips marked
accounts (:class:`PendingPickups`); the dispatcher clears the marks when it takes the Pickup, before
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

from runplane.adapters import instruments
from runplane.adapters.bus import Bus, Topology
from runplane.basics import redis_keys
from runplane.basics.errors import ServiceUnavailable
from runplane.basics.settings import Settings
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)

PUBLISH_CONCURRENCY = 64
# Accounts named by one Pickup: a few KiB of message, and about what one dispatch batch takes.
MAX_ACCOUNTS_PER_PICKUP = 500


def pickup(account_ids: Iterable[int]) -> bus_pb2.Pickup:
    """The Pickup of some accounts, stamped now (dispatchers measure its time on the bus)."""
    return bus_pb2.Pickup(account_ids=list(account_ids), sent_at_ms=int(time.time() * 1000))


def pickups(account_ids: Iterable[int]) -> list[bus_pb2.Pickup]:
    """The accounts, each once and in id order, packed into as few Pickups as the bound allows."""
    accounts = sorted(set(account_ids))
    return [
        pickup(accounts[start : start + MAX_ACCOUNTS_PER_PICKUP])
        for start in range(0, len(accounts), MAX_ACCOUNTS_PER_PICKUP)
    ]


def pickup_accounts(message: bus_pb2.Pickup) -> list[int]:
    """Every account a Pickup names (``account_id`` is what a sender of one account used to fill)."""
    accounts = list(message.account_ids)
    if message.account_id and message.account_id not in accounts:
        accounts.append(message.account_id)
    return accounts


async def send_pickups(bus: Bus, topology: Topology, account_ids: Iterable[int], *, source: str) -> int:
    """Publish Pickups naming every account, concurrently; the number of accounts named.

    Raises ``ServiceUnavailable`` when a publish fails."""
    messages = pickups(account_ids)
    if not messages:
        return 0
    gate = asyncio.Semaphore(PUBLISH_CONCURRENCY)

    async def publish(message: bus_pb2.Pickup) -> None:
        async with gate:
            await bus.publish(topology.pickup, message)

    await asyncio.gather(*(publish(message) for message in messages))
    accounts = sum(len(message.account_ids) for message in messages)
    instruments.pickups_published.add(accounts, {"source": source})
    return accounts


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


# ARGV: the mark key prefix, account ids separated by commas. Deletes their marks: a dispatcher clears
# a batch of hundreds at once, and one argument costs it less to encode than a key per account.
_CLEAR = """
for id in string.gmatch(ARGV[2], '[^,]+') do
  redis.call('del', ARGV[1] .. id)
end
return 0
"""


class PendingPickups:
    def __init__(self, client: aioredis.Redis, *, prefix: str, ttl_ms: int) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_ms = ttl_ms
        self._clear = client.register_script(_CLEAR)

    @classmethod
    def from_url(cls, url: str, *, prefix: str, ttl_ms: int) -> PendingPickups:
        return cls(
            aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2), prefix=prefix, ttl_ms=ttl_ms
        )

    def key(self, account_id: int) -> str:
        return redis_keys.pending_pickup(self._prefix, account_id)

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

    async def clear(self, account_ids: Sequence[int]) -> None:
        if not account_ids:
            return
        ids = ",".join(str(int(account_id)) for account_id in account_ids)
        with contextlib.suppress(RedisError):  # the mark expires on its own
            await self._clear(args=[redis_keys.pending_pickup(self._prefix), ids])

    async def close(self) -> None:
        await self._client.aclose()
