"""The runner: executes one run from claim to outcome (``runplane runner --run-id N``).

The runner holds no control-plane credential: only the run's token (read from a file, or from
stdin, never from the environment) and the address of the runner API. Everything it knows about
the run comes from the claim (``RunSpec``, read only in this module), and everything it records
goes through :mod:`runner.control_plane`.

1. Claim: starting → running (a compare-and-set on the server that stamps ``started_at`` and takes
   the lease). A runner whose claim is refused (a duplicate launch) exits 0 doing nothing.
2. While it works, a lease task renews the lease every heartbeat interval and polls for a cancel
   request in between; if the lease was taken away (the reaper declared the runner lost), the
   steps are killed and the runner leaves without writing anything.
3. A job with an environment is prepared first (``runner.prepare``: checkout at the run's commit,
   a profile for this run, the dbt packages; the host's caches through ``runner.cache_keeper``),
   each part as one of the run's setup steps (``runner.setup_steps``); a failing preparation ends
   its setup step and the run as error with its reason in that step's log (a cancel or timeout
   during it as cancelled or timed out), never as a lost runner. A run directory the run cannot
   make ends it before its first step, the reason in that step's log.
4. Steps run in order (in the project's directory, or a per-run working directory for plain
   commands), their output streamed into log chunks with secrets masked, and dbt's artifacts
   stored per step after each one (``runner.artifacts``).
   Every step sees an environment built from an allow-list; secrets are masked in logs and artifacts.
5. The outcome is written under the lease; the server frees the slot and tells dispatchers.

A warm pool Pod (``runplane runner --pool``) starts with its own pool token instead of a run's and
waits on the runner API for a run (``wait_and_run``); what follows is the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import grpc
from opentelemetry import trace

from runner.artifacts import ArtifactCollector, dbt_output_directories
from runner.cache_keeper import InProcessCache, PrepCache
from runner.control_plane import LeaseLost, RunnerApi, RunnerApiError, RunSpec, wait_for_run
from runner.dbt_env import dbt_cloud_identity, is_dbt_step
from runner.fence import Fence, enter
from runner.node_cache import NodeCacheClient
from runner.prepare import PreparedRun, PrepareError, prepared_run
from runner.run_logs import RunLogs
from runner.run_user import RunUser
from runner.setup_steps import SetupSteps
from runner.state_files import StateFileError, place_state_file
from runner.steps import Limits, StepControl, StepEnd, run_step
from runner.warehouse_directory import prepare_own
from runplane.adapters import tracing
from runplane.basics.secrets import MASK
from runplane.basics.settings import Settings
from runplane.basics.supervise import wait_any
from runplane.basics.types import DISK_QUOTA_ERROR, MEMORY_LIMIT_ERROR, FailureKind, Outcome, RunStatus
from runplane.dbt.context import DbtContext, from_proto

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

CANCEL_POLL_INTERVAL = 0.5
# What a step inherits from the runner's own environment; everything else comes from the run.
INHERITED_VARIABLES = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "USER", "SSL_CERT_FILE", "SSL_CERT_DIR")
INHERITED_PREFIXES = ("LC_",)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
RUN_IDENTITY = "RUNPLANE_"  # set by the runner from the claim; no variable of the job or environment overrides them


def step_environment(spec: RunSpec) -> dict[str, str]:
    """What every step sees, from an allow-list: PATH, HOME, TMPDIR, locale and certificates of this
    machine, the run's identity, and the job's variables (secret ones decrypted). Nothing else of
    the runner's. A run with a dbt environment adds its own on top (``runner.dbt_env.dbt_step_environment``)."""
    env = {k: v for k, v in os.environ.items() if k in INHERITED_VARIABLES or k.startswith(INHERITED_PREFIXES)}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(spec.environment)
    env.update(
        RUNPLANE_RUN_ID=str(spec.run_id),
        RUNPLANE_JOB_ID=str(spec.job_id),
        RUNPLANE_ACCOUNT_ID=str(spec.account_id),
        RUNPLANE_THREADS=str(spec.threads),
        RUNPLANE_SCHEMA=spec.schema,
        RUNPLANE_TARGET_NAME=spec.target_name,
        RUNPLANE_GIT_BRANCH=spec.git_branch,
    )
    env.update(
        dbt_cloud_identity(
            run_id=spec.run_id,
            job_id=spec.job_id,
            account_id=spec.account_id,
            cause=spec.cause,
            pull_request_number=spec.pull_request_number,
        )
    )
    return env


