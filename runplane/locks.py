"""Per-account Redis locks: a token and an expiry, released or extended only by their holder.

The lock is for efficiency (one dispatcher works an account at a time); correctness comes from
Postgres. A new lock object is made for every acquisition, so a token is never reused.
"""

from __future__ import annotations

import secrets
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runplane import redis_keys
from runplane.errors import ServiceUnavailable

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end
"""
_EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end
"""


class Lock(Protocol):
    token: str

    async def release(self) -> bool: ...

    async def extend(self) -> bool: ...


class AccountLocks(Protocol):
    async def acquire(self, account_id: int) -> Lock | None: ...


class RedisLock:
    def __init__(self, client: aioredis.Redis, key: str, token: str, ttl_ms: int) -> None:
        self._client = client
        self.key = key
        self.token = token
        self._ttl_ms = ttl_ms

    async def release(self) -> bool:
        """Delete the key if this lock still holds it; False when it had expired or moved on."""
        try:
            return bool(await self._client.eval(_RELEASE, 1, self.key, self.token))
        except RedisError as exc:
            raise ServiceUnavailable(f"redis release failed: {exc}") from exc

    async def extend(self) -> bool:
        try:
            return bool(await self._client.eval(_EXTEND, 1, self.key, self.token, self._ttl_ms))
        except RedisError as exc:
            raise ServiceUnavailable(f"redis extend failed: {exc}") from exc


class RedisAccountLocks:
    def __init__(self, client: aioredis.Redis, *, prefix: str, ttl_ms: int) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_ms = ttl_ms

    @classmethod
    def from_url(cls, url: str, *, prefix: str, ttl_ms: int) -> RedisAccountLocks:
        return cls(
            aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2), prefix=prefix, ttl_ms=ttl_ms
        )

    def key(self, account_id: int) -> str:
        return redis_keys.account_lock(self._prefix, account_id)

    async def acquire(self, account_id: int) -> RedisLock | None:
        """Take the account's lock, or None when another holder has it."""
        key = self.key(account_id)
        token = secrets.token_hex(16)
        try:
            taken = await self._client.set(key, token, nx=True, px=self._ttl_ms)
        except RedisError as exc:
            raise ServiceUnavailable(f"redis lock failed: {exc}") from exc
        return RedisLock(self._client, key, token, self._ttl_ms) if taken else None

    async def close(self) -> None:
        await self._client.aclose()
