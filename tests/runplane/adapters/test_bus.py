"""The bus on the real RabbitMQ: persistent publish with confirms, ack after the handler, requeue on
failure, poison messages dead-lettered without stopping the consumer, trace context carried in headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
import pytest
from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from runplane.adapters.bus import MAX_DELIVERIES, AmqpBus, Delivery, Handler, Topology
from runplane.basics.errors import ServiceUnavailable
from runplane.basics.settings import Settings
from runplane.v1 import bus_pb2
from tests.support.metrics import counted
from tests.support.polling import eventually


@pytest.fixture
async def bus(prefix: str) -> AsyncIterator[AmqpBus]:
    bus = await AmqpBus.connect(Settings().amqp_url)
    yield bus
    await bus.delete(Topology(prefix).pickup)
    await bus.delete(Topology(prefix).dead_letter)
    await bus.close()


async def _consume_until(bus: AmqpBus, queue: str, handler: Handler, count: int, seen: list[object]) -> None:
    """Consume until ``seen`` holds ``count`` items."""
    stop = asyncio.Event()

    async def counting(message: Message, delivery: Delivery) -> None:
        await handler(message, delivery)
        if len(seen) >= count:
            stop.set()

    await asyncio.wait_for(bus.consume(queue, counting, prefetch=4, stop=stop), timeout=20)


async def test_messages_arrive_in_order_and_are_acked(bus: AmqpBus, prefix: str) -> None:
    queue = Topology(prefix).pickup
    for account in range(5):
        await bus.publish(queue, bus_pb2.Pickup(account_id=account))
    seen: list[object] = []

    async def handler(message: Message, delivery: Delivery) -> None:
        assert isinstance(message, bus_pb2.Pickup)
        assert isinstance(message, bus_pb2.Pickup)
        seen.append(message.account_id)

    await _consume_until(bus, queue, handler, 5, seen)
    assert seen == [0, 1, 2, 3, 4]
    declared = await _passive_count(queue)
    assert declared == 0  # all acked


async def test_waiting_messages_are_taken_as_one_batch_and_acked_together(bus: AmqpBus, prefix: str) -> None:
    queue = Topology(prefix).pickup
    for account in range(6):
        await bus.publish(queue, bus_pb2.Pickup(account_ids=[account]))
    batches: list[list[int]] = []
    stop = asyncio.Event()

    async def handler(messages: list[Message]) -> None:
        batches.append([m.account_ids[0] for m in messages if isinstance(m, bus_pb2.Pickup)])
        if sum(len(b) for b in batches) >= 6:
            stop.set()

    await asyncio.wait_for(
        bus.consume_batches(queue, handler, prefetch=10, max_messages=4, max_wait=0.5, stop=stop), timeout=20
    )
    assert batches == [[0, 1, 2, 3], [4, 5]]  # at most max_messages; the rest within max_wait
    assert await _passive_count(queue) == 0


async def test_a_failed_batch_is_retried_whole_and_poison_in_it_goes_alone(bus: AmqpBus, prefix: str) -> None:
    queue = Topology(prefix).pickup
    await bus.publish(queue, bus_pb2.Pickup(account_ids=[1]))
    await bus.publish(queue, bus_pb2.Pickup(account_ids=[2]))
    calls: list[list[int]] = []
    stop = asyncio.Event()

    async def handler(messages: list[Message]) -> None:
        calls.append(sorted(m.account_ids[0] for m in messages if isinstance(m, bus_pb2.Pickup)))
        if len(calls) == 1:
            raise ValueError("first try fails")
        if sum(len(call) for call in calls[1:]) >= 2:
            stop.set()

    await asyncio.wait_for(
        bus.consume_batches(queue, handler, prefetch=10, max_messages=10, max_wait=0.3, stop=stop), timeout=20
    )
    assert calls[0] == [1, 2]
    assert sorted(a for call in calls[1:] for a in call) == [1, 2]  # each retried once, none lost
    assert await _passive_count(queue) == 0


async def test_a_message_no_handler_can_process_is_dead_lettered_and_the_consumer_lives_on(
    bus: AmqpBus, prefix: str, metric_reader: InMemoryMetricReader
) -> None:
    queue = Topology(prefix).pickup
    await bus.publish(queue, bus_pb2.Pickup(account_id=7))  # poison for this handler
    await bus.publish(queue, bus_pb2.Pickup(account_id=8))
    calls: list[tuple[int, bool]] = []
    handled: list[object] = []

    async def handler(message: Message, delivery: Delivery) -> None:
        assert isinstance(message, bus_pb2.Pickup)
        if message.account_id == 7:
            calls.append((message.account_id, delivery.redelivered))
            raise RuntimeError("x" * 5000)
        handled.append(message.account_id)

    stop = asyncio.Event()
    consumer = asyncio.create_task(bus.consume(queue, handler, prefetch=1, stop=stop))
    try:

        async def dead_lettered() -> bool:
            assert not consumer.done()
            return await _passive_count(Topology(prefix).dead_letter, declare=True) == 1

        await eventually(dead_lettered, 10, what="the poison message in the dead-letter queue")
    finally:
        stop.set()
        await asyncio.wait_for(consumer, timeout=10)
    assert handled and set(handled) == {8}
    assert len(calls) == MAX_DELIVERIES
    assert [redelivered for _, redelivered in calls] == [False] + [True] * (MAX_DELIVERIES - 1)
    assert await _passive_count(queue) == 0
    dead = await _take_one(Topology(prefix).dead_letter)
    assert dead.type == "Pickup" and bus_pb2.Pickup.FromString(dead.body).account_id == 7
    assert dead.headers["x-runplane-queue"] == queue
    error = str(dead.headers["x-runplane-error"])
    assert error.startswith("RuntimeError: xxx") and len(error) <= 500  # bounded, never the whole input
    assert counted(metric_reader, "runplane.bus.dead_lettered", message_type="Pickup", queue_kind="pickup") == 1


async def test_a_dependency_down_hands_the_message_back_uncounted(bus: AmqpBus, prefix: str) -> None:
    queue = Topology(prefix).pickup
    await bus.publish(queue, bus_pb2.Pickup(account_id=5))
    seen: list[object] = []
    bus.max_deliveries = 2

    async def flaky(message: Message, delivery: Delivery) -> None:
        seen.append(delivery.redelivered)
        if len(seen) <= 3:
            raise ServiceUnavailable("postgres is restarting")

    await _consume_until(bus, queue, flaky, 4, seen)
    assert seen == [False, True, True, True]
    assert await _passive_count(queue) == 0
    assert await _passive_count(Topology(prefix).dead_letter, declare=True) == 0


async def test_an_undecodable_message_is_dead_lettered_not_looped(bus: AmqpBus, prefix: str) -> None:
    queue = Topology(prefix).pickup
    await bus.declare(queue)
    connection = await aio_pika.connect(Settings().amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.default_exchange.publish(aio_pika.Message(b"\xff\xff", type="Nonsense"), routing_key=queue)
    await bus.publish(queue, bus_pb2.Pickup(account_id=3))
    seen: list[object] = []

    async def handler(message: Message, delivery: Delivery) -> None:
        assert isinstance(message, bus_pb2.Pickup)
        seen.append(message.account_id)

    await _consume_until(bus, queue, handler, 1, seen)
    assert seen == [3]
    assert await _passive_count(queue) == 0
    dead = await _take_one(Topology(prefix).dead_letter)
    assert dead.type == "Nonsense" and "unknown message type" in str(dead.headers["x-runplane-error"])


async def test_trace_context_crosses_the_bus(bus: AmqpBus, prefix: str) -> None:
    queue = Topology(prefix).pickup
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("publisher") as span:
        sent_trace = span.get_span_context().trace_id
        await bus.publish(queue, bus_pb2.Pickup(account_id=1))
    seen: list[object] = []

    async def handler(message: Message, delivery: Delivery) -> None:
        seen.append(trace.get_current_span().get_span_context().trace_id)  # the handler runs in the trace
        seen.append(delivery.headers.get("traceparent"))

    await _consume_until(bus, queue, handler, 2, seen)
    consumer_trace, traceparent = seen
    assert consumer_trace == sent_trace
    assert isinstance(traceparent, str)
    assert traceparent.split("-")[1] == f"{sent_trace:032x}"


async def _passive_count(queue: str, *, declare: bool = False) -> int:
    connection = await aio_pika.connect(Settings().amqp_url)
    async with connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=not declare, durable=True)
        return int(declared.declaration_result.message_count or 0)


async def _take_one(queue: str) -> aio_pika.abc.AbstractIncomingMessage:
    connection = await aio_pika.connect(Settings().amqp_url)
    async with connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, durable=True)
        message = await declared.get(no_ack=True, fail=True)
        assert message is not None
        return message


async def test_a_consumer_whose_queue_is_deleted_consumes_the_queue_made_again(bus: AmqpBus, prefix: str) -> None:
    # What a queuer worker's own queue goes through when the leader declares the worker dead.
    queue = Topology(prefix).worker("w1")
    seen: list[object] = []
    first = asyncio.Event()

    async def handler(message: Message, delivery: Delivery) -> None:
        assert isinstance(message, bus_pb2.Pickup)
        assert isinstance(message, bus_pb2.Pickup)
        seen.append(message.account_id)
        first.set()

    consuming = asyncio.create_task(_consume_until(bus, queue, handler, 2, seen))
    try:
        await bus.publish(queue, bus_pb2.Pickup(account_id=1))
        await asyncio.wait_for(first.wait(), timeout=10)
        await bus.delete(queue)  # the broker cancels the consumer
        await bus.publish(queue, bus_pb2.Pickup(account_id=2))  # into the queue made again
        await asyncio.wait_for(consuming, timeout=15)
    finally:
        consuming.cancel()
        await bus.delete(queue)
    assert seen == [1, 2]
