"""The runner: executes one run from claim to outcome (``runplane runner --run-id N``).

1. Claim: starting → running with a compare-and-set that stamps ``started_at`` and takes the lease.
   A runner that finds the run in any other state (a duplicate launch) exits 0 doing nothing.
2. While it works, a lease task renews the lease every heartbeat interval and polls for a cancel
   request in between; if the lease was taken away (the reaper declared the runner lost), the
   steps are killed and the runner leaves without writing anything.
3. Steps run in order in a per-run working directory, their output streamed into log chunks and
   ``target/*.json`` stored as artifacts after each one.
4. The outcome is written with a compare-and-set on the lease owner (``runplane.runs.finish``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from opentelemetry import trace
from psycopg_pool import AsyncConnectionPool

from runner.run_logs import RunLogs
from runner.steps import Limits, StepControl, StepEnd, run_step
from runplane import tracing
from runplane.bus import AmqpBus, Topology
from runplane.db import Connection, open_pool
from runplane.errors import ServiceUnavailable
from runplane.runs.finish import MEMORY_LIMIT_ERROR, Outcome, end_run
from runplane.runs.pickups import hint_pickups
from runplane.runs.retries import FailureKind, RetryPolicy
from runplane.runs.transitions import TRANSITIONS
from runplane.settings import Settings
from runplane.sql import load_queries
from runplane.supervise import wait_any
from runplane.types import RunStatus

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

Q = load_queries("runner")

ARTIFACT_MAX_BYTES = 64 * 1024 * 1024
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
    def from_row(cls, row: dict[str, object]) -> ClaimedRun:
        overrides = row["overrides"] if isinstance(row["overrides"], dict) else {}
        steps = _override(overrides, "steps") or row["steps"]
        environment = row["environment"] if isinstance(row["environment"], dict) else {}
        return cls(
            run_id=int(row["id"]),  # type: ignore[call-overload]
            account_id=int(row["account_id"]),  # type: ignore[call-overload]
            job_id=int(row["job_id"]),  # type: ignore[call-overload]
            steps=[str(step) for step in steps],  # type: ignore[attr-defined]
            environment={str(k): str(v) for k, v in environment.items()},
            threads=int(_override(overrides, "threads") or row["threads"]),  # type: ignore[call-overload]
            schema=str(_override(overrides, "schema") or row["schema_name"] or ""),
            timeout_seconds=int(_override(overrides, "timeout_seconds") or row["timeout_seconds"] or 0),  # type: ignore[call-overload]
            memory_mb=int(row["memory_mb"]),  # type: ignore[call-overload]
            target_name=str(row["target_name"] or ""),
            git_branch=str(_override(overrides, "git_branch") or row["git_branch"] or ""),
            pull_request_number=row["pull_request_number"],  # type: ignore[arg-type]
            cause=str(row["cause"] or ""),
            cancel_requested=row["cancel_requested_at"] is not None,
            trace_parent=str(row.get("trace_parent") or ""),
        )


def _override(overrides: dict[str, object], name: str) -> object:
    """A run override by its proto field name (stored snake_case or camelCase)."""
    head, *rest = name.split("_")
    camel = head + "".join(part.title() for part in rest)
    return overrides.get(name) or overrides.get(camel)


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
        self._stored: dict[Path, tuple[int, int]] = {}  # artifact -> (mtime_ns, size) when stored

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

    async def execute(self, run: ClaimedRun) -> Outcome | None:
        """Run the steps; the outcome to write, or None when the lease was lost."""
        # The run's span continues the trace of whatever queued it (the trigger's call).
        attributes = {"run_id": run.run_id, "job_id": run.job_id, "account_id": run.account_id}
        with _tracer.start_as_current_span("run", context=tracing.extract(run.trace_parent), attributes=attributes):
            return await self._execute(run)

    async def _execute(self, run: ClaimedRun) -> Outcome | None:
        self._control.cancel_requested = run.cancel_requested
        async with self._pool.connection() as conn:
            await conn.execute(Q["create_steps"], {"run_id": run.run_id, "commands": run.steps})
        logs = RunLogs(self._pool, run.run_id)
        stop = asyncio.Event()
        work_dir, temporary = self._work_dir(run.run_id)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._keep_lease(stop), name=f"runner:{run.run_id}:lease")
                group.create_task(logs.run(stop), name=f"runner:{run.run_id}:logs")
                try:
                    outcome = await self._steps(run, logs, str(work_dir))
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

    async def _steps(self, run: ClaimedRun, logs: RunLogs, work_dir: str) -> Outcome | None:
        env = step_environment(run)
        deadline = time.monotonic() + run.timeout_seconds if run.timeout_seconds > 0 else None
        limits = Limits(
            deadline=deadline, memory_bytes=run.memory_mb * 1024 * 1024, cancel_grace=self._settings.runner.cancel_grace
        )
        for index, command in enumerate(run.steps):
            if self._control.cancel_requested:
                await self._skip_from(index)
                return Outcome.cancelled("cancelled by request")
            async with self._pool.connection() as conn:
                await conn.execute(Q["step_started"], {"run_id": run.run_id, "step_index": index})
            with _tracer.start_as_current_span(f"step {index + 1}", attributes={"command": command}):
                result = await run_step(
                    command,
                    cwd=work_dir,
                    env=env,
                    on_output=lambda data, index=index: logs.write(index, data),  # type: ignore[misc]
                    control=self._control,
                    limits=limits,
                )
            logs.end_step(index)
            await self._store_artifacts(run.run_id, index, Path(work_dir))
            step_status = (
                RunStatus.SUCCESS if result.end is StepEnd.EXITED and result.exit_code == 0 else RunStatus.ERROR
            )
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
                    },
                )
            outcome = self._step_outcome(result.end, result.exit_code, index, command, run.timeout_seconds)
            if result.end is StepEnd.ABANDONED:
                return None
            if outcome is not None:
                await self._skip_from(index + 1)
                return outcome
        return Outcome.success()

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

    async def _store_artifacts(self, run_id: int, step_index: int, work_dir: Path) -> None:
        """Store new or changed ``target/*.json`` files, tagged with the step that wrote them."""
        for path in sorted((work_dir / "target").glob("*.json")):
            try:
                stat = path.stat()
                if self._stored.get(path) == (stat.st_mtime_ns, stat.st_size):
                    continue  # unchanged since an earlier step stored it
                if stat.st_size > ARTIFACT_MAX_BYTES:
                    log.warning("artifact too large; not stored", extra={"run_id": run_id, "path": str(path)})
                    continue
                content = path.read_bytes()
            except OSError:
                continue
            async with self._pool.connection() as conn:
                await conn.execute(
                    Q["upsert_artifact"],
                    {
                        "run_id": run_id,
                        "path": str(path.relative_to(work_dir)),
                        "step_index": step_index,
                        "content": content,
                    },
                )
            self._stored[path] = (stat.st_mtime_ns, stat.st_size)

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
        outcome = await runner.execute(claimed)
        if outcome is None:
            return 1
        if not await runner.finish(outcome):
            log.error("outcome not written: the lease moved on", extra={"run_id": run_id})
            return 1
        return 0
    finally:
        await pool.close()
