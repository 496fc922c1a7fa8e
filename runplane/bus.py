"""The bus: RabbitMQ topology and at-least-once delivery of protobuf messages.

Queues (all durable, messages persistent, publisher confirms on, manual acks after the effect):

- ``{prefix}.assign``        Assign, shared by every queuer worker (round robin)
- ``{prefix}.worker.{id}``   Update / Revoke (and Assign when rebalancing) for one worker; deleted when the
                             worker is declared dead
- ``{prefix}.orchestrator``  Claimed / Heartbeat, to the leader
- ``{prefix}.pickup``        Pickup, shared by every dispatcher

The AMQP ``type`` property names the message so a queue can carry several kinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import aio_pika
import aio_pika.abc
import aiormq.exceptions
from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from runplane import instruments, tracing
from runplane.errors import ServiceUnavailable
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

MESSAGE_TYPES: dict[str, type[Message]] = {
    "Assign": bus_pb2.Assign,
    "Update": bus_pb2.Update,
    "Revoke": bus_pb2.Revoke,
    "Claimed": bus_pb2.Claimed,
    "Heartbeat": bus_pb2.Heartbeat,
    "Pickup": bus_pb2.Pickup,
}

Handler = Callable[[Message, "Delivery"], Awaitable[None]]


@dataclass(frozen=True)
class Topology:
    """Names of every queue, under one prefix (tests use a unique prefix each)."""

    prefix: str

    @property
    def assign(self) -> str:
        return f"{self.prefix}.assign"

    @property
    def orchestrator(self) -> str:
        return f"{self.prefix}.orchestrator"

    @property
    def pickup(self) -> str:
        return f"{self.prefix}.pickup"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}.worker.{worker_id}"


@dataclass(frozen=True)
class Delivery:
    """What a handler may want to know about the message beyond its body."""

    redelivered: bool
    headers: dict[str, object]


class Bus(Protocol):
    async def publish(self, queue: str, message: Message, headers: dict[str, object] | None = None) -> None: ...

    async def declare(self, queue: str) -> None: ...

    async def delete(self, queue: str) -> None: ...


def decode(message_type: str | None, body: bytes) -> Message:
    cls = MESSAGE_TYPES.get(message_type or "")
    if cls is None:
        raise ValueError(f"unknown message type {message_type!r}")
    msg = cls()
    msg.ParseFromString(body)
    return msg


class AmqpBus:
    """The real bus on RabbitMQ (aio-pika, robust connection: reconnects on its own)."""

    def __init__(
        self, connection: aio_pika.abc.AbstractRobustConnection, channel: aio_pika.abc.AbstractChannel
    ) -> None:
        self._connection = connection
        self._channel = channel
        self._declared: set[str] = set()

    @classmethod
    async def connect(cls, amqp_url: str) -> AmqpBus:
        try:
            connection = await aio_pika.connect_robust(amqp_url, timeout=15)
            channel = await connection.channel(publisher_confirms=True)
        except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
            raise ServiceUnavailable(f"cannot reach RabbitMQ at {_redact(amqp_url)}: {exc}") from exc
        return cls(connection, channel)

    async def close(self) -> None:
        await self._connection.close()

    async def declare(self, queue: str) -> None:
        if queue in self._declared:
            return
        await self._channel.declare_queue(queue, durable=True)
        self._declared.add(queue)

    async def delete(self, queue: str) -> None:
        with contextlib.suppress(aiormq.exceptions.ChannelNotFoundEntity):
            await self._channel.queue_delete(queue)
        self._declared.discard(queue)

    async def publish(self, queue: str, message: Message, headers: dict[str, object] | None = None) -> None:
        """Publish persistently to ``queue`` and wait for the broker's confirm."""
        await self.declare(queue)
        amqp_message = aio_pika.Message(
            body=message.SerializeToString(),
            type=type(message).__name__,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers=tracing.inject(headers),  # type: ignore[arg-type]
        )
        try:
            await self._channel.default_exchange.publish(amqp_message, routing_key=queue, mandatory=False)
        except (aiormq.exceptions.AMQPError, ConnectionError) as exc:
            raise ServiceUnavailable(f"publish to {queue} failed: {exc}") from exc

    async def consume(self, queue: str, handler: Handler, *, prefetch: int, stop: asyncio.Event) -> None:
        """Hand every message of ``queue`` to ``handler``; ack after it returns.

        Runs on its own channel until ``stop`` is set. A handler that raises leaves its message
        unacked (requeued) and the exception propagates: the supervisor stops the process.
        """
        channel = await self._connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        amqp_queue = await channel.declare_queue(queue, durable=True)
        try:
            async with amqp_queue.iterator() as messages:
                stop_wait = asyncio.ensure_future(stop.wait())
                try:
                    while not stop.is_set():
                        next_message = asyncio.ensure_future(messages.__anext__())
                        done, _ = await asyncio.wait({next_message, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                        if next_message not in done:
                            next_message.cancel()
                            break
                        incoming = next_message.result()
                        await self._handle(incoming, handler)
                finally:
                    stop_wait.cancel()
        finally:
            if not channel.is_closed:
                await channel.close()

    async def _handle(self, incoming: aio_pika.abc.AbstractIncomingMessage, handler: Handler) -> None:
        try:
            message = decode(incoming.type, incoming.body)
        except Exception:
            # Poison: nothing will ever read it, so say so and drop it rather than loop on it.
            log.error("dropping undecodable bus message", extra={"message_type": incoming.type})
            await incoming.reject(requeue=False)
            return
        if incoming.redelivered:  # a consumer died or failed before acking: this message is seen again
            instruments.bus_redeliveries.add(1, {"message_type": incoming.type or ""})
        headers: dict[str, object] = dict(incoming.headers or {})
        span_name = f"consume {incoming.type}"
        try:
            with _tracer.start_as_current_span(span_name, context=tracing.extract(headers), kind=SpanKind.CONSUMER):
                await handler(message, Delivery(bool(incoming.redelivered), headers))
        except BaseException:
            await incoming.nack(requeue=True)
            raise
        await incoming.ack()


def _redact(url: str) -> str:
    from runplane.db import redact

    return redact(url)
