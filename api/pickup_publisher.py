"""Telling dispatchers that an account has a new queued run (a Pickup on the bus).

The message is only a hint: the scheduler loop's periodic pass finds every queued run anyway. So
when RabbitMQ does not answer, the trigger still succeeds and a warning is logged; the connection
is tried again on a later trigger.
"""

from __future__ import annotations

import asyncio
import logging
import time

from runplane.adapters.bus import AmqpBus, Topology
from runplane.runs.pickups import send_pickups

log = logging.getLogger(__name__)


class PickupPublisher:
    def __init__(self, amqp_url: str, topology: Topology, *, timeout: float = 3.0, retry_after: float = 5.0) -> None:
        self._amqp_url = amqp_url
        self._topology = topology
        self._queue = topology.pickup
        self._timeout = timeout
        self._retry_after = retry_after
        self._bus: AmqpBus | None = None
        self._failed_at: float | None = None
        self._lock = asyncio.Lock()

    async def connect(self) -> bool:
        """Connect now if not connected; False (and a warning) when RabbitMQ does not answer."""
        return await self._connected() is not None

    async def publish(self, account_id: int) -> bool:
        """Send a Pickup for ``account_id``; False when it could not be sent."""
        bus = await self._connected()
        if bus is None:
            return False
        try:
            await asyncio.wait_for(send_pickups(bus, self._topology, [account_id], source="api"), self._timeout)
        except Exception as exc:  # a hint only: no bus failure may fail the trigger
            log.warning("pickup not published: %s", exc, extra={"account_id": account_id})
            async with self._lock:
                self._failed_at = time.monotonic()
                if self._bus is bus:
                    await self._drop()
            return False
        return True

    async def _connected(self) -> AmqpBus | None:
        async with self._lock:
            if self._bus is not None:
                return self._bus
            if self._failed_at is not None and time.monotonic() - self._failed_at < self._retry_after:
                return None
            try:
                self._bus = await asyncio.wait_for(AmqpBus.connect(self._amqp_url), self._timeout)
                await asyncio.wait_for(self._bus.declare(self._queue), self._timeout)
            except Exception as exc:  # a hint only: no bus failure may fail the trigger
                self._failed_at = time.monotonic()
                await self._drop()
                log.warning("bus unavailable; queued runs wait for the scheduler loop's pass: %s", exc)
                return None
            self._failed_at = None
            return self._bus

    async def close(self) -> None:
        async with self._lock:
            await self._drop()

    async def _drop(self) -> None:
        bus, self._bus = self._bus, None
        if bus is not None:
            try:
                await asyncio.wait_for(bus.close(), self._timeout)
            except Exception as exc:  # closing a broken connection may fail in many ways; it is gone either way
                log.debug("closing the bus connection failed: %s", exc)