def mask_bytes(content: bytes, secrets: list[str]) -> bytes:
    """``content`` with every secret, as written raw or inside a JSON string, replaced by *****."""
    forms = {v.encode() for v in secrets if v} | {json.dumps(v)[1:-1].encode() for v in secrets if v}
    if not forms:
        return content
    pattern = re.compile(b"|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))
    return pattern.sub(MASK.encode(), content)


class Runner:
    def __init__(
        self, settings: Settings, api: RunnerApi, fence: Fence | None = None, cache: PrepCache | None = None
    ) -> None:
        self._settings = settings
        self._api = api
        self._fence = fence or Fence()
        self._cache = cache or InProcessCache(settings)
        self._control = StepControl()
        self._masked: list[str] = []

    async def execute(self, spec: RunSpec) -> Outcome | None:
        """Run the steps; the outcome to write, or None when the lease was lost."""
        # The run's span continues the trace of whatever queued it (the trigger's call).
        attributes = {"run_id": spec.run_id, "job_id": spec.job_id, "account_id": spec.account_id}
        with _tracer.start_as_current_span("run", context=tracing.extract(spec.trace_parent), attributes=attributes):
            try:
                return await self._execute(spec)
            except LeaseLost as exc:  # a step-status or artifact write found the lease gone
                log.error("lease lost; stopping: %s", exc, extra={"run_id": spec.run_id})
                return None

    async def _execute(self, spec: RunSpec) -> Outcome | None:
        self._control.cancel_requested = spec.cancel_requested
        self._masked = list(spec.masked_values)
        logs = RunLogs(self._api.append_logs, secrets=self._masked)
        context = from_proto(spec.dbt) if spec.HasField("dbt") else None
        stop = asyncio.Event()
        work_dir: Path | None = None
        temporary = False
        outcome: Outcome | None
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._keep_lease(spec, stop), name=f"runner:{spec.run_id}:lease")
                group.create_task(self._ship_logs(logs, stop), name=f"runner:{spec.run_id}:logs")
                try:
                    try:
                        work_dir, temporary = self._work_dir(spec.run_id)
                    except OSError as exc:
                        outcome = await self._not_prepared(
                            logs, f"the run's directory cannot be made: {exc.strerror or exc} ({exc.filename})"
                        )
                    else:
                        outcome = await self._steps(spec, logs, work_dir, context)
                finally:
                    stop.set()
        finally:
            await self._cache.close()
            if temporary and work_dir is not None:
                shutil.rmtree(work_dir, ignore_errors=True)
        return None if self._control.abandoned else outcome

    async def _not_prepared(self, logs: RunLogs, message: str) -> Outcome:
        """The run ends before its first step: every step skipped, the reason in its log and status."""
        await self._api.steps_skipped(0)
        logs.write(0, f"runplane: {message}\n".encode())
        logs.end_step(0)  # nothing more comes: what the secret masking held back goes out too
        return Outcome.error(message, FailureKind.STEP)

    def _work_dir(self, run_id: int) -> tuple[Path, bool]:
        if self._settings.runner.work_dir:
            path = Path(self._settings.runner.work_dir) / f"run-{run_id}"
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            return path, False
        return Path(tempfile.mkdtemp(prefix=f"runplane-run-{run_id}-", dir=self._fence.work_root)), True

    async def _steps(self, spec: RunSpec, logs: RunLogs, work_dir: Path, context: DbtContext | None) -> Outcome | None:
        deadline = time.monotonic() + spec.timeout_seconds if spec.timeout_seconds > 0 else None
        limits = Limits(
            deadline=deadline,
            memory_bytes=spec.memory_mb * 1024 * 1024,
            cancel_grace=self._settings.runner.cancel_grace,
            interrupt_grace=self._settings.runner.interrupt_grace,
            confinement=self._fence.confinement,
            oom_kills=self._fence.cgroup.oom_kills if self._fence.cgroup is not None else None,
            output_room=logs.room,  # every step's, dbt deps' of the prep too
            scratch_full=self._fence.scratch_full if self._fence.scratch is not None else None,
        )
        if self._fence.refusal:
            return await self._not_prepared(logs, self._fence.refusal)
        env = step_environment(spec)
        cwd = work_dir
        collector = ArtifactCollector(work_dir / "target")
        async with contextlib.AsyncExitStack() as stack:
            if context is not None:
                setup = SetupSteps(self._api, logs, spec.setup_steps)
                try:
                    prepared = await stack.enter_async_context(self._prepared(context, setup, work_dir, limits, env))
                except PrepareError as exc:
                    return await self._prepare_failed(spec, setup, exc)
                except Exception as exc:  # a defect of the runner's own: still the run's error, with its reason
                    log.exception("preparing the run failed", extra={"run_id": spec.run_id})
                    message = f"preparing the run failed: {exc!r}"
                    await setup.failed(message)
                    return Outcome.error(message, FailureKind.STEP)
                finally:
                    await self._cache.close()  # nothing after prep may reach the host's caches
                await setup.done()
                # The job's variables (secret ones decrypted) over the environment's, the run's identity over both.
                env = {
                    **prepared.env,
                    **spec.environment,
                    **{k: v for k, v in env.items() if k.startswith(RUN_IDENTITY)},
                }
                cwd, collector = prepared.project, prepared.collector
            first = spec.setup_steps  # the job's first command: what comes before it is said in its log
            for index, state_file in enumerate(spec.state_files):
                try:
                    place_state_file(cwd, state_file.dest, await self._api.fetch_state_file(index))
                except (StateFileError, RunnerApiError) as exc:
                    await self._api.steps_skipped(first)
                    message = f"state file {state_file.path} of run {state_file.source_run_id}: {exc}"
                    logs.write(first, f"runplane: {message}\n".encode())
                    return Outcome.error(message, FailureKind.STEP)
                logs.write(first, f"runplane: {state_file.dest} from run {state_file.source_run_id}\n".encode())
            for index, command in enumerate(spec.steps):
                if index < first:
                    continue  # a setup step: run as the prep above
                if self._control.abandoned:
                    return None
                if self._control.cancel_requested:
                    await self._api.steps_skipped(index)
                    return Outcome.cancelled("cancelled by request")
                if context is not None and is_dbt_step(command):
                    collector.watch(*dbt_output_directories(command, cwd, env))
                outcome, ended = await self._step(
                    spec, logs=logs, index=index, command=command, cwd=cwd, env=env, limits=limits
                )
                if ended:
                    if outcome is not None:
                        await self._store_artifacts(index, collector, logs)
                    return outcome
                await self._store_artifacts(index, collector, logs)
        return Outcome.success()

    async def _prepare_failed(self, spec: RunSpec, setup: SetupSteps, exc: PrepareError) -> Outcome | None:
        """The prep ended the run: the failure of its setup step (cancelled for a cancel), the run's error."""
        match exc.end:
            case StepEnd.ABANDONED:
                await self._api.steps_skipped(0)
                return None
            case StepEnd.CANCELLED:
                await setup.failed(str(exc), RunStatus.CANCELLED)
                return Outcome.cancelled(str(exc))
            case StepEnd.TIMED_OUT:
                message = f"timed out after {spec.timeout_seconds} s: {exc}"
            case StepEnd.MEMORY_LIMIT:
                message = f"{MEMORY_LIMIT_ERROR}: {exc}"
            case StepEnd.DISK_QUOTA:
                message = f"{DISK_QUOTA_ERROR}: {exc}"
            case StepEnd.EXITED:
                message = str(exc)
        await setup.failed(message)
        return Outcome.error(message, FailureKind.STEP)

    def _prepared(
        self, context: DbtContext, setup: SetupSteps, work_dir: Path, limits: Limits, base_env: dict[str, str]
    ) -> contextlib.AbstractAsyncContextManager[PreparedRun]:
        return prepared_run(
            context,
            base_env=base_env,
            cache=self._cache,
            work_dir=work_dir,
            dbt_versions=self._settings.runner.dbt_versions,
            on_checkout=self._api.record_git_sha,
            on_part=setup.part,
            say=setup.say,
            on_output=setup.output,
            control=self._control,
            limits=limits,
        )

    async def _step(
        self,
        spec: RunSpec,
        *,
        logs: RunLogs,
        index: int,
        command: str,
        cwd: Path,
        env: dict[str, str],
        limits: Limits,
    ) -> tuple[Outcome | None, bool]:
        """Run one step; (outcome, True) when the run ends with it (outcome None: the lease was lost)."""
        await self._api.step_started(index)
        cgroup = self._fence.cgroup
        reached = cgroup.limits_reached() if cgroup is not None else None
        with _tracer.start_as_current_span(f"step {index + 1}", attributes={"command": command}):
            result = await run_step(
                command,
                cwd=str(cwd),
                env=env,
                on_output=lambda data: logs.write(index, data),
                control=self._control,
                limits=limits,
            )
        if result.end is StepEnd.ABANDONED:
            return None, True
        if result.end_reason:
            logs.write(index, f"\nrunplane: step {index + 1} ended: {result.end_reason}\n".encode())
        if cgroup is not None and reached is not None:
            for said in cgroup.limits_reached().since(reached):
                logs.write(index, f"runplane: step {index + 1}: {said}\n".encode())
        # "generate docs" and "source freshness": reported, not fatal (a cancel or timeout still is).
        optional_failure = result.end is StepEnd.EXITED and result.exit_code != 0 and index in spec.optional_steps
        if optional_failure:
            logs.write(index, f"runplane: step {index + 1} failed; it is optional, the run goes on\n".encode())
        logs.end_step(index)
        step_status = RunStatus.SUCCESS if result.end is StepEnd.EXITED and result.exit_code == 0 else RunStatus.ERROR
        if result.end is StepEnd.CANCELLED:
            step_status = RunStatus.CANCELLED
        await self._api.step_finished(index, int(step_status), result.exit_code, result.end_reason)
        outcome = self._step_outcome(
            result.end,
            result.exit_code,
            index,
            command,
            spec.timeout_seconds,
            error=logs.error_of(index),
            filled=self._fence.filled(),
        )
        if outcome is not None and optional_failure:
            return None, False
        if outcome is not None:
            if index + 1 < len(spec.steps):
                await self._api.steps_skipped(index + 1)
            return outcome, True
        return None, False

    @staticmethod
    def _step_outcome(
        end: StepEnd, exit_code: int | None, index: int, command: str, timeout: int, *, error: str | None, filled: str
    ) -> Outcome | None:
        match end:
            case StepEnd.EXITED:
                if exit_code == 0:
                    return None
                failed = f"step {index + 1} failed with exit code {exit_code}: {command}"
                # dbt's own reason (the adapter's error) says what the exit code does not.
                return Outcome.error(f"{failed} — {error}" if error else failed, FailureKind.STEP)
            case StepEnd.CANCELLED:
                return Outcome.cancelled("cancelled by request")
            case StepEnd.TIMED_OUT:
                return Outcome.error(f"timed out after {timeout} s", FailureKind.STEP)
            case StepEnd.MEMORY_LIMIT:
                return Outcome.error(MEMORY_LIMIT_ERROR, FailureKind.STEP)
            case StepEnd.DISK_QUOTA:
                return Outcome.error(
                    f"{DISK_QUOTA_ERROR}: step {index + 1} filled {filled or 'the room the run may write in'}",
                    FailureKind.STEP,
                )
            case StepEnd.ABANDONED:
                return None

    async def _store_artifacts(self, step_index: int, collector: ArtifactCollector, logs: RunLogs) -> None:
        """Upload what the step wrote or changed, tagged with the step, masked; say so for what is too large."""
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
            await self._api.upload_artifact(step_index, found.name, mask_bytes(content, self._masked))

    async def _ship_logs(self, logs: RunLogs, stop: asyncio.Event) -> None:
        try:
            await logs.run(stop)
        except LeaseLost as exc:
            log.error("lease lost while writing logs; stopping the steps: %s", exc, extra={"run_id": self._api.run_id})
            self._control.abandoned = True

    async def _keep_lease(self, spec: RunSpec, stop: asyncio.Event) -> None:
        """Renew the lease every heartbeat interval, poll for a cancel request in between."""
        interval = spec.heartbeat_interval or self._settings.runner.heartbeat_interval
        last_renewal = time.monotonic()
        while not stop.is_set():
            if await wait_any(stop, timeout=min(CANCEL_POLL_INTERVAL, interval)):
                return
            renew = time.monotonic() - last_renewal >= interval
            try:
                cancel = await (self._api.renew_lease() if renew else self._api.read_cancel())
            except LeaseLost as exc:
                log.error("lease lost; stopping the steps: %s", exc, extra={"run_id": spec.run_id})
                self._control.abandoned = True
                return
            if renew:
                last_renewal = time.monotonic()
            if cancel:
                self._control.cancel_requested = True


