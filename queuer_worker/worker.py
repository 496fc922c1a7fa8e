"""A queuer worker: applies the orchestrator's messages to its cron heap and queues runs on time.

It consumes the shared Assign queue (round robin with the other workers) and its own queue
(Update, Revoke, and Assigns aimed at it when jobs are rebalanced), heartbeats to the leader, and
sleeps until the head of its heap is due or a message changes the heap.

What a message does to the heap, and what the worker says in return, is decided by ``Holdings``
(``holdings.py``, no I/O); this class does the sending, storing, sleeping and firing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from google.protobuf.message import Message

from queuer_worker import metrics
from queuer_worker.firing import PreparedTick, prepare_chunks
from queuer_worker.forecast import Forecaster
from queuer_worker.heap import CronHeap, Definition
from queuer_worker.holdings import Holdings
from queuer_worker.runs_store import RunsStore
from runplane.adapters.bus import Bus, Delivery, Topology
from runplane.adapters.outages import Backoff, is_transient
from runplane.basics.errors import ServiceUnavailable
from runplane.basics.settings import Settings
from runplane.basics.stamps import StampGate
from runplane.basics.supervise import sleep_or_stop, spawn, wait_any
from runplane.basics.wall_clock import SYSTEM_CLOCK, WallClock
from runplane.runs.pickups import send_pickups
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)

# The fire loop re-reads the clock at least this often, so a wall-clock jump is noticed.
_MAX_SLEEP = 30.0
_INSERT_ATTEMPTS = 3
_MIN_BEAT_GAP = 0.2
# How long before a fire its statement is prepared (due jobs taken off the heap, parameters built).
_PREPARE_AHEAD = 0.5
LEAVE_TIMEOUT = 5.0  # seconds a stopping worker gives the broker to delete its queue


class QueuerWorker:
    def __init__(
        self,
        settings: Settings,
        bus: Bus,
        runs: RunsStore,
        worker_id: str,
        *,
        wall_clock: WallClock = SYSTEM_CLOCK,
        forecaster: Forecaster | None = None,
        heap: CronHeap | None = None,
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.runs = runs
        self.worker_id = worker_id
        self.topology = Topology(settings.bus_prefix)
        self.holdings = Holdings(worker_id, heap)
        self.wall_clock = wall_clock
        self._wake = asyncio.Event()
        self._held_changed = asyncio.Event()
        self._dropped = asyncio.Event()  # a drop-everything applied
        self.forecaster = forecaster  # what this worker's heap will fire, published (none: not published)
        metrics.observe_jobs_owned(worker_id, lambda: len(self.heap))

    @property
    def heap(self) -> CronHeap:
        return self.holdings.heap

    @property
    def gate(self) -> StampGate:
        return self.holdings.gate

    @property
    def own_queue(self) -> str:
        return self.topology.worker(self.worker_id)

    async def run(self, stop: asyncio.Event) -> None:
        await self.bus.declare(self.own_queue)
        async with asyncio.TaskGroup() as group:
            # prefetch 1 on the shared queue: Assigns spread one message at a time over the workers.
            spawn(
                group,
                "queuer:assign",
                self.bus.consume(self.topology.assign, self.on_message, prefetch=1, stop=stop),
                eternal=True,
                stop=stop,
            )
            spawn(group, "queuer:own-queue", self._consume_own(stop), eternal=True, stop=stop)
            spawn(group, "queuer:heartbeat", self._heartbeat(stop), eternal=True, stop=stop)
            spawn(group, "queuer:fire", self._fire_loop(stop), eternal=True, stop=stop)
            if self.forecaster is not None:
                spawn(
                    group,
                    "queuer:forecast",
                    self.forecaster.run(self.heap.jobs, self.wall_clock.now, stop),
                    eternal=True,
                    stop=stop,
                )
        if stop.is_set():
            await self._leave()

    async def _leave(self) -> None:
        """A worker that stops takes its own queue with it. The leader deletes the queue of a worker it
        declares dead, but only of one it heard from: a worker stopped before its first heartbeat was
        recorded would leave its queue on the broker for good. What the queue still holds was for this
        worker alone; the leader gives its jobs to others once it counts it dead."""
        try:
            await asyncio.wait_for(self.bus.delete(self.own_queue), LEAVE_TIMEOUT)
        except Exception as exc:
            if not (isinstance(exc, TimeoutError) or is_transient(exc)):
                raise
            log.warning("own queue not deleted; the leader deletes it", extra={"queue": self.own_queue})

    # -- messages ---------------------------------------------------------------------------------

    async def on_message(self, message: Message, _delivery: Delivery) -> None:
        """Apply ``message`` to the holdings (``holdings.py`` decides), then send and store what that
        asks for."""
        if isinstance(message, bus_pb2.Assign):
            self._changed_kinds(assignment.job.job_id for assignment in message.jobs)
            await self._on_assign(message)
        elif isinstance(message, bus_pb2.Update):
            self._changed_kinds([message.job.job.job_id])
            applied, never = self.holdings.update(message, self.wall_clock.now())
            metrics.messages_applied.add(1, {"kind": "update", "applied": applied})
            await self._deactivate_never_fires([never] if never else [])
        elif isinstance(message, bus_pb2.Revoke):
            self._changed_kinds(message.job_ids)
            applied = self.holdings.revoke(message)
            metrics.messages_applied.add(1, {"kind": "drop_all" if message.drop_all else "revoke", "applied": applied})
            if message.drop_all and applied:
                self._dropped.set()
        else:
            log.warning("unexpected message on a queuer queue", extra={"message_type": type(message).__name__})
        self._wake.set()
        self._held_changed.set()

    def _changed_kinds(self, job_ids: Iterable[int]) -> None:
        if self.forecaster is not None:
            self.forecaster.forget(job_ids)

    async def _on_assign(self, message: bus_pb2.Assign) -> None:
        taken = self.holdings.assign(message, self.wall_clock.now())
        await self._deactivate_never_fires(taken.never_fires)
        metrics.messages_applied.add(1, {"kind": "assign", "applied": taken.claimed is not None})
        if taken.claimed is None:
            return
        try:
            await self.bus.publish(self.topology.orchestrator, taken.claimed)
        except ServiceUnavailable:
            self.holdings.claim_failed(taken)
            raise
        if not taken.missed:
            return
        try:
            await self.runs.record_missed(taken.missed)
        except Exception as exc:
            if not is_transient(exc):
                raise
            # Postgres is away: the jobs are held and fire; only the record of what was missed is lost.
            log.warning("missed occurrences not recorded", extra={"count": len(taken.missed), "error": repr(exc)})

    async def _deactivate_never_fires(self, jobs: list[Definition]) -> None:
        """A schedule with no next fire is its job's error: the job is deactivated with the reason and
        the message that carried it is acked like any other."""
        for defn in jobs:
            await self.runs.deactivate_never_fires(defn.job_id, defn.version, defn.cron, defn.timezone)

    async def _consume_own(self, stop: asyncio.Event) -> None:
        # When the leader declares this worker dead it deletes this queue; the robust connection
        # then re-declares it and resumes, and the leader's drop-everything Revoke arrives here.
        await self.bus.consume(self.own_queue, self.on_message, prefetch=self.settings.queuer.prefetch, stop=stop)

    # -- heartbeats -------------------------------------------------------------------------------

    async def _send_releases(self) -> None:
        """Tell the leader of the Assigns let go after their Claimed got no confirm, until it hears."""
        while (release := self.holdings.next_release()) is not None:
            try:
                await self.bus.publish(self.topology.orchestrator, release)
            except ServiceUnavailable:
                return  # at the next beat
            self.holdings.release_sent()

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        interval = self.settings.orchestrator.heartbeat_interval
        while not stop.is_set():
            await self._send_releases()
            beat = self.holdings.heartbeat(self.wall_clock.now())
            try:
                await self.bus.publish(self.topology.orchestrator, beat)
            except ServiceUnavailable:
                log.warning("heartbeat not sent", extra={"worker_id": self.worker_id})
            else:
                self.holdings.beat_sent(beat)
            # Next beat after the interval, or sooner when the held jobs changed, so the leader's view
            # (count and digest) follows changes closely; never more often than _MIN_BEAT_GAP.
            if await sleep_or_stop(stop, _MIN_BEAT_GAP):
                return
            self._held_changed.clear()
            await wait_any(stop, self._held_changed, timeout=interval - _MIN_BEAT_GAP)

    # -- firing -----------------------------------------------------------------------------------

    async def _fire_loop(self, stop: asyncio.Event) -> None:
        heard = False  # the leader was heard since the fire loop last found itself late
        while not stop.is_set():
            self._wake.clear()
            head = self.heap.next_due()
            now = self.wall_clock.now()
            if head is None or head - now > _PREPARE_AHEAD:
                wait = _MAX_SLEEP if head is None else min(_MAX_SLEEP, head - now - _PREPARE_AHEAD)
                await self.wall_clock.sleep(wait, stop, self._wake)
                continue
            if now - head > self.settings.orchestrator.heartbeat_interval and not heard:
                await self._after_standing_still(stop)
                heard = True
                continue  # what the leader said may have changed the heap
            heard = False
            # Just before the fire: take what is due then and build the statement's parameters, so
            # at the fire second only the INSERT is left to do.
            due = self.heap.pop_due(max(head, now))  # late: everything due so far
            chunk = self.settings.queuer.insert_chunk
            ticks = prepare_chunks(due, chunk)
            if head > self.wall_clock.now():
                # Messages are still applied meanwhile; what they changed is checked below.
                await self.wall_clock.sleep(head - self.wall_clock.now(), stop)
                if stop.is_set():
                    return
            still_due = self.heap.still_due(due)
            if len(still_due) != len(due):
                ticks = prepare_chunks(still_due, chunk)
            for tick in ticks:
                await self._queue(tick, stop)
                if stop.is_set():
                    break
            never = [
                Definition(j.job_id, j.version, j.cron, j.timezone, j.grace) for j, _ in self.heap.reschedule(still_due)
            ]
            if never:
                try:
                    await self._deactivate_never_fires(never)
                except Exception:
                    # Off the heap already; the orchestrator's reconcile hands it back if it still counts.
                    log.exception("recording a schedule that never fires failed")

    async def _after_standing_still(self, stop: asyncio.Event) -> None:
        """A fire found this late means the worker (or its machine) stood still, or was handed a
        missed fire. While it stood still the leader may have declared it dead and given its jobs
        to others: then it fires nothing before the leader's drop-everything has been applied (sent
        when its next heartbeat reaches the leader), waiting at most what a death and a beat take.
        Postgres refuses a fire the schedule in force did not allow in any case; this keeps a
        stale heap from acting at all."""
        self._dropped.clear()
        try:
            state = await self.runs.worker_state(self.worker_id)
        except Exception as exc:
            if not is_transient(exc):
                raise
            return  # Postgres is away: the insert waits for it anyway, and decides
        if state != "dead" or self.holdings.registering_beats > 0:
            return  # not declared dead, or it already dropped everything and is registering again
        cfg = self.settings.orchestrator
        bound = cfg.heartbeat_interval * (cfg.dead_after_intervals + 2)
        log.warning(
            "declared dead while standing still: waiting for the leader's drop-everything before firing",
            extra={"worker_id": self.worker_id, "wait_at_most": bound},
        )
        metrics.stalls_waited.add(1)
        await wait_any(stop, self._dropped, timeout=bound)

    async def _queue(self, tick: PreparedTick, stop: asyncio.Event) -> None:
        """Queue the runs of one chunk of a tick and send their Pickups; while Postgres is down, keep
        trying (bounded backoff) until it is back.

        Runs are keyed by fire, so a tick whose commit was lost with the connection is queued once."""
        backoff = Backoff(first=0.2, cap=5.0)
        attempt = 0
        while True:
            attempt += 1
            try:
                result = await self.runs.queue_runs(tick)
                break
            except Exception as exc:
                if not is_transient(exc) and attempt >= _INSERT_ATTEMPTS:
                    raise
                log.warning("queuing runs failed; retrying", extra={"attempt": attempt, "error": repr(exc)})
                if await sleep_or_stop(stop, backoff.next()):
                    return
        if result.queued or result.superseded or result.skipped:
            log.info(
                "queued cron runs",
                extra={
                    "due": len(tick.due),
                    "queued": result.queued,
                    "superseded": result.superseded,
                    "skipped": result.skipped,
                },
            )
        try:
            await send_pickups(self.bus, self.topology, result.accounts, source="queuer")
        except ServiceUnavailable as exc:
            # Only a hint: the scheduler loop sends a Pickup for every account with due runs each pass.
            log.warning("pickups not sent", extra={"accounts": len(result.accounts), "error": str(exc)})
