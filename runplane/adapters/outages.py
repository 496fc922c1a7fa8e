"""Riding out an outage of Postgres, Redis or RabbitMQ: which errors mean "a dependency is down",
and the bounded backoff every service waits with before trying again.

A service never exits because a dependency restarted: its loops catch what :func:`is_transient`
names, wait ``Backoff.next()`` and try again; the readiness probe (``runplane.adapters.readiness``) reports
not-ready meanwhile.
"""

from __future__ import annotations

import aiormq.exceptions
import psycopg
import redis.exceptions

from runplane.basics.backoff import jittered
from runplane.basics.errors import ServiceUnavailable

_TRANSIENT: tuple[type[BaseException], ...] = (
    ServiceUnavailable,
    psycopg.OperationalError,  # includes psycopg_pool.PoolTimeout and a terminated backend
    psycopg.errors.AdminShutdown,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelInvalidStateError,  # a channel of a connection being restored
    ConnectionError,
    TimeoutError,
)


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` says a dependency is down (try again later), not that the work is wrong."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_transient(e) for e in exc.exceptions)
    return isinstance(exc, _TRANSIENT)


class Backoff:
    """The one backoff formula (``runplane.basics.backoff``) counting failures; ``reset`` after a success."""

    def __init__(self, first: float = 0.5, cap: float = 10.0) -> None:
        self.first = first
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        """Seconds to wait after one more failure."""
        self.failures += 1
        return jittered(self.first, self.failures, cap=self.cap)

    def reset(self) -> None:
        self.failures = 0
