"""The runner: executes one run from claim to outcome (``runplane runner --run-id N``).

1. Claim: starting → running with a compare-and-set that stamps ``started_at`` and takes the lease.
   A runner that finds the run in any other state (a duplicate launch) exits 0 doing nothing.
2. While it works, a lease task renews the lease every heartbeat interval and polls for a cancel
   request in between; if the lease was taken away (the reaper declared the runner lost), the
   steps are killed and the runner leaves without writing anything.
3. A job with an environment is prepared first (``runner.prepare``: checkout at the run's commit,
   a profile for this run, ``dbt deps``); a failing preparation ends the run as error.
4. Steps run in order (in the project's directory, or a per-run working directory for plain
   commands), their output streamed into log chunks with secrets masked, and dbt's artifacts
   stored per step after each one (``runner.artifacts``).
5. The outcome is written with a compare-and-set on the lease owner (``runplane.runs.finish``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from psycopg_pool import AsyncConnectionPool

from runner.artifacts import ArtifactCollector, dbt_output_directories
from runner.checkout import RepositoryCache
from runner.dbt_env import is_dbt_step
from runner.prepare import PreparedRun, PrepareError, prepared_run
from runner.run_logs import RunLogs
from runner.steps import Limits, StepControl, StepEnd, run_step
from runplane import tracing
from runplane.bus import AmqpBus, Topology
from runplane.db import Connection, open_pool
from runplane.dbt_context import DbtContext, load_dbt_context, run_override
from runplane.errors import RunplaneError, ServiceUnavailable
from runplane.runs.finish import MEMORY_LIMIT_ERROR, Outcome, end_run
from runplane.runs.pickups import hint_pickups
from runplane.runs.retries import FailureKind, RetryPolicy
from runplane.runs.transitions import TRANSITIONS
from runplane.secrets import box_from_settings, mask
from runplane.settings import Settings
from runplane.sql import load_queries
from runplane.supervise import wait_any
from runplane.types import RunStatus

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

Q = load_queries("runner")

CANCEL_POLL_INTERVAL = 0.5


@dataclass(frozen=True)
class ClaimedRun:
    run_id: int
    account_id: int
    job_id: int
    steps: list[str]
    environment: dict[str, str]
    threads: int
    schema: str
    timeout_seconds: int
    memory_mb: int
    target_name: str
    git_branch: str
    pull_request_number: int | None
    cause: str
    cancel_requested: bool
    trace_parent: str = ""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ClaimedRun:
        overrides = row["overrides"] if isinstance(row["overrides"], dict) else {}
        steps = run_override(overrides, "steps") or row["steps"]
        environment = row["environment"] if isinstance(row["environment"], dict) else {}
        return cls(
            run_id=int(row["id"]),
            account_id=int(row["account_id"]),
            job_id=int(row["job_id"]),
            steps=[str(step) for step in steps],
            environment={str(k): str(v) for k, v in environment.items()},
            threads=int(run_override(overrides, "threads") or row["threads"]),
            schema=str(run_override(overrides, "schema") or row["schema_name"] or ""),
            timeout_seconds=int(run_override(overrides, "timeout_seconds") or row["timeout_seconds"] or 0),
            memory_mb=int(row["memory_mb"]),
            target_name=str(row["target_name"] or ""),
            git_branch=str(run_override(overrides, "git_branch") or row["git_branch"] or ""),
            pull_request_number=row["pull_request_number"],
            cause=str(row["cause"] or ""),
            cancel_requested=row["cancel_requested_at"] is not None,
            trace_parent=str(row.get("trace_parent") or ""),
        )


def step_environment(run: ClaimedRun) -> dict[str, str]:
    """What a step sees: this machine's environment without runplane's own settings, the job's
    environment, and the run's identity."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")}
    env.update(run.environment)
    env.update(
        RUNPLANE_RUN_ID=str(run.run_id),
        RUNPLANE_JOB_ID=str(run.job_id),
        RUNPLANE_ACCOUNT_ID=str(run.account_id),
        RUNPLANE_THREADS=str(run.threads),
        RUNPLANE_SCHEMA=run.schema,
        RUNPLANE_TARGET_NAME=run.target_name,
        RUNPLANE_GIT_BRANCH=run.git_branch,
        DBT_CLOUD_RUN_ID=str(run.run_id),
        DBT_CLOUD_JOB_ID=str(run.job_id),
        DBT_CLOUD_ACCOUNT_ID=str(run.account_id),
        DBT_CLOUD_RUN_REASON=run.cause,
    )
    if run.pull_request_number is not None:
        env["DBT_CLOUD_PR_ID"] = str(run.pull_request_number)
    return env


