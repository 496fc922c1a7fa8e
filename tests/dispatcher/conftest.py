"""Fixtures of the dispatcher tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from runplane.adapters.locks import RedisAccountLocks
from runplane.basics.settings import Settings


@pytest.fixture
async def locks(settings: Settings) -> AsyncIterator[RedisAccountLocks]:
    locks = RedisAccountLocks.from_url(settings.redis_url, prefix=settings.redis_prefix, ttl_ms=5000)
    yield locks
    await locks.close()
