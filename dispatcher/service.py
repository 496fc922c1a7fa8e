"""Dispatchers: turn Pickups into started runs, within each account's run slots.

A consumer takes the Pickups waiting for it (up to its prefetch, gathering for at most
``dispatcher.batch_wait``) and dispatches the accounts they name in passes of at most
``dispatcher.batch_accounts``. A pass takes the accounts' Redis locks in one round trip (an account
whose lock another dispatcher holds is skipped and handed back to that holder, ``runplane.adapters.locks``),
then in one Postgres transaction locks the account rows ``FOR NO KEY UPDATE`` in id order, reads
every account's starting/running runs and due queued runs in one query, decides each account
(``run_slots.plan_dispatch``), records why runs wait, cancels superseded merge runs, and moves the
chosen runs queued → starting with one compare-and-set. Commit, release the locks, then launch,
at most ``dispatcher.launch_concurrency`` at once. The lock only saves work; the row locks and the
compare-and-set make a stale or duplicate dispatcher harmless, and the transaction's idle timeout
(the lock's TTL) ends the transaction of a dispatcher that stalls holding rows, so it can change
nothing when it wakes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from google.protobuf.message import Message
from opentelemetry import trace
from psycopg_pool import AsyncConnectionPool

from dispatcher.ended_runs import end_runners_of_ended_runs
from dispatcher.intake import Intake
from dispatcher.launcher import Launcher, LaunchRequest, LaunchResult
from dispatcher.launcher_choice import companion, intake, intake_gate, make_launcher
from dispatcher.local_launcher import LocalLauncher
from dispatcher.local_spares import LocalSpares
from dispatcher.noop_launcher import NoopLauncher
from dispatcher.run_slots import ActiveRun, DispatchPlan, QueuedRun, plan_dispatch
from runplane.adapters import instruments, tracing
from runplane.adapters.bus import AmqpBus, Bus, Topology
from runplane.adapters.db import Connection, fetch_all, open_pool
from runplane.adapters.locks import AccountLocks, RedisAccountLocks
from runplane.basics.errors import Contention, LaunchError, ServiceUnavailable
from runplane.basics.run_overrides import run_timeout
from runplane.basics.settings import Settings
from runplane.basics.supervise import sleep_or_stop, spawn
from runplane.basics.tokens import new_run_token, token_hash
from runplane.basics.types import AccountId, JobId, JobType, Outcome, RunId, RunStatus
from runplane.runs.finish import finish_run
from runplane.runs.pickups import PendingPickups, hint_pickups, pending_pickup_ttl_ms, pickup_accounts
from runplane.runs.relaunch import launch_failed
from runplane.runs.retries import RetryPolicy
from runplane.runs.transitions import TRANSITIONS
from runplane.sql import load_queries
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

Q = load_queries("dispatcher")


@dataclass(frozen=True, slots=True)
class Started:
    run_id: RunId
    job_id: JobId
    account_id: AccountId
    launch_attempts: int
    memory_mb: int
    timeout_seconds: int
    trace_parent: str = ""
    token: str = field(default="", repr=False)
    dbt_version: str = ""  # the environment's; empty for plain commands


@dataclass(slots=True)
class AccountRow:
    id: int
    run_slots: int
    memory_mb: int


@dataclass(slots=True)
class AccountRunRow:
    """A run of ``account_runs``: starting/running (``active``) or due and queued."""

    active: bool
    account_id: int
    id: int
    job_id: int
    job_type: str
    takes_slot: bool
    priority: int
    queued_at: datetime
    pull_request_number: int | None
    schema_name: str
    concurrent: bool


@dataclass(slots=True)
class StartedRow:
    id: int
    job_id: int
    launch_attempts: int
    overrides: object
    trace_parent: str | None
    timeout_seconds: int | None
    dbt_version: str | None


def _plan(account: AccountRow, rows: list[AccountRunRow]) -> DispatchPlan:
    """The account's plan from its rows: active runs, and queued runs in dispatch order."""
    active = [ActiveRun(JobId(r.job_id), r.takes_slot) for r in rows if r.active]
    queued = [
        QueuedRun(
            run_id=RunId(r.id),
            job_id=JobId(r.job_id),
            job_type=JobType(r.job_type),
            takes_slot=r.takes_slot,
            queued_at=r.queued_at,
            pull_request_number=r.pull_request_number,
            schema_name=r.schema_name,
            concurrent=r.concurrent,
        )
        for r in sorted((r for r in rows if not r.active), key=lambda r: (-r.priority, r.queued_at, r.id))
    ]
    return plan_dispatch(account.run_slots, active, queued)


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        pool: AsyncConnectionPool[Connection],
        bus: Bus | None,
        locks: AccountLocks,
        launcher: Launcher,
        *,
        pending: PendingPickups | None = None,
        dispatcher_id: str = "",
        intake: Intake | None = None,
    ) -> None:
        self._settings = settings
        # Recorded on each run it starts: the scheduler loop reclaims them when this process stops
        # heartbeating (``announce``).
        self.dispatcher_id = dispatcher_id
        self._pool = pool
        self._bus = bus
        self._locks = locks
        self._launcher = launcher
        self._pending = pending
        # Bounds the runs this dispatcher holds to what its cluster starts soon (``dispatcher.intake``).
        self._intake = intake
        self._policy = RetryPolicy.from_settings(settings.runner)
        self._launch_concurrency = max(1, settings.dispatcher.launch_concurrency)
        self._launches = asyncio.Semaphore(self._launch_concurrency)
        # A span per launch costs more than the launch itself when nobody records it.
        self._tracing = tracing.recording()
        self._redis_failures = 0
        self.dispatched = 0  # runs this process moved to starting

    async def on_pickups(self, messages: list[Message]) -> None:
        """Dispatch every account the messages name, in passes of at most ``batch_accounts``."""
        accounts: set[AccountId] = set()
        for message in messages:
            if not isinstance(message, bus_pb2.Pickup):
                log.error("unexpected message on the pickup queue", extra={"message_type": type(message).__name__})
                continue
            accounts.update(AccountId(account_id) for account_id in pickup_accounts(message))
        ordered = sorted(accounts)
        if self._pending is not None:
            await self._pending.clear(ordered)  # changes from here on get a Pickup of their own
        if self._intake is not None:
            await self._dispatch_within(self._intake, ordered)
            return
        size = max(1, self._settings.dispatcher.batch_accounts)
        for start in range(0, len(ordered), size):
            await self.dispatch(ordered[start : start + size])

    async def _dispatch_within(self, intake: Intake, accounts: list[AccountId]) -> None:
        """Start at most the intake's credit of the accounts' runs; hand the rest back as Pickups
        (for dispatchers of other clusters) before launching what it took."""
        if not accounts:
            return
        # An account names one due run at least: a Pickup of few accounts does not wait for a large batch.
        credit = await intake.take_within(intake.horizon, wanted=len(accounts))
        most = max(1, self._settings.dispatcher.batch_accounts)
        started: list[Started] = []
        try:
            start = 0
            while start < len(accounts):
                left = credit - len(started)
                if left <= 0:
                    await self._shed(accounts[start:])
                    break
                # An account has at least one due run, or its Pickup is stale: a pass takes no more
                # accounts than the credit left, so one with little credit stays small.
                size = min(most, left)
                started += await self._take(accounts[start : start + size], limit=left)
                start += size
        finally:
            intake.give_back(credit - len(started))
        if not started:
            return
        self.dispatched += len(started)
        ended = 0

        def launch_ended(got_runner: bool) -> None:
            nonlocal ended
            ended += 1
            intake.launch_ended(started=got_runner, now=time.monotonic())

        intake.launching(len(started), time.monotonic())
        try:
            await self._launch_all(started, launch_ended)
        finally:
            intake.abandon(len(started) - ended)  # launches never begun: cancelled

    async def _shed(self, accounts: Sequence[AccountId]) -> None:
        """Accounts this dispatcher has no credit for: a Pickup again, for whichever dispatcher has some."""
        await hint_pickups(self._bus, Topology(self._settings.bus_prefix), accounts, source="shed")

    async def dispatch(self, account_ids: Sequence[AccountId]) -> list[Started]:
        """One dispatch pass over the accounts; returns the runs it launched."""
        started = await self._take(account_ids)
        if started:
            self.dispatched += len(started)
            await self._launch_all(started)
        return started

    async def _take(self, account_ids: Sequence[AccountId], *, limit: int | None = None) -> list[Started]:
        """One dispatch pass's decisions, at most ``limit`` runs started: runs moved to starting, not launched
        yet; the accounts that need a Pickup again get it."""
        accounts = sorted(set(account_ids))
        if not accounts:
            return []
        try:
            held = await self._locks.acquire(accounts)
        except ServiceUnavailable as exc:
            await self._redis_unavailable(exc)
            return []
        self._redis_failures = 0
        instruments.lock_attempts.add(len(held.accounts), {"result": "acquired"})
        if held.skipped:
            # Their holder sends them a Pickup again when it releases (``runplane.adapters.locks``).
            instruments.lock_attempts.add(len(held.skipped), {"result": "held"})
            instruments.pickups_dropped.add(len(held.skipped))
        started: list[Started] = []
        resend: set[AccountId] = set()
        try:
            if held.accounts:
                started, resend = await self._dispatch([AccountId(a) for a in held.accounts], limit)
        finally:
            try:
                resend.update(AccountId(a) for a in await held.release())
            except ServiceUnavailable as exc:
                log.warning(
                    "locks not released; they will expire", extra={"accounts": len(held.accounts), "error": str(exc)}
                )
        log.debug("dispatch pass done", extra={"accounts": len(held.accounts), "started": len(started)})
        await hint_pickups(self._bus, Topology(self._settings.bus_prefix), resend, source="outcome")
        return started

    async def _redis_unavailable(self, exc: ServiceUnavailable) -> None:
        """Redis is down: drop the pickups (the scheduler loop resends) and slow down, never crash."""
        self._redis_failures += 1
        if self._redis_failures == 1 or self._redis_failures % 50 == 0:
            log.warning("redis unavailable; dispatching paused", extra={"error": str(exc)})
        await asyncio.sleep(min(1.0, 0.05 * self._redis_failures))

    async def _dispatch(self, accounts: list[AccountId], limit: int | None) -> tuple[list[Started], set[AccountId]]:
        """The pass's transaction; the runs it started and the accounts that need a Pickup again."""
        try:
            async with self._pool.connection() as conn, conn.transaction():
                return await self._plan_and_start(conn, accounts, limit)
        except Contention:
            # An account row stayed locked past the lock timeout: the whole pass changed nothing.
            log.info("account rows busy; pickups sent again", extra={"accounts": len(accounts)})
            return [], set(accounts)
        except ServiceUnavailable as exc:
            # The transaction was ended under us (idle timeout after a stall, or Postgres went away).
            log.warning("dispatch pass aborted", extra={"accounts": len(accounts), "error": str(exc)})
        return [], set()

    async def _plan_and_start(
        self, conn: Connection, account_ids: list[AccountId], limit: int | None
    ) -> tuple[list[Started], set[AccountId]]:
        # A dispatcher that stalls inside the pass loses the transaction (and the row locks) once
        # its Redis locks have expired; one that waits for a row that long gives up.
        await conn.execute(Q["pass_timeouts"], {"ms": str(self._settings.dispatcher.lock_ttl_ms)})
        accounts = await fetch_all(conn, Q["lock_accounts"], {"account_ids": account_ids}, AccountRow)
        if not accounts:
            return [], set()
        # Read after the row locks are granted: each statement sees what was committed before it began.
        rows = await fetch_all(
            conn,
            Q["account_runs"],
            {"account_ids": [account.id for account in accounts], "limit": self._settings.dispatcher.batch_size},
            AccountRunRow,
        )
        runs_of: dict[int, list[AccountRunRow]] = defaultdict(list)
        for row in rows:
            runs_of[row.account_id].append(row)
        plans = [(account, _plan(account, runs_of[account.id])) for account in accounts if runs_of.get(account.id)]
        pickups: set[AccountId] = set()
        for _, plan in plans:
            for run in plan.superseded:
                pickups |= await self._supersede(conn, run)
        waiting = {run_id: reason for _, plan in plans for run_id, reason in plan.waiting.items()}
        if waiting:
            await conn.execute(
                Q["set_waiting_reasons"],
                {"ids": list(waiting), "reasons": [str(reason) for reason in waiting.values()]},
            )
        starts = [(account, run, plan.schemas[run.run_id]) for account, plan in plans for run in plan.start]
        if limit is not None and len(starts) > limit:
            # Beyond what this dispatcher's cluster starts soon: left queued, for whichever dispatcher takes the Pickup.
            pickups |= {AccountId(account.id) for account, _, _ in starts[limit:]}
            starts = starts[:limit]
        if not starts:
            return [], pickups
        tokens = {run.run_id: new_run_token() for _, run, _ in starts}
        rows_started = await fetch_all(
            conn,
            TRANSITIONS["start_runs"],
            {
                "ids": [run.run_id for _, run, _ in starts],
                "schemas": [schema for _, _, schema in starts],
                "token_hashes": [token_hash(tokens[run.run_id]) for _, run, _ in starts],
                "cluster": self._settings.dispatcher.cluster,
                "dispatcher_id": self.dispatcher_id,
            },
            StartedRow,
        )
        account_of = {run.run_id: account for account, run, _ in starts}
        started = [
            Started(
                run_id=RunId(r.id),
                job_id=JobId(r.job_id),
                account_id=AccountId(account_of[RunId(r.id)].id),
                launch_attempts=r.launch_attempts,
                memory_mb=account_of[RunId(r.id)].memory_mb,
                timeout_seconds=run_timeout(r.overrides, r.timeout_seconds),
                trace_parent=r.trace_parent or "",
                token=tokens[RunId(r.id)],
                dbt_version=r.dbt_version or "",
            )
            for r in rows_started
        ]
        return started, pickups

    async def _supersede(self, conn: Connection, run: QueuedRun) -> set[AccountId]:
        finished = await finish_run(
            conn,
            run.run_id,
            Outcome.cancelled(
                f"superseded by a newer merge run of job {run.job_id}: of several queued merge runs only the "
                "newest runs; nothing to do"
            ),
            policy=self._policy,
            from_statuses=(RunStatus.QUEUED,),
        )
        if finished is None:
            return set()
        instruments.cancellations.add(1, {"reason": "superseded_merge"})
        return {AccountId(a) for a in finished.pickup_accounts}

    async def _launch_all(self, started: list[Started], ended: Callable[[bool], None] | None = None) -> None:
        """Launch the runs; ``ended`` hears of each launch as it ends (whether the run got a runner)."""
        # A few workers, each holding one of the process's launch permits, take the runs in turn: a
        # task and a semaphore wait per run cost more than a noop or warm-pool launch itself.
        results: list[LaunchResult | None] = [None] * len(started)
        turns = iter(range(len(started)))

        async def worker() -> None:
            async with self._launches:
                for index in turns:
                    try:
                        results[index] = await self._launch(started[index])
                    finally:
                        if ended is not None:
                            result = results[index]
                            ended(result is not None and bool(result.pod_name))

        await asyncio.gather(*(worker() for _ in range(min(len(started), self._launch_concurrency))))
        launched = [(run, result) for run, result in zip(started, results, strict=True) if result and result.pod_name]
        if not launched:
            return
        try:
            async with self._pool.connection() as conn:
                await conn.execute(
                    Q["record_launches"],
                    {
                        "ids": [run.run_id for run, _ in launched],
                        "pod_names": [result.pod_name for _, result in launched],
                        "clusters": [result.cluster for _, result in launched],
                        "attempts": [run.launch_attempts for run, _ in launched],
                    },
                )
        except ServiceUnavailable as exc:
            log.warning("pod names not recorded", extra={"error": str(exc)})

    async def _launch(self, run: Started) -> LaunchResult | None:
        request = LaunchRequest(
            run_id=run.run_id,
            job_id=run.job_id,
            account_id=run.account_id,
            attempt=run.launch_attempts,
            memory_mb=run.memory_mb,
            timeout_seconds=run.timeout_seconds,
            token=run.token,
            dbt_version=run.dbt_version,
        )
        try:
            if not self._tracing:
                return await self._launcher.launch(request)
            # The run's own trace (from whatever queued it), not the Pickup's: a Pickup names an account.
            attributes = {"run_id": run.run_id, "job_id": run.job_id, "account_id": run.account_id}
            with _tracer.start_as_current_span(
                "dispatch", context=tracing.extract(run.trace_parent), attributes=attributes
            ):
                return await self._launcher.launch(request)
        except LaunchError as exc:
            instruments.launch_failures.add(1, {"launcher": self._launcher.name, "retryable": exc.retryable})
            log.warning(
                "launch failed",
                extra={"run_id": run.run_id, "job_id": run.job_id, "account_id": run.account_id, "error": str(exc)},
            )
            await launch_failed(
                self._pool,
                self._bus,
                self._settings,
                run_id=run.run_id,
                launch_attempts=run.launch_attempts,
                message=str(exc),
                retryable=exc.retryable,
                retry_after=exc.retry_after,
            )
            return None


