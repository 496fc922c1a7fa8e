"""The simulated world: the real ``Leader`` (one leading, one standing by) and real ``QueuerWorker``s
on simulated time, a simulated broker and in-memory twins of Postgres; faults injected on purpose;
the protocol's properties checked over the history.

Everything is driven by one seed and the list of operations applied, so a history is reproduced
exactly by replaying them. ``World.trace`` is the readable account of what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

from orchestrator.leader import Leader
from orchestrator.leadership import LEASE_SECONDS, STANDBY_POLL_SECONDS, WATCH_SECONDS, LeadershipLost
from orchestrator.ownership_store import OwnershipStore
from queuer_worker.runs_store import RunsStore
from queuer_worker.worker import QueuerWorker
from runplane.adapters.outages import is_transient
from runplane.basics import backoff
from runplane.basics.cron import next_fire
from runplane.basics.jitter import jitter_offset
from runplane.basics.ownership import job_digest
from runplane.basics.settings import Settings
from runplane.basics.supervise import spawn
from runplane.basics.types import schedule_idempotency_key
from tests.simulation.broker import Broker, Lossy, SimBus
from tests.simulation.order import WatchedHeap, WorkerOrder
from tests.simulation.process import EPOCH, Process, ProcessMonotonic, ProcessWallClock
from tests.simulation.twins import MemoryDatabase, MemoryOwnershipStore, MemoryRunsStore
from tests.simulation.virtual_time import VirtualTimeLoop, ordered_task_groups

STANDBY_POLL = STANDBY_POLL_SECONDS
WATCH = WATCH_SECONDS  # how often a leader renews its lease
RESTART_DELAY = 3.0  # a supervisor starts a crashed process again after this
ARMED_AT_MOST = 30.0  # a fault armed for a process's next send comes after this at the latest
CRONS = ("* * * * *", "* * * * *", "*/2 * * * *", "*/3 * * * *")


def settle_bound(settings: Settings) -> float:
    """B: how long after the last fault heals (and after a job last changed) every occurrence is
    sure to be queued on time, derived from the settings (DESIGN.md, "Exactly once, on time").

    A worker frozen or cut off is found dead after ``dead_after`` (plus a liveness tick); the
    Assigns of its jobs go out at once, and one lost on the way is sent again by the reconcile
    after ``claim_timeout`` (noticed at a reconcile tick, so up to one ``reconcile_interval``
    later); a consumer that lost its queue or connection is back within its backoff cap (10 s);
    a standby takes a lost lease once it runs out, within a stand-by poll, plus the step-down
    backoff.
    """
    cfg = settings.orchestrator
    dead_after = cfg.heartbeat_interval * cfg.dead_after_intervals + cfg.heartbeat_interval / 10
    resend = cfg.claim_timeout + cfg.reconcile_interval
    consumer_back = 10.0
    failover = LEASE_SECONDS + WATCH + STANDBY_POLL + 10.0
    return dead_after + resend + consumer_back + failover


class PropertyViolated(AssertionError):
    pass


class _Gated:
    """A port of one process: every call waits while the process is frozen."""

    def __init__(self, target: object, process: Process, latency: Callable[[], float]) -> None:
        self._target = target
        self._process = process
        self._latency = latency

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name == "changes" or not callable(attr):
            return attr

        async def gated(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(self._latency())  # a round trip to Postgres on a busy machine
            await self._process.running()
            return await attr(*args, **kwargs)

        return gated


@dataclass
class WorkerSlot:
    process: Process
    worker: QueuerWorker
    crashed: bool = False


@dataclass
class Orchestrator:
    process: Process
    leader: Leader | None = None
    crashed: bool = False


@dataclass
class JobHistory:
    created_at: float
    changed_at: float
    schedulable_since: float | None  # None while not schedulable
    cron: str | None


@dataclass
class World:
    seed: int
    workers_at_start: int = 3
    jobs_at_start: int = 6
    crons: tuple[str, ...] = CRONS
    graces: tuple[int, ...] = (0, 300)
    slow_calls: float = 0.02  # the share of calls that take long
    slowest_call: float = 1.0
    jitter_seconds: int = 0  # of every third job (0: no job is jittered)
    catchup_window_seconds: int = 0  # of every other job, every fourth catching up every missed fire
    settings: Settings = field(default_factory=lambda: Settings(bus_prefix="sim"))
    trace_lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.jitter = random.Random(self.seed + 1)  # runplane.basics.backoff's, while this world runs
        self.loop = VirtualTimeLoop()
        self.db = MemoryDatabase(now=lambda: EPOCH + self.loop.time())
        self.broker = Broker(self.rng, self.trace)
        self.lock_holder: str | None = None
        self.orchestrators: list[Orchestrator] = []
        self.workers: list[WorkerSlot] = []
        self.history: dict[int, JobHistory] = {}
        self.active_faults = 0
        self.last_heal = 0.0
        self.bound = settle_bound(self.settings)
        self.violations: list[str] = []
        self._names = 0
        self._persisted_term = 0
        self._not_owned_since: dict[tuple[str, int], float] = {}
        self._sampler: asyncio.Task[None] | None = None
        self.errors: list[BaseException] = []
        self.loop.set_exception_handler(self._loop_error)
        logging.getLogger("orchestrator").setLevel(logging.CRITICAL)
        # The ownership digest's repair is a safety net: count each time it has to act.
        self.repairs = 0
        self.queues_deleted = False
        self._repair_log = _RepairLog(self)
        logging.getLogger("orchestrator.liveness").addHandler(self._repair_log)
        logging.getLogger("orchestrator.liveness").setLevel(logging.WARNING)
        logging.getLogger("queuer_worker").setLevel(logging.CRITICAL)
        logging.getLogger("runplane").setLevel(logging.CRITICAL)

    def latency(self) -> float:
        """How long one call to Postgres or the broker takes: mostly a millisecond or two, now and
        then much longer (a loaded two-core machine)."""
        draw = self.rng.random()
        if draw < self.slow_calls:
            return self.rng.uniform(0.05, self.slowest_call)
        return 0.0 if draw > 0.5 else self.rng.uniform(0.0005, 0.003)

    # -- the world's clock and trace ------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.loop.time()

    def trace(self, who: str, what: str) -> None:
        self.trace_lines.append(f"{self.now:9.3f} {who:>10} {what}")

    def _loop_error(self, _loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, BaseException):
            self.errors.append(exc)

    def run_for(self, seconds: float) -> None:
        self._run(asyncio.sleep(seconds))
        if self.errors:
            raise self.errors[0]

    def _run(self, step: Coroutine[Any, Any, None]) -> None:
        """Run the world through ``step``, with everything the code under test draws at random drawn
        from this world's seed (and nothing else drawing from it meanwhile)."""
        global_random = vars(backoff)["random"]
        vars(backoff)["random"] = self.jitter
        try:
            with ordered_task_groups():
                self.loop.run_until_complete(step)
        finally:
            vars(backoff)["random"] = global_random

    def _later(self, seconds: float, action: Callable[[], object]) -> None:
        self.loop.call_later(seconds, action)

    # -- start --------------------------------------------------------------------------------------

    def start(self) -> None:
        async def boot() -> None:
            for _ in range(self.jobs_at_start):
                self._create_job(self.rng.choice(self.crons))
            for _ in range(2):
                self._start_orchestrator()
            for _ in range(self.workers_at_start):
                self._start_worker()
            self._sampler = asyncio.ensure_future(self._sample())

        self._run(boot())
        self.run_for(5.0)

    def _name(self, kind: str) -> str:
        self._names += 1
        return f"{kind}{self._names}"

    def _start_orchestrator(self) -> None:
        process = Process(self._name("orch"))
        orch = Orchestrator(process)
        self.orchestrators.append(orch)
        process.task = asyncio.ensure_future(self._orchestrate(orch))
        self.trace(process.name, "started (standing by)")

    async def _orchestrate(self, orch: Orchestrator) -> None:
        """``orchestrator.service.serve`` on the simulated lock: stand by, lead, step down on a lost
        lock or an outage, stand by again."""
        process = orch.process
        while not process.stop.is_set():
            while self.lock_holder is not None:  # noqa: ASYNC110 (polling the lock, as a standby does)
                await asyncio.sleep(STANDBY_POLL)
            await process.running()
            if self.lock_holder is not None:
                continue
            self.lock_holder = process.name
            term = self.db.bump_term()
            self.trace(process.name, f"ELECTED term {term}")
            bus = SimBus(self.broker, process, self.latency)
            store = cast(OwnershipStore, _Gated(MemoryOwnershipStore(self.db, term), process, self.latency))
            leader = Leader(
                self.settings,
                store,
                bus,
                term,
                process.name,
                wall_clock=ProcessWallClock(process),
                monotonic=ProcessMonotonic(process),
            )
            orch.leader = leader
            stop = asyncio.Event()
            try:
                async with asyncio.TaskGroup() as group:
                    spawn(group, "leadership", self._watch(process, stop), eternal=True, stop=stop)
                    spawn(group, "leader", leader.run(stop), eternal=True, stop=stop)
            except BaseExceptionGroup as group_exc:
                if not all(isinstance(e, LeadershipLost) or is_transient(e) for e in _leaves(group_exc)):
                    raise
                self.trace(process.name, f"stepped down from term {term}: {_leaves(group_exc)[0]!r}")
            finally:
                orch.leader = None
                if self.lock_holder == process.name:
                    self.lock_holder = None  # its lock's connection closes
            await asyncio.sleep(1.0)

    async def _watch(self, process: Process, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(WATCH)
            await process.running()
            await asyncio.sleep(self.latency())  # the watch's query on the lock's connection
            if self.lock_holder != process.name:
                raise LeadershipLost("the leader lock's connection failed")

    def _start_worker(self) -> WorkerSlot:
        process = Process(self._name("w"))
        runs = cast(RunsStore, _Gated(MemoryRunsStore(self.db, process.name), process, self.latency))
        bus = SimBus(self.broker, process, self.latency)
        bus.order = WorkerOrder(process.name, self.violated)
        worker = QueuerWorker(
            self.settings,
            bus,
            runs,
            process.name,
            wall_clock=ProcessWallClock(process),
            heap=WatchedHeap(bus.order),
        )
        slot = WorkerSlot(process, worker)
        self.workers.append(slot)
        process.task = asyncio.ensure_future(self._work(slot))
        self.trace(process.name, "started")
        return slot

    async def _work(self, slot: WorkerSlot) -> None:
        try:
            await slot.worker.run(slot.process.stop)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            leaves = _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
            if not all(is_transient(e) for e in leaves):
                raise
            # The process exits; its supervisor starts a new one (a new worker id).
            self.trace(slot.process.name, f"exited: {leaves[0]!r}")
            slot.crashed = True
            self._later(RESTART_DELAY, self._start_worker)

    # -- jobs -----------------------------------------------------------------------------------------

    def _create_job(self, cron: str) -> int:
        grace = self.rng.choice(self.graces)
        job = self.db.add_job(1 + len(self.db.jobs) % 3, cron, missed_run_grace_seconds=grace)
        # Every third job is jittered (in the histories that ask): its fires are due its fixed offset
        # after each instant.
        job.jitter_seconds = self.jitter_seconds if job.id % 3 == 0 else 0
        catchup = ""
        if self.catchup_window_seconds and job.id % 2 == 0:
            job.catchup_window_seconds, job.catchup_all = self.catchup_window_seconds, job.id % 4 == 0
            catchup = f" catchup={job.catchup_window_seconds}{' all' if job.catchup_all else ''}"
        self.history[job.id] = JobHistory(self.now, self.now, self.now, cron)
        self.trace("api", f"job {job.id} created {cron!r} grace={grace} jitter={job.jitter_seconds}{catchup}")
        return job.id

    def create_job(self, cron: str) -> None:
        self._run(_call(lambda: self._create_job(cron)))

    def change_job(self, index: int, change: str, cron: str) -> None:
        live = [j for j in sorted(self.db.jobs) if not self.db.jobs[j].deleted]
        if not live:
            return
        job_id = live[index % len(live)]
        job = self.db.jobs[job_id]
        fields: dict[str, object] = {}
        if change == "cron":
            fields["cron"] = cron
        elif change == "pause":
            fields["paused"] = not job.paused
        elif change == "delete":
            fields["deleted"] = True
        history = self.history[job_id]

        def apply() -> None:
            self.db.change_job(job_id, **fields)
            history.changed_at = self.now
            history.cron = job.cron
            history.schedulable_since = self.now if job.schedulable else None
            self.trace("api", f"job {job_id} {change} → {fields} (version {job.version})")

        self._run(_call(apply))

    # -- faults ---------------------------------------------------------------------------------------

    def _fault(self, seconds: float, begin: Callable[[], object], end: Callable[[], object], what: str) -> None:
        async def start() -> None:
            self._begin_fault(seconds, begin, end, what)

        self._run(start())

    def _begin_fault(self, seconds: float, begin: Callable[[], object], end: Callable[[], object], what: str) -> None:
        """(In the running world.)"""
        self.active_faults += 1
        self.trace("FAULT", f"{what} for {seconds:.1f}s")
        begin()

        def heal() -> None:
            end()
            self.active_faults -= 1
            self.trace("HEAL", what)
            if self.active_faults == 0:
                self.last_heal = self.now

        self._later(seconds, heal)

    def _live_worker(self, index: int) -> WorkerSlot | None:
        live = [s for s in self.workers if not s.crashed]
        return live[index % len(live)] if live else None

    def _leading(self) -> Orchestrator | None:
        return next((o for o in self.orchestrators if o.process.name == self.lock_holder and not o.crashed), None)

    def freeze_worker(self, index: int, seconds: float) -> None:
        slot = self._live_worker(index)
        if slot is not None:
            self._fault(seconds, slot.process.freeze, slot.process.thaw, f"{slot.process.name} frozen")

    def freeze_leader(self, seconds: float) -> None:
        """The leader stands still with its connections open: its lease runs out after
        ``LEASE_SECONDS`` (it renews nothing while frozen), and a standby takes the next term."""
        orch = self._leading()
        if orch is None:
            return
        name = orch.process.name

        def expire() -> None:
            if orch.process.frozen and self.lock_holder == name:
                self.trace(name, "lease expired while frozen")
                self.lock_holder = None

        def begin() -> None:
            orch.process.freeze()
            self._later(LEASE_SECONDS, expire)

        self._fault(seconds, begin, orch.process.thaw, f"{name} (leader) frozen")

    def stall_leader(self, seconds: float, *, at_send: bool = False) -> None:
        """The leader stands still (a paused VM, a stop-the-world stall) long enough for the server to
        end its lock's session: a standby is elected under a newer term while it is frozen, and when
        it runs again it goes on with what it was doing until its watch notices the lost lock.

        ``at_send``: the stall comes when the leader is about to send its next stamped message (after
        the write that recorded it, or within ``ARMED_AT_MOST``): that message leaves in the old term
        when it runs again, after the newer leader's own."""
        orch = self._leading()
        if orch is None:
            return
        what = f"{orch.process.name} (leader) stalls and loses its lock"

        def begin() -> None:
            orch.process.freeze()
            if self.lock_holder == orch.process.name:
                self.lock_holder = None

        if not at_send:
            self._fault(seconds, begin, orch.process.thaw, what)
            return
        stalled = False

        def stall() -> None:
            nonlocal stalled
            if stalled:
                return
            stalled = True
            orch.process.before_send = None
            self._begin_fault(seconds, begin, orch.process.thaw, f"{what} before it sends")
            self.active_faults -= 1  # the armed fault has become this one

        async def arm() -> None:
            self.active_faults += 1
            self.trace("FAULT", f"{orch.process.name} (leader) to stall at its next send")
            orch.process.before_send = stall
            self._later(ARMED_AT_MOST, stall)

        self._run(arm())

    def partition_worker(self, index: int, seconds: float) -> None:
        slot = self._live_worker(index)
        if slot is not None:
            name = slot.process.name
            self._fault(
                seconds,
                lambda: self.broker.set_cut(name, True),
                lambda: self.broker.set_cut(name, False),
                f"{name} cut off from the broker",
            )

    def broker_outage(self, seconds: float) -> None:
        self._fault(seconds, lambda: self.broker.set_down(True), lambda: self.broker.set_down(False), "broker down")

    def lossy_bus(self, seconds: float, drop: float, duplicate: float, max_delay: float) -> None:
        lossy = Lossy(drop, duplicate, max_delay)

        def begin() -> None:
            self.broker.lossy = lossy

        def end() -> None:
            self.broker.lossy = Lossy()

        self._fault(seconds, begin, end, f"lossy bus drop={drop:.2f} dup={duplicate:.2f} delay≤{max_delay:.1f}s")

    def crash_worker(self, index: int) -> None:
        slot = self._live_worker(index)
        if slot is None:
            return

        def begin() -> None:
            slot.crashed = True
            assert slot.process.task is not None
            slot.process.task.cancel()

        self._fault(RESTART_DELAY, begin, self._start_worker, f"{slot.process.name} crashed (restarts as new)")

    def delete_worker_queue(self, index: int) -> None:
        slot = self._live_worker(index)
        if slot is not None:
            queue = slot.worker.own_queue
            self.queues_deleted = True
            self._fault(0.0, lambda: self.broker.delete(queue), lambda: None, f"queue of {slot.process.name} deleted")

    def leader_loses_lock(self) -> None:
        def begin() -> None:
            self.lock_holder = None

        self._fault(0.0, begin, lambda: None, f"{self.lock_holder} loses the leader lock's connection")

    def crash_leader(self) -> None:
        orch = self._leading()
        if orch is None:
            return

        def begin() -> None:
            orch.crashed = True
            assert orch.process.task is not None
            orch.process.task.cancel()
            if self.lock_holder == orch.process.name:
                self.lock_holder = None

        self._fault(RESTART_DELAY, begin, self._start_orchestrator, f"{orch.process.name} (leader) crashed")

    def heal_all(self) -> None:
        """Wait for every fault to end (none lasts long)."""
        while self.active_faults:
            self.run_for(1.0)

    # -- properties -----------------------------------------------------------------------------------

    def violated(self, what: str) -> None:
        self.trace("VIOLATED", what)
        self.violations.append(what)

    async def _sample(self) -> None:
        """Every second: the persisted term only grows (a worker's, in ``order.WorkerOrder``); a worker
        holds a job it does not own no longer than B."""
        while True:
            await asyncio.sleep(1.0)
            if self.db.term < self._persisted_term:
                self.violated(f"the persisted term went back to {self.db.term}")
            self._persisted_term = self.db.term
            if self.active_faults:
                self._not_owned_since.clear()
                continue
            held_now: set[tuple[str, int]] = set()
            for slot in self.workers:
                if slot.crashed:
                    continue
                for job_id in slot.worker.heap.job_ids():
                    own = self.db.ownership.get(job_id)
                    if own is None or own.worker_id != slot.process.name:
                        held_now.add((slot.process.name, job_id))
            for key in list(self._not_owned_since):
                if key not in held_now:
                    del self._not_owned_since[key]
            for key in held_now:
                since = self._not_owned_since.setdefault(key, self.now)
                if self.now - since > self.bound:
                    self.violated(f"{key[0]} has held job {key[1]}, which it does not own, for {self.now - since:.0f}s")
                    del self._not_owned_since[key]

    def check(self) -> None:
        """Heal, let the world run quiet for B and three minutes more, and check every property,
        among them that the ownership digest's repair never had to act (unless a worker's queue was
        deleted under it, which only the repair can heal): the protocol does not rely on it."""
        self.heal_all()
        self.run_for(self.bound + 180.0)
        end = self.now
        self._check_runs(end)
        self._check_schedule_in_force()
        # Views converge: each job held by its owner alone, the leader's view of the workers true,
        # at one instant within B (a false death on a slow call may be settling at any given one).
        for _ in range(int(self.bound)):
            settled = self._settled()
            if not settled:
                break
            self.run_for(1.0)
        for what in settled:
            self.violated(what)
        if self.repairs and not self.queues_deleted:
            self.violated(f"the ownership digest's repair had to act {self.repairs} times")
        if self.violations:
            raise PropertyViolated("; ".join(dict.fromkeys(self.violations)))

    def _check_runs(self, end: float) -> None:
        """Every occurrence due while its job was schedulable and unchanged, at least B after the last
        fault healed, has exactly one run, queued within a second of its time."""
        runs_by_key = self.db.runs
        for job_id, history in self.history.items():
            job = self.db.jobs[job_id]
            if history.schedulable_since is None or job.cron is None:
                continue
            start = max(history.schedulable_since, self.last_heal) + self.bound
            offset = jitter_offset(job_id, job.jitter_seconds)  # a fire is due this long after its instant
            fire = next_fire(job.cron, job.timezone, EPOCH + start - 1)
            while fire + offset <= EPOCH + end - 2 - 2 * self.slowest_call:  # the last ones may be on their way
                run = runs_by_key.get(schedule_idempotency_key(job_id, fire))
                late = None if run is None else run.queued_at - (fire + offset)
                if late is None:
                    self.violated(f"job {job_id}: the occurrence at t={fire - EPOCH:.0f} got no run")
                elif late > 1.0 + 2 * self.slowest_call:  # the insert itself may be slow
                    self.violated(f"job {job_id}: the occurrence at t={fire - EPOCH:.0f} queued {late:.1f}s late")
                elif late < -1.0:
                    self.violated(f"job {job_id}: the occurrence at t={fire - EPOCH:.0f} queued {-late:.1f}s early")
                fire = next_fire(job.cron, job.timezone, fire)

    def _check_schedule_in_force(self) -> None:
        """No run exists for an instant that was not an occurrence of its job's schedule in force
        then: never while paused or deleted, never on a superseded cron, never before the job was
        made."""
        for run in self.db.runs.values():
            # Schedules are kept to the second: a job made within a second may fire at its start
            # (``CronHeap.assign`` counts a fire in this very second).
            made = EPOCH + int(self.history[run.job_id].created_at)
            in_force = self.db.schedule_at(run.job_id, run.fire_ts)
            at = f"job {run.job_id}: a run at t={run.fire_ts - EPOCH:.0f}, queued by {run.queued_by}"
            if in_force is None or run.fire_ts < made:
                self.violated(f"{at}, before the job was made")
            elif not in_force.fires or in_force.cron is None:
                self.violated(f"{at}, while the job could not fire (paused or deleted)")
            elif next_fire(in_force.cron, in_force.timezone, run.fire_ts - 1) != run.fire_ts:
                self.violated(f"{at}, which is not an occurrence of its schedule then ({in_force.cron!r})")

    def _settled(self) -> list[str]:
        """What is not yet as it should be once messages settle: each schedulable job held by exactly
        its owner, at its version; the leader's view of the workers and of what they hold true."""
        found: list[str] = []
        live = {s.process.name: s for s in self.workers if not s.crashed}
        for job_id, job in self.db.jobs.items():
            holders = sorted(name for name, s in live.items() if job_id in s.worker.heap)
            own = self.db.ownership.get(job_id)
            if not job.schedulable:
                if holders:
                    found.append(f"job {job_id} is not schedulable but held by {holders}")
                continue
            if own is None or own.state != "claimed":
                found.append(f"job {job_id} is not owned after settling (row: {own})")
                continue
            if holders != [own.worker_id]:
                found.append(f"job {job_id} is owned by {own.worker_id} but held by {holders}")
                continue
            held = live[holders[0]].worker.heap.get(job_id)
            if held is None or held.version != job.version:
                found.append(f"job {job_id}: its holder has version {held and held.version}, not {job.version}")
        orch = self._leading()
        if orch is None or orch.leader is None:
            found.append("no leader after settling")
            return found
        alive_in_view = {w for w, info in orch.leader.workers.items() if info.alive}
        if alive_in_view != set(live):
            found.append(f"the leader sees {sorted(alive_in_view)} alive, but {sorted(live)} are")
        for name, slot in live.items():
            expected = 0
            for o in self.db.ownership.values():
                if o.worker_id == name and o.state == "claimed":
                    expected ^= job_digest(o.job_id, o.version)
            if slot.worker.heap.digest != expected:
                found.append(f"{name} holds other jobs or versions than it owns")
        return found

    def close(self) -> None:
        logging.getLogger("orchestrator.liveness").removeHandler(self._repair_log)

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task

        self._run(shutdown())
        self.loop.close()

    def report(self, lines: int = 150) -> str:
        head = f"seed {self.seed}: {len(self.trace_lines)} trace lines, the last {lines}:"
        return "\n".join([head, *self.trace_lines[-lines:]])


async def _call(action: Callable[[], object]) -> None:
    action()


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


class _RepairLog(logging.Handler):
    def __init__(self, world: World) -> None:
        super().__init__(logging.WARNING)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        if "does not hold what it owns" in record.getMessage():
            self.world.repairs += 1
            self.world.trace("leader", "REPAIR: " + record.getMessage())
