"""A simulated RabbitMQ and the ``Bus`` each simulated process uses to reach it.

What it keeps of RabbitMQ: named durable queues, FIFO per publisher and queue, consumers taking one
message at a time in turn (round robin), a message acked after its handler returns and handed back
(at the head, marked redelivered) when its consumer's process dies or loses its connection, a
deleted queue losing its messages and cancelling its consumers (who declare it again and resume,
as ``AmqpBus``'s consumers do), a publish to a queue that does not exist going nowhere (the default
exchange, not mandatory), and each publisher's own cache of what it declared.

Faults it adds on purpose: an outage of the whole broker, one process cut off from it (partition),
and a lossy network that drops, duplicates and delays (so reorders) messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.message import Message

from runplane.adapters.bus import Delivery, Handler
from runplane.adapters.outages import is_transient
from runplane.basics.errors import ServiceUnavailable
from runplane.v1 import bus_pb2
from tests.simulation.order import WorkerOrder
from tests.simulation.process import Process

Trace = Callable[[str, str], None]


@dataclass
class Envelope:
    message: Message
    sender: str
    redelivered: bool = False


@dataclass
class SimQueue:
    name: str
    ready: deque[Envelope] = field(default_factory=deque)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    generation: int = 0  # a new queue of the same name after a delete is another queue
    consumers: int = 0  # consumers attached (a frozen process's stays attached)


@dataclass
class Lossy:
    drop: float = 0.0
    duplicate: float = 0.0
    max_delay: float = 0.0


class Broker:
    def __init__(self, rng: random.Random, trace: Trace) -> None:
        self.rng = rng
        self.trace = trace
        self.queues: dict[str, SimQueue] = {}
        self.down = False
        self.cut: set[str] = set()  # processes partitioned from the broker
        self.lossy = Lossy()
        self.latency = 0.002
        self._generations = 0
        self._last_arrival: dict[tuple[str, str], float] = {}
        self.changed = asyncio.Event()  # set on outage and partition changes: consumers look again

    def reachable(self, process: str) -> bool:
        return not self.down and process not in self.cut

    def declare(self, name: str) -> SimQueue:
        queue = self.queues.get(name)
        if queue is None:
            self._generations += 1
            queue = self.queues[name] = SimQueue(name, generation=self._generations)
        return queue

    def delete(self, name: str) -> None:
        queue = self.queues.pop(name, None)
        if queue is not None:
            self.trace("bus", f"queue {_short(name)} deleted with {len(queue.ready)} messages")
            queue.arrived.set()  # its consumers find it gone

    def publish(self, sender: str, name: str, message: Message) -> None:
        """Route ``message`` to ``name`` after the network's delay; a lossy network may drop or
        double it on the way."""
        loop = asyncio.get_running_loop()
        copies = 1
        if self.lossy.drop and self.rng.random() < self.lossy.drop:
            # Publisher confirms: a message is never lost unnoticed; the publish fails, before the
            # broker routed the message or after (the confirm was lost: the message is there).
            routed = self.rng.random() < 0.5
            self.trace(
                "bus", f"publish FAILED ({'routed' if routed else 'lost'}) {_describe(message)} → {_short(name)}"
            )
            if routed:
                loop.call_later(self.latency, self._arrive, name, Envelope(message, sender))
            raise ServiceUnavailable(f"publish to {name}: no confirm")
        if self.lossy.duplicate and self.rng.random() < self.lossy.duplicate:
            copies = 2
            self.trace("bus", f"DOUBLED {_describe(message)} → {_short(name)}")
        for _ in range(copies):
            delay = self.latency
            if self.lossy.max_delay:
                delay += self.rng.uniform(0, self.lossy.max_delay)  # may overtake: reordered
            else:
                # FIFO per publisher and queue, as on one AMQP channel.
                delay = max(delay, self._last_arrival.get((sender, name), 0.0) - loop.time())
            self._last_arrival[(sender, name)] = loop.time() + delay
            loop.call_later(delay, self._arrive, name, Envelope(message, sender))

    def _arrive(self, name: str, envelope: Envelope) -> None:
        queue = self.queues.get(name)
        if queue is None:
            self.trace("bus", f"unroutable {_describe(envelope.message)} → {_short(name)} (no queue)")
            return
        queue.ready.append(envelope)
        queue.arrived.set()

    def hand_back(self, name: str, generation: int, envelope: Envelope) -> None:
        """An unacked message goes back to the head of its queue (unless the queue is gone)."""
        queue = self.queues.get(name)
        if queue is None or queue.generation != generation:
            return
        envelope.redelivered = True
        queue.ready.appendleft(envelope)
        queue.arrived.set()

    def set_down(self, down: bool) -> None:
        self.down = down
        self.changed.set()
        self.changed = asyncio.Event()

    def set_cut(self, process: str, cut: bool) -> None:
        if cut:
            self.cut.add(process)
        else:
            self.cut.discard(process)
        self.changed.set()
        self.changed = asyncio.Event()


class SimBus:
    """One process's connection to the simulated broker; implements ``runplane.bus.Bus``."""

    def __init__(self, broker: Broker, process: Process, latency: Callable[[], float]) -> None:
        self.broker = broker
        self.process = process
        self.latency = latency
        self._declared: set[str] = set()
        self.order: WorkerOrder | None = None  # a worker's: what it does with each message is judged

    @property
    def connected(self) -> bool:
        return self.broker.reachable(self.process.name)

    def _check(self, what: str) -> None:
        if not self.connected:
            raise ServiceUnavailable(f"{what}: the broker is not reachable")

    async def declare(self, queue: str) -> None:
        await self.process.running()
        self._check(f"declare {queue}")
        if queue not in self._declared:
            await asyncio.sleep(self.latency())
        if queue not in self._declared:
            self.broker.declare(queue)
            self._declared.add(queue)

    async def delete(self, queue: str) -> None:
        await self.process.running()
        self._check(f"delete {queue}")
        self.broker.delete(queue)
        self._declared.discard(queue)

    async def consumers(self, queue: str) -> int:
        await self.process.running()
        self._check(f"count the consumers of {queue}")
        await asyncio.sleep(self.latency())
        found = self.broker.queues.get(queue)
        return found.consumers if found is not None else 0

    async def publish(self, queue: str, message: Message, headers: dict[str, object] | None = None) -> None:
        fault = self.process.before_send
        if fault is not None and isinstance(message, bus_pb2.Assign | bus_pb2.Update | bus_pb2.Revoke):
            self.process.before_send = None
            fault()
        await self.declare(queue)  # waits while the process is frozen
        await asyncio.sleep(self.latency())  # until the broker's confirm
        if isinstance(message, bus_pb2.Pickup):
            return  # no dispatcher here: the runs themselves are what the simulation checks
        if _worth_tracing(message):
            self.broker.trace(self.process.name, f"sends {_describe(message)} → {_short(queue)}")
        self.broker.publish(self.process.name, queue, message)

    async def consume(self, queue: str, handler: Handler, *, prefetch: int, stop: asyncio.Event) -> None:
        """Take messages one at a time while connected; after losing the connection or the queue,
        back off and consume again (declaring the queue again), as ``AmqpBus.consume`` does."""
        pause = 0.5
        while not stop.is_set():
            await self.process.running()
            if not self.connected:
                await _wait(stop, self.broker.changed, 1.0)
                continue
            current = self.broker.declare(queue)
            self._declared.add(queue)
            lost = await self._consume_once(current, handler, stop)
            await self.process.running()
            if lost:
                self._declared.discard(queue)
                await _wait(stop, None, pause)
                pause = min(pause * 2, 10.0)
            else:
                pause = 0.5

    async def _consume_once(self, queue: SimQueue, handler: Handler, stop: asyncio.Event) -> bool:
        """Consume until stopped (False) or the connection or the queue is lost (True)."""
        queue.consumers += 1
        try:
            return await self._consume_attached(queue, handler, stop)
        finally:
            queue.consumers -= 1

    async def _consume_attached(self, queue: SimQueue, handler: Handler, stop: asyncio.Event) -> bool:
        while not stop.is_set():
            if self.broker.queues.get(queue.name) is not queue or not self.connected:
                await self.process.running()  # a frozen process notices nothing until it runs again
                return True
            if not queue.ready:
                queue.arrived.clear()
                await _wait(stop, queue.arrived, None, self.broker.changed)
                continue
            envelope = queue.ready.popleft()
            try:
                await self.process.running()  # a paused process holds what was delivered to it
                if not self.connected or self.broker.queues.get(queue.name) is not queue:
                    self.broker.hand_back(queue.name, queue.generation, envelope)
                    return True
                if _worth_tracing(envelope.message):
                    self.broker.trace(
                        self.process.name, f"takes {_describe(envelope.message)} from {_short(queue.name)}"
                    )
                judged = self.order.handling(envelope.message) if self.order else contextlib.nullcontext()
                with judged:
                    await handler(envelope.message, Delivery(envelope.redelivered, {}))
            except asyncio.CancelledError:
                self.broker.hand_back(queue.name, queue.generation, envelope)
                raise
            except Exception as exc:
                if not is_transient(exc):
                    # AmqpBus sends it again later (and dead-letters it after too many tries): a
                    # handler's failure never loses the message, e.g. a deposed leader's claim.
                    self.broker.hand_back(queue.name, queue.generation, envelope)
                    raise
                self.broker.trace(self.process.name, f"hands back {_describe(envelope.message)}: {exc}")
                self.broker.hand_back(queue.name, queue.generation, envelope)
                await _wait(stop, None, 1.0)
        return False


