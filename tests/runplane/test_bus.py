"""The bus on the real RabbitMQ: persistent publish with confirms, ack after the handler, requeue on
failure, poison messages dropped, trace context carried in headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
import pytest
from google.protobuf.message import Message
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from runplane import tracing
from runplane.bus import AmqpBus, Delivery, Handler, Topology
from runplane.settings import Settings
from runplane.v1 import bus_pb2


@pytest.fixture
async def bus(prefix: str) -> AsyncIterator[AmqpBus]:
    bus = await AmqpBus.connect(Settings().amqp_url)
    yield bus
    await bus.delete(Topology(prefix).pickup)
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
        seen.append(message.account_id)

    await _consume_until(bus, queue, handler, 5, seen)
    assert seen == [0, 1, 2, 3, 4]
    declared = await _passive_count(queue)
    assert declared == 0  # all acked


@pytest.fixture(scope="module")
def metric_reader() -> InMemoryMetricReader:
    """This process's meter provider, read in memory (the instruments are global, like in a service)."""
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def _counted(reader: InMemoryMetricReader, name: str, **attributes: str) -> float:
    data = reader.get_metrics_data()
    return sum(
        point.value
        for resource in (data.resource_metrics if data else [])
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points  # type: ignore[union-attr]
        if all(point.attributes.get(k) == v for k, v in attributes.items())  # type: ignore[union-attr]
    )


async def test_a_failing_handler_leaves_the_message_for_redelivery(
    bus: AmqpBus, prefix: str, metric_reader: InMemoryMetricReader
) -> None:
    queue = Topology(prefix).pickup
    await bus.publish(queue, bus_pb2.Pickup(account_id=7))

    async def failing(message: Message, delivery: Delivery) -> None:
        raise RuntimeError("effect not committed")

    with pytest.raises(RuntimeError):
        await asyncio.wait_for(bus.consume(queue, failing, prefetch=1, stop=asyncio.Event()), timeout=10)
    seen: list[object] = []

    async def handler(message: Message, delivery: Delivery) -> None:
        seen.append((message.account_id, delivery.redelivered))  # type: ignore[attr-defined]

    await _consume_until(bus, queue, handler, 1, seen)
    assert seen == [(7, True)]
    assert _counted(metric_reader, "runplane.bus.redeliveries", message_type="Pickup") == 1


async def test_an_undecodable_message_is_dropped_not_looped(bus: AmqpBus, prefix: str) -> None:
    queue = Topology(prefix).pickup
    await bus.declare(queue)
    connection = await aio_pika.connect(Settings().amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.default_exchange.publish(aio_pika.Message(b"\xff\xff", type="Nonsense"), routing_key=queue)
    await bus.publish(queue, bus_pb2.Pickup(account_id=3))
    seen: list[object] = []

    async def handler(message: Message, delivery: Delivery) -> None:
        seen.append(message.account_id)  # type: ignore[attr-defined]

    await _consume_until(bus, queue, handler, 1, seen)
    assert seen == [3]
    assert await _passive_count(queue) == 0


async def test_trace_context_crosses_the_bus(bus: AmqpBus, prefix: str) -> None:
    queue = Topology(prefix).pickup
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("publisher") as span:
        sent_trace = span.get_span_context().trace_id
        await bus.publish(queue, bus_pb2.Pickup(account_id=1))
    seen: list[object] = []

    async def handler(message: Message, delivery: Delivery) -> None:
        seen.append(trace.get_current_span().get_span_context().trace_id or tracing.extract(delivery.headers))
        seen.append(delivery.headers.get("traceparent"))

    await _consume_until(bus, queue, handler, 2, seen)
    traceparent = seen[1]
    assert isinstance(traceparent, str)
    assert traceparent.split("-")[1] == f"{sent_trace:032x}"


async def _passive_count(queue: str) -> int:
    connection = await aio_pika.connect(Settings().amqp_url)
    async with connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)
