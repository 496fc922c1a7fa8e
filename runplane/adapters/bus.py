"""The bus: RabbitMQ topology and at-least-once delivery of protobuf messages.

Queues (all durable, messages persistent, publisher confirms on, manual acks after the effect):

- ``{prefix}.assign``        Assign, shared by every queuer worker (round robin)
- ``{prefix}.worker.{id}``   Update / Revoke (and Assign when rebalancing) for one worker; deleted when the
                             worker is declared dead
- ``{prefix}.orchestrator``  Claimed / Heartbeat, to the leader
- ``{prefix}.pickup``        Pickup, shared by every dispatcher
- ``{prefix}.dead-letter``   what no handler could process, with the queue it came from and the error

No message can stop a consumer. A handler that fails because a dependency is down (Postgres, Redis,
the broker) leaves its message for later and the consumer backs off; any other failure counts a
delivery (header ``x-runplane-deliveries``) and the message goes to the back of its queue, until after
``MAX_DELIVERIES`` it is moved to the dead-letter queue, counted in ``runplane.bus.dead_lettered`` and
shown by ``runplane status``.

The AMQP ``type`` property names the message so a queue can carry several kinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import aio_pika
import aio_pika.abc
import aiormq.exceptions
from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from runplane.adapters import instruments, readiness, tracing
from runplane.adapters.outages import Backoff, is_transient
from runplane.basics.errors import ServiceUnavailable
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
# Takes the messages of one batch together; the batch is acked (or handed back) as a whole.
BatchHandler = Callable[[list[Message]], Awaitable[None]]


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

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}.dead-letter"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}.worker.{worker_id}"


_Handle = Callable[[list[aio_pika.abc.AbstractIncomingMessage]], Awaitable[None]]


@dataclass(frozen=True)
class _Intake:
    """How a consumer takes messages: at most ``prefetch`` unacked, and up to ``max_messages`` handled
    together, gathered for at most ``max_wait`` seconds after the first."""

    prefetch: int
    max_messages: int = 1
    max_wait: float = 0.0


class _ConsumerLost(Exception):
    """The broker stopped delivering to this consumer (its iterator ended)."""


# A broker call that takes longer is treated as the broker being away (a publish awaiting a confirm
# on a channel that died with its connection would otherwise wait forever).
_BROKER_TIMEOUT = 10.0

# Deliveries of one message that fail in its handler before it is moved to the dead-letter queue.
MAX_DELIVERIES = 5
DELIVERIES_HEADER = "x-runplane-deliveries"
_MAX_ERROR_TEXT = 500


@dataclass(frozen=True)
class Delivery:
    """What a handler may want to know about the message beyond its body."""

    redelivered: bool
    headers: dict[str, object]


class Bus(Protocol):
    """What the services need of the broker; ``AmqpBus`` is the real one, the deterministic
    simulator has its own."""

    @property
    def connected(self) -> bool:
        """False while the broker cannot be reached."""
        ...

    async def publish(self, queue: str, message: Message, headers: dict[str, object] | None = None) -> None: ...

    async def declare(self, queue: str) -> None: ...

    async def delete(self, queue: str) -> None: ...

    async def consumers(self, queue: str) -> int:
        """How many consumers are attached to ``queue`` now (0 when it does not exist)."""
        ...

    async def consume(self, queue: str, handler: Handler, *, prefetch: int, stop: asyncio.Event) -> None:
        """Hand every message of ``queue`` to ``handler``, one at a time, acked after it returns,
        until ``stop`` is set."""
        ...


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
        self,
        connection: aio_pika.abc.AbstractRobustConnection,
        channel: aio_pika.abc.AbstractChannel,
        *,
        max_deliveries: int = MAX_DELIVERIES,
    ) -> None:
        self._connection = connection
        self._channel = channel
        self._declared: set[str] = set()
        self.max_deliveries = max_deliveries
        # How long a consumer waits before handing back a message whose handler found a dependency down.
        self._unavailable = Backoff()

    @classmethod
    async def connect(cls, amqp_url: str, *, max_deliveries: int = MAX_DELIVERIES) -> AmqpBus:
        try:
            connection = await aio_pika.connect_robust(amqp_url, timeout=15)
            channel = await connection.channel(publisher_confirms=True)
        except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
            raise ServiceUnavailable(f"cannot reach RabbitMQ at {_redact(amqp_url)}: {exc}") from exc
        bus = cls(connection, channel, max_deliveries=max_deliveries)

        async def connected() -> bool:
            return bus.connected

        readiness.register("rabbitmq", connected)
        return bus

    @property
    def connected(self) -> bool:
        """False while the connection to the broker is down (the robust connection is reconnecting)."""
        return not self._connection.is_closed and self._connection.connected.is_set()

    async def close(self) -> None:
        readiness.forget("rabbitmq")
        await self._connection.close()

    async def declare(self, queue: str) -> None:
        if queue in self._declared:
            return
        try:
            await asyncio.wait_for(self._channel.declare_queue(queue, durable=True), _BROKER_TIMEOUT)
        except (aiormq.exceptions.AMQPConnectionError, aiormq.exceptions.ChannelInvalidStateError, TimeoutError) as exc:
            raise ServiceUnavailable(f"declare {queue} failed: {exc}") from exc
        self._declared.add(queue)

    async def delete(self, queue: str) -> None:
        with contextlib.suppress(aiormq.exceptions.ChannelNotFoundEntity):
            await self._channel.queue_delete(queue)
        self._declared.discard(queue)

    async def consumers(self, queue: str) -> int:
        # A passive declare that fails closes its channel: ask on a channel of its own.
        try:
            channel = await asyncio.wait_for(self._connection.channel(), _BROKER_TIMEOUT)
        except RuntimeError as exc:  # "Connection was not opened": the robust connection is reconnecting
            raise ServiceUnavailable(f"no channel to count the consumers of {queue}: {exc}") from exc
        try:
            declared = await asyncio.wait_for(channel.declare_queue(queue, passive=True), _BROKER_TIMEOUT)
            return int(declared.declaration_result.consumer_count or 0)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return 0
        except (aiormq.exceptions.AMQPConnectionError, TimeoutError) as exc:
            raise ServiceUnavailable(f"counting the consumers of {queue} failed: {exc}") from exc
        finally:
            if not channel.is_closed:
                with contextlib.suppress(aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError):
                    await channel.close()

    async def publish(self, queue: str, message: Message, headers: dict[str, object] | None = None) -> None:
        """Publish persistently to ``queue`` and wait for the broker's confirm."""
        await self.declare(queue)
        amqp_message = aio_pika.Message(
            body=message.SerializeToString(),
            type=type(message).__name__,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers=_field_table(tracing.inject(headers)),
        )
        await self._publish(queue, amqp_message)

    async def _publish(self, queue: str, amqp_message: aio_pika.Message) -> None:
        try:
            await asyncio.wait_for(
                self._channel.default_exchange.publish(amqp_message, routing_key=queue, mandatory=False),
                _BROKER_TIMEOUT,
            )
        except (
            aiormq.exceptions.AMQPError,
            ConnectionError,
            aiormq.exceptions.ChannelInvalidStateError,
            TimeoutError,
        ) as exc:
            # ChannelInvalidStateError (a RuntimeError) is what a channel says while the robust
            # connection is being restored after a broker restart.
            raise ServiceUnavailable(f"publish to {queue} failed: {exc!r}") from exc

    async def consume(self, queue: str, handler: Handler, *, prefetch: int, stop: asyncio.Event) -> None:
        """Hand every message of ``queue`` to ``handler``; ack after it returns.

        Runs on its own channel until ``stop`` is set. What a handler raises never stops the
        consumer: see the module docstring for where the message goes. A consumer whose channel or
        iterator fails (the broker restarted) is started again on a new channel, after a bounded
        backoff; the queue is declared again on the way.
        """

        async def handle(batch: list[aio_pika.abc.AbstractIncomingMessage]) -> None:
            await self._handle(queue, batch[0], handler)

        await self._consume(queue, handle, _Intake(prefetch), stop)

    async def consume_batches(
        self,
        queue: str,
        handler: BatchHandler,
        *,
        prefetch: int,
        max_messages: int,
        max_wait: float,
        stop: asyncio.Event,
    ) -> None:
        """As :meth:`consume`, but ``handler`` takes up to ``max_messages`` messages at once: those
        that arrive within ``max_wait`` seconds of the first (at once when they are already waiting).

        The batch is acked after the handler returns. A handler that finds a dependency down hands
        the whole batch back; any other failure counts a delivery of each message (as :meth:`consume`).
        """

        async def handle(batch: list[aio_pika.abc.AbstractIncomingMessage]) -> None:
            await self._handle_batch(queue, batch, handler)

        await self._consume(queue, handle, _Intake(prefetch, max(1, max_messages), max_wait), stop)

    async def _consume(self, queue: str, handle: _Handle, intake: _Intake, stop: asyncio.Event) -> None:
        backoff = Backoff(first=0.5, cap=10.0)
        while not stop.is_set():
            try:
                await self._consume_once(queue, handle, intake, stop, backoff)
            except Exception as exc:
                if not (is_transient(exc) or isinstance(exc, _ConsumerLost | aiormq.exceptions.AMQPError)):
                    raise
                pause = backoff.next()
                log.warning(
                    "consumer lost; consuming again", extra={"queue": queue, "error": repr(exc), "pause": pause}
                )
                self._declared.discard(queue)
                await _sleep_or_stop(stop, pause)

    async def _consume_once(
        self, queue: str, handle: _Handle, intake: _Intake, stop: asyncio.Event, backoff: Backoff
    ) -> None:
        try:
            channel = await asyncio.wait_for(self._connection.channel(), _BROKER_TIMEOUT)
        except RuntimeError as exc:  # "Connection was not opened": the robust connection is reconnecting
            raise ServiceUnavailable(f"no channel for {queue}: {exc}") from exc
        try:
            await channel.set_qos(prefetch_count=intake.prefetch)
            amqp_queue = await channel.declare_queue(queue, durable=True)
            async with amqp_queue.iterator() as messages:
                stop_wait = asyncio.ensure_future(stop.wait())
                next_message: asyncio.Future[aio_pika.abc.AbstractIncomingMessage] | None = None

                async def take(timeout: float | None) -> aio_pika.abc.AbstractIncomingMessage | None:
                    """The next message; None on stop or when ``timeout`` passes first."""
                    nonlocal next_message
                    if next_message is None:
                        next_message = asyncio.ensure_future(messages.__anext__())
                    waiting: set[asyncio.Future[Any]] = {next_message, stop_wait}
                    done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                    if next_message not in done:
                        return None
                    try:
                        incoming = next_message.result()
                    except StopAsyncIteration as exc:
                        raise _ConsumerLost(f"the iterator of {queue} ended") from exc
                    finally:
                        next_message = None
                    return incoming

                try:
                    while not stop.is_set():
                        first = await take(None)
                        if first is None:
                            break
                        batch = [first]
                        deadline = asyncio.get_running_loop().time() + intake.max_wait
                        while len(batch) < intake.max_messages:
                            # Messages already delivered are taken without waiting; then up to the deadline.
                            more = await take(max(0.0, deadline - asyncio.get_running_loop().time()))
                            if more is None:
                                break
                            batch.append(more)
                        backoff.reset()
                        await handle(batch)
                finally:
                    stop_wait.cancel()
                    if next_message is not None and not next_message.done():
                        next_message.cancel()
        finally:
            if not channel.is_closed:
                with contextlib.suppress(
                    aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError, TimeoutError
                ):
                    await asyncio.wait_for(channel.close(), _BROKER_TIMEOUT)

    async def _handle_batch(
        self, queue: str, batch: list[aio_pika.abc.AbstractIncomingMessage], handler: BatchHandler
    ) -> None:
        kept: list[tuple[aio_pika.abc.AbstractIncomingMessage, Message, dict[str, object]]] = []
        for incoming in batch:
            try:
                message = decode(incoming.type, incoming.body)
            except Exception as exc:
                await self._dead_letter(queue, incoming, exc)  # poison: no handler will ever read it
                continue
            headers: dict[str, object] = dict(incoming.headers or {})
            if bool(incoming.redelivered) or _deliveries(headers) > 0:
                instruments.bus_redeliveries.add(1, {"message_type": incoming.type or ""})
            kept.append((incoming, message, headers))
        if not kept:
            return
        try:
            with _tracer.start_as_current_span(
                "consume batch", kind=SpanKind.CONSUMER, attributes={"messaging.batch.message_count": len(kept)}
            ):
                await handler([message for _, message, _ in kept])
        except asyncio.CancelledError:
            for incoming, _, _ in kept:
                await self._settle(incoming.nack(requeue=True))
            raise
        except Exception as exc:
            if is_transient(exc):
                await self._back_off(queue, [incoming for incoming, _, _ in kept], exc)
                return
            for incoming, _, headers in kept:
                failed_before = _deliveries(headers)
                if failed_before + 1 >= self.max_deliveries:
                    await self._dead_letter(queue, incoming, exc)
                else:
                    await self._retry_later(queue, incoming, headers, failed_before + 1, exc)
            return
        self._unavailable.reset()
        for incoming, _, _ in kept:
            await self._settle(incoming.ack())

    async def _handle(self, queue: str, incoming: aio_pika.abc.AbstractIncomingMessage, handler: Handler) -> None:
        try:
            message = decode(incoming.type, incoming.body)
        except Exception as exc:
            # Poison: no handler will ever read it.
            await self._dead_letter(queue, incoming, exc)
            return
        headers: dict[str, object] = dict(incoming.headers or {})
        failed_before = _deliveries(headers)
        redelivered = bool(incoming.redelivered) or failed_before > 0
        if redelivered:  # a consumer died or failed before acking: this message is seen again
            instruments.bus_redeliveries.add(1, {"message_type": incoming.type or ""})
        span_name = f"consume {incoming.type}"
        try:
            with _tracer.start_as_current_span(span_name, context=tracing.extract(headers), kind=SpanKind.CONSUMER):
                await handler(message, Delivery(redelivered, headers))
        except asyncio.CancelledError:
            await self._settle(incoming.nack(requeue=True))
            raise
        except Exception as exc:
            if is_transient(exc):
                await self._back_off(queue, [incoming], exc)
            elif failed_before + 1 >= self.max_deliveries:
                await self._dead_letter(queue, incoming, exc)
            else:
                await self._retry_later(queue, incoming, headers, failed_before + 1, exc)
            return
        self._unavailable.reset()
        await self._settle(incoming.ack())

    async def _back_off(self, queue: str, messages: list[aio_pika.abc.AbstractIncomingMessage], exc: Exception) -> None:
        """A dependency is down: hand the messages back uncounted, after a pause that grows to a bound."""
        pause = self._unavailable.next()
        log.warning(
            "handler found a dependency down; message handed back",
            extra={
                "queue": queue,
                "message_type": messages[0].type,
                "messages": len(messages),
                "error": _error_text(exc),
                "pause": pause,
            },
        )
        await asyncio.sleep(pause)
        for incoming in messages:
            await self._settle(incoming.nack(requeue=True))

    async def _retry_later(
        self,
        queue: str,
        incoming: aio_pika.abc.AbstractIncomingMessage,
        headers: dict[str, object],
        deliveries: int,
        exc: Exception,
    ) -> None:
        """Count the failed delivery and put the message at the back of its queue (confirm, then ack)."""
        log.warning(
            "handler failed; message retried later",
            extra={"queue": queue, "message_type": incoming.type, "deliveries": deliveries, "error": _error_text(exc)},
        )
        copy = _copy(incoming, {**headers, DELIVERIES_HEADER: deliveries})
        try:
            await self._publish(queue, copy)
        except ServiceUnavailable:
            await self._settle(incoming.nack(requeue=True))
            return
        await self._settle(incoming.ack())

    async def _dead_letter(self, queue: str, incoming: aio_pika.abc.AbstractIncomingMessage, exc: Exception) -> None:
        """Move a message no handler can process to the dead-letter queue, with where it came from and why."""
        target = _dead_letter_queue(queue)
        log.error(
            "message moved to the dead-letter queue",
            extra={
                "queue": queue,
                "dead_letter_queue": target,
                "message_type": incoming.type,
                "error": _error_text(exc),
            },
        )
        headers: dict[str, object] = {
            **dict(incoming.headers or {}),
            "x-runplane-queue": queue,
            "x-runplane-error": _error_text(exc),
        }
        try:
            await self.declare(target)
            await self._publish(target, _copy(incoming, headers))
        except ServiceUnavailable:
            await self._settle(incoming.nack(requeue=True))
            return
        instruments.bus_dead_lettered.add(1, {"message_type": incoming.type or "", "queue_kind": _queue_kind(queue)})
        await self._settle(incoming.ack())

    @staticmethod
    async def _settle(settle: Awaitable[object]) -> None:
        """Ack or nack; on a channel that died meanwhile the broker redelivers the message anyway."""
        try:
            await settle
        except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError, ConnectionError) as exc:
            log.warning("ack/nack lost with its channel; the broker redelivers", extra={"error": repr(exc)})


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