async def _wait(stop: asyncio.Event, event: asyncio.Event | None, timeout: float | None, *more: asyncio.Event) -> None:
    events = [e for e in (stop, event, *more) if e is not None]
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _worth_tracing(message: Message) -> bool:
    """Everything but the steady beat of live workers."""
    return not isinstance(message, bus_pb2.Heartbeat) or message.registering


def _short(queue: str) -> str:
    return queue.split(".", 1)[-1]


def _describe(message: Message) -> str:
    """A message in a trace line: kind, stamp, jobs."""
    text = type(message).__name__
    stamp = getattr(message, "stamp", None)
    if stamp is not None and message.HasField("stamp"):
        text += f"({stamp.term}.{stamp.clock})"
    jobs: list[int] = []
    if isinstance(message, bus_pb2.Assign):
        jobs = [a.job.job_id for a in message.jobs]
    elif isinstance(message, bus_pb2.Revoke):
        jobs = list(message.job_ids)
        if message.drop_all:
            text += " DROP-ALL"
    elif isinstance(message, bus_pb2.Claimed):
        jobs = list(message.job_ids)
        text += f" of {message.worker_id}" + (" RELEASED" if message.released else "")
    elif isinstance(message, bus_pb2.Update):
        jobs = [message.job.job.job_id]
    elif isinstance(message, bus_pb2.Heartbeat):
        text += f" of {message.worker_id} registering={message.registering} held={message.jobs_owned}"
    if jobs:
        text += f" jobs={jobs}"
    return text