async def announce(
    pool: AsyncConnectionPool[Connection], settings: Settings, dispatcher: Dispatcher, name: str, stop: asyncio.Event
) -> None:
    """Keep this dispatcher's row in ``dispatchers`` fresh (for ``runplane status``); remove it on exit."""
    params = {"dispatcher_id": name, "cluster": settings.dispatcher.cluster, "launcher": settings.dispatcher.launcher}
    try:
        while True:
            try:
                async with pool.connection() as conn:
                    await conn.execute(Q["dispatcher_seen"], {**params, "dispatched": dispatcher.dispatched})
            except ServiceUnavailable as exc:
                log.warning("dispatcher row not updated", extra={"error": str(exc)})
            if await sleep_or_stop(stop, settings.dispatcher.heartbeat_interval):
                break
    finally:
        try:
            async with pool.connection() as conn:
                await conn.execute(Q["dispatcher_gone"], {"dispatcher_id": name})
        except ServiceUnavailable:
            pass  # the scheduler loop forgets silent dispatchers


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    """``runplane dispatcher``: consume Pickups until ``stop`` is set."""
    concurrency = max(1, settings.dispatcher.concurrency)
    pool = await open_pool(settings.database_url, min_size=2, max_size=concurrency * 2 + 2, name="dispatcher")
    bus: AmqpBus | None = None
    locks = RedisAccountLocks.from_url(
        settings.redis_url, prefix=settings.redis_prefix, ttl_ms=settings.dispatcher.lock_ttl_ms
    )
    launcher = make_launcher(settings, pool)
    pending = PendingPickups.from_url(
        settings.redis_url, prefix=settings.redis_prefix, ttl_ms=pending_pickup_ttl_ms(settings)
    )
    try:
        bus = await AmqpBus.connect(settings.amqp_url)
        if isinstance(launcher, LocalLauncher):
            await launcher.start()
        if isinstance(launcher, NoopLauncher):
            launcher.on_ended = functools.partial(hint_pickups, bus, Topology(settings.bus_prefix), source="outcome")
        name = f"{socket.gethostname()}:{os.getpid()}"
        watcher = companion(settings, pool)
        bounded = intake(settings, watcher, launcher)
        dispatcher = Dispatcher(
            settings, pool, bus, locks, launcher, pending=pending, dispatcher_id=name, intake=bounded
        )
        queue = Topology(settings.bus_prefix).pickup
        # A bounded intake holds one Pickup per consumer: those behind it go to dispatchers with credit
        # while this one launches (a Pickup names many accounts; the bound counts their runs).
        prefetch = 1 if bounded is not None else max(1, settings.dispatcher.prefetch // concurrency)
        log.info("dispatcher ready", extra={"launcher": launcher.name, "concurrency": concurrency})
        started = time.monotonic()
        async with asyncio.TaskGroup() as group:
            spawn(
                group, "dispatcher:announce", announce(pool, settings, dispatcher, name, stop), eternal=True, stop=stop
            )
            if watcher is not None:
                spawn(group, f"dispatcher:{launcher.name}:watch", watcher.run(stop), eternal=True, stop=stop)
            if isinstance(launcher, LocalLauncher):
                ended = end_runners_of_ended_runs(pool, launcher, stop)
                spawn(group, "dispatcher:local:ended-runs", ended, eternal=True, stop=stop)
            if isinstance(launcher, LocalLauncher) and settings.dispatcher.local_fork_server:
                spares = LocalSpares(settings, pool, launcher, name)
                spawn(group, "dispatcher:local:spares", spares.run(stop), eternal=True, stop=stop)
            gate = intake_gate(settings, watcher)
            if gate is not None:
                spawn(group, f"dispatcher:{launcher.name}:gate", gate.run(stop), eternal=True, stop=stop)
            consume = functools.partial(
                bus.consume_batches,
                queue,
                dispatcher.on_pickups,
                prefetch=prefetch,
                max_messages=prefetch,
                max_wait=settings.dispatcher.batch_wait,
            )
            for index in range(concurrency):
                # With a gate, consuming pauses while the cluster cannot take runs (other clusters do).
                task = consume(stop=stop) if gate is None else gate.consume_while_open(consume, stop)
                spawn(group, f"dispatcher:consume:{index}", task, eternal=True, stop=stop)
        log.info("dispatcher stopped", extra={"uptime_s": round(time.monotonic() - started, 1)})
    finally:
        await launcher.close()
        await pending.close()
        await locks.close()
        if bus is not None:
            await bus.close()
        await pool.close()
