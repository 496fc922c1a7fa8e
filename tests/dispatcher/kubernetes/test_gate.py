"""The cluster gate on a real API server and the real RabbitMQ: while the cluster's kube-apiserver is
down, the dispatcher's consumer is cancelled and pickups wait in the queue (for the dispatchers of
other clusters); when it answers again, consuming resumes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from google.protobuf.message import Message

from dispatcher.kubernetes.gate import ClusterGate
from runplane.adapters.bus import AmqpBus, Delivery
from runplane.basics.settings import Settings
from runplane.v1 import bus_pb2
from tests.dispatcher.kubernetes.conftest import k8s_settings
from tests.support.kubernetes_cluster import ControlPlane
from tests.support.polling import eventually

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def plane() -> Iterator[ControlPlane]:
    """A cluster of this test's own: the test takes its API server down."""
    started = ControlPlane.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def bus(prefix: str) -> AsyncIterator[AmqpBus]:
    connection = await AmqpBus.connect(Settings().amqp_url)
    yield connection
    await connection.delete(f"{prefix}.pickup")
    await connection.close()


async def test_pickups_wait_while_the_cluster_api_is_down(plane: ControlPlane, bus: AmqpBus, prefix: str) -> None:
    queue = f"{prefix}.pickup"
    await bus.declare(queue)
    settings = k8s_settings(health_interval=0.2, health_failures=2)
    gate = ClusterGate(settings, configuration=plane.configuration())
    taken: list[int] = []

    async def on_pickup(message: Message, _delivery: Delivery) -> None:
        assert isinstance(message, bus_pb2.Pickup)
        taken.append(message.account_id)

    consuming: list[bool] = []  # one entry per consume() running

    async def consume(*, stop: asyncio.Event) -> None:
        consuming.append(True)
        try:
            await bus.consume(queue, on_pickup, prefetch=4, stop=stop)
        finally:
            consuming.pop()

    stop = asyncio.Event()
    probes = asyncio.create_task(gate.run(stop), name="test:gate")
    consumer = asyncio.create_task(gate.consume_while_open(consume, stop), name="test:consume")
    try:
        await bus.publish(queue, bus_pb2.Pickup(account_id=1))
        await eventually(lambda: taken == [1], 10)

        plane.stop_api_server()
        await eventually(lambda: not gate.is_open, 10)
        await eventually(lambda: not consuming, 10, what="the consumer to stop and close its channel")
        await bus.publish(queue, bus_pb2.Pickup(account_id=2))
        await asyncio.sleep(2.0)
        assert taken == [1]  # not taken by this dispatcher: it waits in the queue for another cluster's

        await asyncio.to_thread(plane.start_api_server, 60)
        await eventually(lambda: gate.is_open, 10)
        await eventually(lambda: taken == [1, 2], 10)  # consuming resumed, nothing lost
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(probes, consumer), timeout=10)


async def test_the_gate_closes_at_capacity(control_plane: ControlPlane) -> None:
    active = [0]
    gate = ClusterGate(
        k8s_settings(capacity=2), configuration=control_plane.configuration(), active_pods=lambda: active[0]
    )
    await gate.check()
    assert gate.is_open
    active[0] = 2
    await gate.check()
    assert not gate.is_open and gate.healthy  # full, not down: other clusters take the runs meanwhile
    active[0] = 1
    await gate.check()
    assert gate.is_open
    stop = asyncio.Event()
    stop.set()
    await gate.run(stop)  # closes its client