def read_token(source: str) -> str:
    """The run token from a file, or from stdin when ``source`` is ``-`` (its first line)."""
    token = sys.stdin.readline() if source == "-" else Path(source).read_text(encoding="utf-8")
    return token.strip()


async def run(
    settings: Settings,
    run_id: int,
    token: str,
    *,
    channel: grpc.aio.Channel | None = None,
    run_user: RunUser | None = None,
    cache: PrepCache | None = None,
) -> int:
    """Execute run ``run_id`` with its token; 0 when an outcome was written or the run was not ours.
    ``channel``: a runner API channel opened ahead of the run (it is closed at the end). ``run_user``:
    a uid leased for the run (as root); once the run is claimed, it is fenced and this process
    switches to that uid (``runner.fence``). ``cache``: the host's caches for the prep (default:
    the node's keeper for the packages when ``runner.node_cache_socket`` names one, else kept by this
    process itself)."""
    api = RunnerApi(settings.runner.api_address, token, run_id, channel=channel)
    try:
        spec = await api.claim()
        if spec is None:
            log.info("run not starting or not ours; nothing to do", extra={"run_id": run_id})
            return 0
        log.info("run claimed", extra={"run_id": run_id, "job_id": spec.job_id, "account_id": spec.account_id})
        # Before the run's tasks start: nothing else waits on this loop yet.
        if run_user is not None:
            fence = enter(settings, run_user, spec)
        else:  # one user for every run: the warehouse directory is that user's
            fence = Fence(refusal=prepare_own(settings.runner, spec))
        if cache is None and settings.runner.node_cache_socket:
            cache = NodeCacheClient(
                Path(settings.runner.node_cache_socket),
                token=token,
                run_id=run_id,
                lease_id=api.lease_id,
                local=InProcessCache(settings),
            )
        outcome = await Runner(settings, api, fence, cache).execute(spec)
        if outcome is None:
            return 1
        try:
            await api.finish(outcome)
        except LeaseLost as exc:
            log.error("outcome not written: %s", exc, extra={"run_id": run_id})
            return 1
        return 0
    finally:
        await api.close()
        if cache is not None:
            await cache.close()


async def wait_and_run(settings: Settings, pool_token: str) -> int:
    """A warm pool Pod: everything is imported and started; wait on the runner API for a run, then
    execute it exactly as :func:`run` does. One run per Pod: it exits after, and the pool refills."""
    assignment = await wait_for_run(
        settings.runner.api_address, pool_token, wait_seconds=settings.runner.pool_wait_seconds
    )
    if assignment is None:
        return 0
    run_id, token = assignment
    log.info("run handed to this pool pod", extra={"run_id": run_id})
    return await run(settings, run_id, token)
