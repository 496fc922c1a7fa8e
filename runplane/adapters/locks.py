"""Per-account Redis locks, taken for a whole dispatch batch in one round trip.

The lock is for efficiency (one dispatcher works an account at a time); correctness comes from
Postgres. A dispatcher asks for the locks of every account in its batch at once (one Lua script):
it gets those that are free, each holding one fresh token and expiring after the TTL, and skips the
rest. A skipped account is not forgotten: the script marks it ("again", ``runplane.basics.redis_keys``),
and the holder, releasing its locks (one Lua script that deletes only keys still holding its
token), learns which of its accounts were asked for meanwhile and sends them a Pickup again. A
holder that dies never releases: its locks and marks expire, and the scheduler loop's sweep sends
those accounts a Pickup.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runplane.adapters import readiness
from runplane.basics import redis_keys
from runplane.basics.errors import ServiceUnavailable

# The scripts build each account's keys themselves (``redis_keys``: a key prefix and the id) from
# one argument naming every account: a batch of 500 accounts passed as 1,000 keys cost the
# dispatcher more to encode than the script costs Redis to run. So they need a single Redis (as
# everything runplane keeps there), not a cluster.
#
# ARGV: token, TTL in ms, lock key prefix, "again" key prefix, account ids separated by commas.
# Returns one character per account: "1" where it took the lock, "0" where it marked "again" instead.
_ACQUIRE = """
local taken = {}
for id in string.gmatch(ARGV[5], '[^,]+') do
  if redis.call('set', ARGV[3] .. id, ARGV[1], 'NX', 'PX', ARGV[2]) then
    taken[#taken + 1] = '1'
  else
    redis.call('set', ARGV[4] .. id, '1', 'PX', ARGV[2])
    taken[#taken + 1] = '0'
  end
end
return table.concat(taken)
"""

# ARGV: token, lock key prefix, "again" key prefix, the held account ids separated by commas.
# Deletes each lock still holding the token; returns one character per account, "1" for each
# marked "again" meanwhile.
_RELEASE = """
local again = {}
for id in string.gmatch(ARGV[4], '[^,]+') do
  local lock = ARGV[2] .. id
  if redis.call('get', lock) == ARGV[1] then
    redis.call('del', lock)
  end
  again[#again + 1] = tostring(redis.call('del', ARGV[3] .. id))
end
return table.concat(again)
"""


def _flags(reply: bytes | str) -> list[bool]:
    """The characters of a script's reply, as flags."""
    text = reply.decode() if isinstance(reply, bytes) else reply
    return [flag == "1" for flag in text]


@dataclass
class HeldLocks:
    """The locks one acquisition took (``accounts``) and the accounts another holder has (``skipped``)."""

    accounts: list[int]
    skipped: list[int]
    token: str = field(repr=False)
    _locks: RedisAccountLocks = field(repr=False)

    async def release(self) -> list[int]:
        """Release every lock still held with this token; the held accounts asked for meanwhile.

        Raises ``ServiceUnavailable`` when Redis does not answer (the locks then expire)."""
        return await self._locks.release(self)


class AccountLocks(Protocol):
    async def acquire(self, account_ids: Sequence[int]) -> HeldLocks: ...


class RedisAccountLocks:
    def __init__(self, client: aioredis.Redis, *, prefix: str, ttl_ms: int) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_ms = ttl_ms
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)

    @classmethod
    def from_url(cls, url: str, *, prefix: str, ttl_ms: int) -> RedisAccountLocks:
        client = aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)

        async def reachable() -> bool:
            return bool(await client.ping())

        readiness.register("redis", reachable)
        return cls(client, prefix=prefix, ttl_ms=ttl_ms)

    def key(self, account_id: int) -> str:
        return redis_keys.account_lock(self._prefix, account_id)

    def _key_prefixes(self) -> list[str]:
        return [redis_keys.account_lock(self._prefix), redis_keys.account_again(self._prefix)]

    async def acquire(self, account_ids: Sequence[int]) -> HeldLocks:
        """Take the locks of the free accounts among ``account_ids`` (each once), in one round trip."""
        accounts = list(dict.fromkeys(account_ids))
        token = secrets.token_hex(16)
        if not accounts:
            return HeldLocks([], [], token, self)
        try:
            ids = ",".join(str(int(account)) for account in accounts)
            taken = await self._acquire(args=[token, self._ttl_ms, *self._key_prefixes(), ids])
        except RedisError as exc:
            raise ServiceUnavailable(f"redis lock failed: {exc}") from exc
        flags = _flags(taken)
        held = [account for account, ok in zip(accounts, flags, strict=True) if ok]
        skipped = [account for account, ok in zip(accounts, flags, strict=True) if not ok]
        return HeldLocks(held, skipped, token, self)

    async def release(self, held: HeldLocks) -> list[int]:
        if not held.accounts:
            return []
        try:
            ids = ",".join(str(int(account)) for account in held.accounts)
            again = await self._release(args=[held.token, *self._key_prefixes(), ids])
        except RedisError as exc:
            raise ServiceUnavailable(f"redis release failed: {exc}") from exc
        return [account for account, asked in zip(held.accounts, _flags(again), strict=True) if asked]

    async def close(self) -> None:
        readiness.forget("redis")
        await self._client.aclose()