class Runner:
    def __init__(self, settings: Settings, pool: AsyncConnectionPool[Connection], run_id: int) -> None:
        self._settings = settings
        self._pool = pool
        self._run_id = run_id
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._control = StepControl()
        self._secrets: list[str] = []

    async def dbt_context(self) -> DbtContext | None:
        """What the run needs to run dbt; None for a job without an environment (plain commands)."""

        def decrypt(token: str) -> str:
            return box_from_settings(self._settings).decrypt(token)

        async with self._pool.connection() as conn:
            return await load_dbt_context(conn, self._run_id, decrypt)

    async def claim(self) -> ClaimedRun | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                TRANSITIONS["claim_run"],
                {"run_id": self._run_id, "owner": self._owner, "lease_seconds": self._settings.runner.lease_seconds},
            )
            row = await cur.fetchone()
        if row is None:
            return None
        # Started/prep/delay metrics are made from this row's timestamps by the scheduler loop.
        return ClaimedRun.from_row(row)

    async def execute(self, run: ClaimedRun, context: DbtContext | None = None) -> Outcome | None:
        """Run the steps; the outcome to write, or None when the lease was lost."""
        # The run's span continues the trace of whatever queued it (the trigger's call).
        attributes = {"run_id": run.run_id, "job_id": run.job_id, "account_id": run.account_id}
        with _tracer.start_as_current_span("run", context=tracing.extract(run.trace_parent), attributes=attributes):
            return await self._execute(run, context)

    async def _execute(self, run: ClaimedRun, context: DbtContext | None) -> Outcome | None:
        self._control.cancel_requested = run.cancel_requested
        async with self._pool.connection() as conn:
            await conn.execute(Q["create_steps"], {"run_id": run.run_id, "commands": run.steps})
        logs = RunLogs(self._pool, run.run_id)
        if context is not None:
            self._secrets = logs.secrets = context.secrets()
        stop = asyncio.Event()
        work_dir, temporary = self._work_dir(run.run_id)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._keep_lease(stop), name=f"runner:{run.run_id}:lease")
                group.create_task(logs.run(stop), name=f"runner:{run.run_id}:logs")
                try:
                    outcome = await self._steps(run, logs, work_dir, context)
                finally:
                    stop.set()
        finally:
            if temporary:
                shutil.rmtree(work_dir, ignore_errors=True)
        return outcome

    def _work_dir(self, run_id: int) -> tuple[Path, bool]:
        if self._settings.runner.work_dir:
            path = Path(self._settings.runner.work_dir) / f"run-{run_id}"
            path.mkdir(parents=True, exist_ok=True)
            return path, False
        return Path(tempfile.mkdtemp(prefix=f"runplane-run-{run_id}-")), True

    async def _steps(
        self, run: ClaimedRun, logs: RunLogs, work_dir: Path, context: DbtContext | None
    ) -> Outcome | None:
        deadline = time.monotonic() + run.timeout_seconds if run.timeout_seconds > 0 else None
        limits = Limits(
            deadline=deadline,
            memory_bytes=run.memory_mb * 1024 * 1024,
            cancel_grace=self._settings.runner.cancel_grace,
            interrupt_grace=self._settings.runner.interrupt_grace,
        )
        env = step_environment(run)
        cwd = work_dir
        collector = ArtifactCollector(work_dir / "target")
        async with contextlib.AsyncExitStack() as stack:
            if context is not None:
                try:
                    prepared = await stack.enter_async_context(self._prepared(context, logs, work_dir, limits))
                except PrepareError as exc:
                    await self._skip_from(0)
                    if self._control.abandoned:
                        return None
                    if self._control.cancel_requested:
                        return Outcome.cancelled("cancelled by request")
                    logs.write(0, f"runplane: {exc}\n".encode())
                    return Outcome.error(str(exc), FailureKind.STEP)
                env, cwd, collector = prepared.env, prepared.project, prepared.collector
            for index, command in enumerate(run.steps):
                if self._control.cancel_requested:
                    await self._skip_from(index)
                    return Outcome.cancelled("cancelled by request")
                if context is not None and is_dbt_step(command):
                    collector.watch(*dbt_output_directories(command, cwd, env))
                outcome, ended = await self._step(
                    run, logs=logs, index=index, command=command, cwd=cwd, env=env, limits=limits
                )
                await self._store_artifacts(run.run_id, index, collector, logs)
                if ended:
                    return outcome
        return Outcome.success()

    def _prepared(
        self, context: DbtContext, logs: RunLogs, work_dir: Path, limits: Limits
    ) -> contextlib.AbstractAsyncContextManager[PreparedRun]:
        cache_root = self._settings.runner.repository_cache or str(Path.home() / ".cache" / "runplane" / "repositories")

        async def record_sha(sha: str) -> None:
            params = {"run_id": self._run_id, "git_sha": sha, "owner": self._owner}
            async with self._pool.connection() as conn:
                await conn.execute(Q["record_git_sha"], params)

        return prepared_run(
            context,
            cache=RepositoryCache(Path(cache_root)),
            work_dir=work_dir,
            dbt_versions=self._settings.runner.dbt_versions,
            on_checkout=record_sha,
            say=lambda line: logs.write(0, f"runplane: {line}\n".encode()),
            on_output=lambda data: logs.write(0, data),
            control=self._control,
            limits=limits,
        )

    async def _step(
        self,
        run: ClaimedRun,
        *,
        logs: RunLogs,
        index: int,
        command: str,
        cwd: Path,
        env: dict[str, str],
        limits: Limits,
    ) -> tuple[Outcome | None, bool]:
        """Run one step; (outcome, True) when the run ends with it."""
        async with self._pool.connection() as conn:
            await conn.execute(Q["step_started"], {"run_id": run.run_id, "step_index": index})
        with _tracer.start_as_current_span(f"step {index + 1}", attributes={"command": command}):
            result = await run_step(
                command,
                cwd=str(cwd),
                env=env,
                on_output=lambda data: logs.write(index, data),
                control=self._control,
                limits=limits,
            )
        if result.end_reason:
            logs.write(index, f"\nrunplane: step {index + 1} ended: {result.end_reason}\n".encode())
        logs.end_step(index)
        step_status = RunStatus.SUCCESS if result.end is StepEnd.EXITED and result.exit_code == 0 else RunStatus.ERROR
        if result.end is StepEnd.CANCELLED:
            step_status = RunStatus.CANCELLED
        async with self._pool.connection() as conn:
            await conn.execute(
                Q["step_finished"],
                {
                    "run_id": run.run_id,
                    "step_index": index,
                    "status": int(step_status),
                    "exit_code": result.exit_code,
                    "end_reason": result.end_reason,
                },
            )
        if result.end is StepEnd.ABANDONED:
            return None, True
        outcome = self._step_outcome(result.end, result.exit_code, index, command, run.timeout_seconds)
        if outcome is not None:
            await self._skip_from(index + 1)
            return outcome, True
        return None, False

    @staticmethod
    def _step_outcome(end: StepEnd, exit_code: int | None, index: int, command: str, timeout: int) -> Outcome | None:
        match end:
            case StepEnd.EXITED:
                if exit_code == 0:
                    return None
                return Outcome.error(f"step {index + 1} failed with exit code {exit_code}: {command}", FailureKind.STEP)
            case StepEnd.CANCELLED:
                return Outcome.cancelled("cancelled by request")
            case StepEnd.TIMED_OUT:
                return Outcome.error(f"timed out after {timeout} s", FailureKind.STEP)
            case StepEnd.MEMORY_LIMIT:
                return Outcome.error(MEMORY_LIMIT_ERROR, FailureKind.STEP)
            case StepEnd.ABANDONED:
                return None

    async def _skip_from(self, index: int) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(Q["steps_skipped"], {"run_id": self._run_id, "from_index": index})

    async def _store_artifacts(self, run_id: int, step_index: int, collector: ArtifactCollector, logs: RunLogs) -> None:
        """Store what the step wrote or changed, tagged with the step; say so for what is too large."""
        scan = collector.scan()
        for found in scan.too_large:
            logs.write(
                step_index,
                f"runplane: {found.name} not kept: {found.size} bytes is over the "
                f"{scan.limit_shown()} limit of an artifact\n".encode(),
            )
        for found in scan.changed:
            try:
                content = found.path.read_bytes()
            except OSError:
                continue
            if self._secrets:
                content = mask(content.decode("utf-8", errors="surrogateescape"), self._secrets).encode(
                    "utf-8", errors="surrogateescape"
                )
            async with self._pool.connection() as conn:
                await conn.execute(
                    Q["upsert_artifact"],
                    {"run_id": run_id, "path": found.name, "step_index": step_index, "content": content},
                )

    async def _keep_lease(self, stop: asyncio.Event) -> None:
        """Renew the lease every heartbeat interval, poll for a cancel request in between."""
        interval = self._settings.runner.heartbeat_interval
        lease = self._settings.runner.lease_seconds
        last_renewal = time.monotonic()
        while not stop.is_set():
            if await wait_any(stop, timeout=min(CANCEL_POLL_INTERVAL, interval)):
                return
            renew = time.monotonic() - last_renewal >= interval
            try:
                async with self._pool.connection() as conn:
                    params = {"run_id": self._run_id, "owner": self._owner, "lease_seconds": lease}
                    cur = await conn.execute(Q["heartbeat"] if renew else Q["poll_run"], params)
                    row = await cur.fetchone()
            except ServiceUnavailable as exc:
                # Postgres away: keep working while the lease may still be ours.
                if time.monotonic() - last_renewal > lease:
                    log.error("lease expired without a renewal; stopping", extra={"run_id": self._run_id})
                    self._control.abandoned = True
                    return
                log.warning("heartbeat failed", extra={"run_id": self._run_id, "error": str(exc)})
                continue
            if row is None or (not renew and not row["held"]):
                log.error("lease lost; stopping the steps", extra={"run_id": self._run_id})
                self._control.abandoned = True
                return
            if renew:
                last_renewal = time.monotonic()
            if row["cancel_requested"]:
                self._control.cancel_requested = True

    async def finish(self, outcome: Outcome) -> bool:
        """Write the outcome (compare-and-set on our lease), then tell dispatchers a slot is free.

        Postgres may blink: the write is retried while the lease would still be ours. The pickups
        are best effort (the scheduler loop sends them anyway), so the bus is only reached after
        the outcome is safe.
        """
        deadline = time.monotonic() + self._settings.runner.lease_seconds
        while True:
            try:
                finished = await end_run(
                    self._pool,
                    None,
                    self._settings.bus_prefix,
                    self._run_id,
                    outcome,
                    policy=RetryPolicy.from_settings(self._settings.runner),
                    from_statuses=(RunStatus.RUNNING,),
                    lease_owner=self._owner,
                )
                break
            except ServiceUnavailable as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("outcome not written yet; retrying", extra={"run_id": self._run_id, "error": str(exc)})
                await asyncio.sleep(1.0)
        if finished is None:
            return False
        try:
            bus = await AmqpBus.connect(self._settings.amqp_url)
        except ServiceUnavailable as exc:
            log.warning("bus unavailable; the scheduler loop will pick up", extra={"error": str(exc)})
            return True
        try:
            await hint_pickups(bus, Topology(self._settings.bus_prefix), finished.pickup_accounts, source="outcome")
        finally:
            await bus.close()
        return True


async def run(settings: Settings, run_id: int) -> int:
    """Execute run ``run_id``; 0 when an outcome was written or the run was not ours to take."""
    pool = await open_pool(settings.database_url, min_size=1, max_size=4, name="runner")
    try:
        runner = Runner(settings, pool, run_id)
        claimed = await runner.claim()
        if claimed is None:
            log.info("run not in starting; nothing to do", extra={"run_id": run_id})
            return 0
        log.info("run claimed", extra={"run_id": run_id, "job_id": claimed.job_id, "account_id": claimed.account_id})
        try:
            context = await runner.dbt_context()
        except RunplaneError as exc:  # a secret the configured keys cannot open
            log.error("run cannot be prepared", extra={"run_id": run_id, "error": str(exc)})
            context = None
            outcome: Outcome | None = Outcome.error(f"the run cannot be prepared: {exc}", FailureKind.STEP)
        else:
            outcome = await runner.execute(claimed, context)
        if outcome is None:
            return 1
        if not await runner.finish(outcome):
            log.error("outcome not written: the lease moved on", extra={"run_id": run_id})
            return 1
        return 0
    finally:
        await pool.close()
