"""Every Redis key runplane writes, in one place. All of them start with ``settings.redis_prefix``.

- ``{prefix}:lock:account:{account_id}``: an account's dispatch lock (dispatchers, ``runplane.locks``);
  the holder's token, expiring after the lock TTL.
- ``{prefix}:pickup:account:{account_id}``: set while a scheduler Pickup of the account waits on the
  bus (the scheduler loop, ``runplane.runs.pickups``).

Redis holds nothing that must survive: every key expires, and Postgres stays the truth.
"""

from __future__ import annotations


def account_lock(prefix: str, account_id: int) -> str:
    """The account's dispatch lock."""
    return f"{prefix}:lock:account:{account_id}"


def pending_pickup(prefix: str, account_id: int) -> str:
    """The mark of an account whose scheduler Pickup still waits on the bus."""
    return f"{prefix}:pickup:account:{account_id}"


def every_key(prefix: str) -> str:
    """A SCAN pattern matching every key under ``prefix``."""
    return f"{prefix}:*"
