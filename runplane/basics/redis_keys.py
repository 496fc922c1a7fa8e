"""Every Redis key runplane writes, in one place. All of them start with ``settings.redis_prefix``.

- ``{prefix}:lock:account:{account_id}``: an account's dispatch lock (dispatchers, ``runplane.adapters.locks``);
  the holder's token, expiring after the lock TTL.
- ``{prefix}:again:account:{account_id}``: set by a dispatcher that found the account's lock held
  (``runplane.adapters.locks``); the holder reads and clears it when it releases the lock, and sends the
  account a Pickup again, so a pickup that arrived during the holder's pass is not lost. Expires
  with the lock TTL.
- ``{prefix}:pickup:account:{account_id}``: set while a scheduler Pickup of the account waits on the
  bus (the scheduler loop, ``runplane.runs.pickups``).

Redis holds nothing that must survive: every key expires, and Postgres stays the truth.
"""

from __future__ import annotations


def account_lock(prefix: str, account_id: int | str = "") -> str:
    """The account's dispatch lock (without an account: what every such key starts with)."""
    return f"{prefix}:lock:account:{account_id}"


def account_again(prefix: str, account_id: int | str = "") -> str:
    """Set while a dispatcher's pickup of the account found the lock held: dispatch again after release
    (without an account: what every such key starts with)."""
    return f"{prefix}:again:account:{account_id}"


def pending_pickup(prefix: str, account_id: int | str = "") -> str:
    """The mark of an account whose scheduler Pickup still waits on the bus (without an account: what
    every such key starts with)."""
    return f"{prefix}:pickup:account:{account_id}"


def every_key(prefix: str) -> str:
    """A SCAN pattern matching every key under ``prefix``."""
    return f"{prefix}:*"