def _deliveries(headers: dict[str, object]) -> int:
    value = headers.get(DELIVERIES_HEADER)
    return value if isinstance(value, int) and value >= 0 else 0


def _copy(incoming: aio_pika.abc.AbstractIncomingMessage, headers: dict[str, object]) -> aio_pika.Message:
    return aio_pika.Message(
        body=incoming.body,
        type=incoming.type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers=_field_table(headers),
    )


def _field_table(headers: dict[str, object]) -> aio_pika.abc.HeadersType:
    """Headers as an AMQP field table: their values are the broker's own (from a message's headers) or the
    strings and counts runplane adds, all of them field values."""
    return cast("aio_pika.abc.HeadersType", headers)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_TEXT]


def _dead_letter_queue(queue: str) -> str:
    """``{prefix}.dead-letter`` for any queue ``{prefix}.…``."""
    return f"{queue.split('.', 1)[0]}.dead-letter"


def _queue_kind(queue: str) -> str:
    """assign, worker, orchestrator or pickup: a low-cardinality label (worker queues carry an id)."""
    parts = queue.split(".")
    return parts[1] if len(parts) > 1 else queue


async def dead_letter_count(amqp_url: str, topology: Topology) -> int:
    """Messages waiting in the dead-letter queue (0 when it was never made)."""
    try:
        connection = await aio_pika.connect(amqp_url, timeout=5)
    except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
        raise ServiceUnavailable(f"cannot reach RabbitMQ at {_redact(amqp_url)}: {exc}") from exc
    async with connection:
        channel = await connection.channel()
        try:
            declared = await channel.declare_queue(topology.dead_letter, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return 0
        return int(declared.declaration_result.message_count or 0)


def _redact(url: str) -> str:
    from runplane.adapters.db import redact

    return redact(url)
