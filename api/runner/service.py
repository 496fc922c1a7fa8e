"""``runplane.v1.RunnerService``: everything a runner does to the control plane, for one run at a time.

Served by the API process on a listener of its own (``api.runner_port``), apart from the public
API: the network policy can then let runner Pods reach this port and nothing else, and the public
services never see a run token. The API process already holds the store, the pool and the pickup
publisher that finishing a run needs, and scales out the same way, so no new process is needed.

Authentication is the run token (``authorization: Bearer rpr_…``): the interceptor in ``run_token``
reads it for every call, and every statement checks it against the run's stored sha256 (for the
writes, one place: ``RunnerService._leased``). A token of another run is PERMISSION_DENIED; a run that is not
(or no longer) starting/running under this lease is FAILED_PRECONDITION. Writes take the run row
``FOR SHARE`` for the length of their transaction, so a reaper that takes the lease waits for a
write in flight and every write after it finds the lease gone. Calls are idempotent, so a runner
retries through a short outage: a log chunk by its seq, a step by its state, an artifact by its
step and path, a claim by its lease id, an outcome already written by the same lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from api.pickup_publisher import PickupPublisher
from api.runner.run_spec import DEFER_MANIFEST, build_run_spec, claimed_run, decrypter, load_dbt_context
from api.runner.run_token import caller_token
from api.store import Store
from runplane.adapters.db import Connection, fetch_one, fetch_value
from runplane.basics.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import RunnerSettings
from runplane.basics.tokens import new_run_token, token_hash
from runplane.basics.types import FailureKind, Outcome, RunStatus
from runplane.dbt import fields
from runplane.runs.finish import finish_run
from runplane.runs.retries import RetryPolicy
from runplane.runs.transitions import TRANSITIONS
from runplane.sql import load_queries
from runplane.v1 import runner_pb2, runner_pb2_grpc

log = logging.getLogger(__name__)

Q = load_queries("api.runner")

MAX_LEASE_ID = 200
MAX_CHUNKS_PER_CALL = 1000
MAX_CHUNK_CHARS = 1024 * 1024
MAX_LOG_CALL_CHARS = 8 * 1024 * 1024
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024
MAX_ARTIFACT_PATH = 1024
MAX_END_REASON = 200
NO_RUN = 0  # run ids start at 1
MAX_POOL_WAIT = 60.0  # seconds one WaitForRun may be held open
FINISHED_STEP_STATUSES = (RunStatus.SUCCESS, RunStatus.ERROR, RunStatus.CANCELLED)
_FAILURE_KINDS = {
    runner_pb2.FAILURE_KIND_STEP: FailureKind.STEP,
    runner_pb2.FAILURE_KIND_INFRASTRUCTURE: FailureKind.INFRASTRUCTURE,
}

Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True)
class PoolRunner:
    """A warm pool Pod as its own token finds it, and the run a dispatcher gave it (if any)."""

    name: str
    run_id: int | None


@dataclass(frozen=True)
class Lease:
    """A run held under its lease for one transaction (see ``RunnerService._leased``)."""

    conn: Connection
    step_count: int

    def check_step(self, index: int) -> None:
        if not 0 <= index < self.step_count:
            raise InvalidArgument("step_index", f"the run has steps 0 to {self.step_count - 1}")


@dataclass(frozen=True)
class _RunAccess:
    """Why a call on a run is allowed or refused (``run_access``)."""

    status: int
    lease_owner: str | None
    token_ok: bool | None  # NULL: the run has no token (yet)
    cancel_requested: bool
    account_id: int


@dataclass(frozen=True)
class _Locked:
    cancel_requested: bool
    step_count: int


@dataclass(frozen=True)
class _StateFile:
    content: bytes


class RunnerService(runner_pb2_grpc.RunnerServiceServicer):
    """The RPCs; served behind :class:`api.runner.run_token.RunTokenInterceptor`, which reads each call's
    token and maps what the RPCs raise to status codes."""

    def __init__(self, store: Store, pickups: PickupPublisher, runner: RunnerSettings, box: SecretBox | None) -> None:
        self._store = store
        self._pickups = pickups
        self._runner = runner
        self._box = box
        self._policy = RetryPolicy.from_settings(runner)

    async def warm_up(self) -> None:
        """Run the claim's statements once, on a run id that never exists, before the port opens: a
        pooled connection's first use of a statement (catalog lookups, planning) then falls on no
        run's claim. It changes nothing."""
        params = {"run_id": NO_RUN, "token_hash": b"", "lease_id": "warm-up"}
        async with self._store.transaction() as conn:
            await conn.execute(TRANSITIONS["claim_run"], {**params, "lease_seconds": self._runner.lease_seconds})
            await conn.execute(Q["record_deferral"], {"run_id": NO_RUN, "dest": DEFER_MANIFEST})
            await claimed_run(conn, params)
            await load_dbt_context(conn, NO_RUN, decrypter(self._box))
            await conn.execute(Q["lock_lease"], params)
            await conn.execute(Q["run_access"], {"run_id": NO_RUN, "token_hash": b""})

    # --- claim and lease

    async def Claim(self, request: runner_pb2.ClaimRequest, context: Context) -> runner_pb2.RunSpec:
        token = caller_token()
        lease_id = _lease_id(request.lease_id)
        params = {"run_id": request.run_id, "token_hash": token, "lease_id": lease_id}
        async with self._store.transaction() as conn:
            cur = await conn.execute(TRANSITIONS["claim_run"], {**params, "lease_seconds": self._runner.lease_seconds})
            claimed = await cur.fetchone() is not None
            if claimed:
                await conn.execute(Q["record_deferral"], {"run_id": request.run_id, "dest": DEFER_MANIFEST})
            row = await claimed_run(conn, params)
            if row is None:  # not ours: say why (a retried claim of our own lease finds its row above)
                await _refuse(conn, request.run_id, token, lease_id, claiming=True)
            assert row is not None
            dbt = await load_dbt_context(conn, request.run_id, decrypter(self._box))
            spec = build_run_spec(
                row,
                lease_id=lease_id,
                lease_seconds=self._runner.lease_seconds,
                heartbeat_interval=self._runner.heartbeat_interval,
                box=self._box,
                dbt=dbt,
            )
            if claimed:
                await conn.execute(
                    Q["create_steps"],
                    {
                        "run_id": request.run_id,
                        "commands": list(spec.steps),
                        "optional": list(spec.optional_steps),
                        "setup": spec.setup_steps,
                    },
                )
        log.info(
            "run claimed",
            extra={
                "run_id": spec.run_id,
                "job_id": spec.job_id,
                "account_id": spec.account_id,
                "again": not claimed,
            },
        )
        return spec

    async def RenewLease(self, request: runner_pb2.LeaseRequest, context: Context) -> runner_pb2.LeaseResponse:
        token, lease_id = caller_token(), _lease_id(request.lease_id)
        params = {
            "run_id": request.run_id,
            "token_hash": token,
            "lease_id": lease_id,
            "lease_seconds": self._runner.lease_seconds,
        }
        async with self._store.transaction() as conn:
            cancel_requested = await fetch_value(conn, Q["renew_lease"], params, bool)
            if cancel_requested is None:
                await _refuse(conn, request.run_id, token, lease_id)
            assert cancel_requested is not None
        return runner_pb2.LeaseResponse(cancel_requested=cancel_requested)

    async def ReadCancel(self, request: runner_pb2.LeaseRequest, context: Context) -> runner_pb2.LeaseResponse:
        row = await self._read_access(request.run_id, request.lease_id)
        return runner_pb2.LeaseResponse(cancel_requested=row.cancel_requested)

    async def RunAccount(self, request: runner_pb2.LeaseRequest, context: Context) -> runner_pb2.RunAccountResponse:
        """Whose run this is, for the node's cache keeper: the same check as ReadCancel (the run's
        token, running, under this lease), so a finished run's token or another run's learns nothing."""
        row = await self._read_access(request.run_id, request.lease_id)
        return runner_pb2.RunAccountResponse(account_id=row.account_id)

    async def _read_access(self, run_id: int, lease_id: str) -> _RunAccess:
        """The run, read without a lock, while it is the caller's (its token, running, under ``lease_id``);
        refused with the reason otherwise."""
        token, lease_id = caller_token(), _lease_id(lease_id)
        async with self._store.connection() as conn:
            row = await _run_access(conn, run_id, token)
        _check_access(row, run_id, lease_id)
        assert row is not None
        return row

    # --- writes under the lease

    @contextlib.asynccontextmanager
    async def _leased(self, run_id: int, lease_id: str) -> AsyncIterator[Lease]:
        """A transaction in which the run is the caller's: its token and ``lease_id`` match the run's row,
        which stays locked ``FOR SHARE`` until the transaction ends. Refused with the reason otherwise."""
        lease_id = _lease_id(lease_id)
        async with self._store.transaction() as conn:
            yield Lease(conn, await _lock_lease(conn, run_id, caller_token(), lease_id))

    async def AppendLogs(
        self, request: runner_pb2.AppendLogsRequest, context: Context
    ) -> runner_pb2.AppendLogsResponse:
        chunks = list(request.chunks)
        _validate_chunks(chunks)
        async with self._leased(request.run_id, request.lease_id) as lease:
            for chunk in chunks:
                lease.check_step(chunk.step_index)
            cur = await lease.conn.execute(
                Q["insert_log_chunks"],
                {
                    "run_id": request.run_id,
                    "seqs": [c.seq for c in chunks],
                    "step_indexes": [c.step_index for c in chunks],
                    "texts": [c.text for c in chunks],
                },
            )
            stored = cur.rowcount
        return runner_pb2.AppendLogsResponse(stored=max(0, stored))

    async def SetStepStatus(
        self, request: runner_pb2.SetStepStatusRequest, context: Context
    ) -> runner_pb2.SetStepStatusResponse:
        run_id, index = request.run_id, request.step_index
        async with self._leased(run_id, request.lease_id) as lease:
            lease.check_step(index)
            conn = lease.conn
            step = {"run_id": run_id, "step_index": index}
            match request.state:
                case runner_pb2.STEP_STATE_STARTED:
                    cur = await conn.execute(Q["step_started"], step)
                    if await cur.fetchone() is None:
                        current = await _step(conn, run_id, index)
                        if current["status"] != RunStatus.RUNNING:  # a retry of a start that took effect is fine
                            raise FailedPrecondition(
                                f"step {index} cannot start: it is {_step_state(current)}"
                                " or an earlier step has not ended"
                            )
                case runner_pb2.STEP_STATE_FINISHED:
                    status = _finished_status(request.status)
                    exit_code = request.exit_code if request.HasField("exit_code") else None
                    end_reason = request.end_reason[:MAX_END_REASON]
                    cur = await conn.execute(
                        Q["step_finished"],
                        {**step, "status": int(status), "exit_code": exit_code, "end_reason": end_reason},
                    )
                    if await cur.fetchone() is None:
                        current = await _step(conn, run_id, index)
                        if (current["status"], current["exit_code"]) != (status, exit_code):
                            raise FailedPrecondition(f"step {index} cannot finish: it is {_step_state(current)}")
                case runner_pb2.STEP_STATE_SKIPPED:
                    await conn.execute(Q["steps_skipped"], {"run_id": run_id, "from_index": index})
                case _:
                    raise InvalidArgument("state", "must be STARTED, FINISHED or SKIPPED")
        return runner_pb2.SetStepStatusResponse()

    async def UploadArtifact(
        self, request: runner_pb2.UploadArtifactRequest, context: Context
    ) -> runner_pb2.UploadArtifactResponse:
        path = _artifact_path(request.path)
        if len(request.content) > MAX_ARTIFACT_BYTES:
            raise InvalidArgument("content", f"artifacts are at most {MAX_ARTIFACT_BYTES} bytes")
        async with self._leased(request.run_id, request.lease_id) as lease:
            lease.check_step(request.step_index)
            await lease.conn.execute(
                Q["upsert_artifact"],
                {
                    "run_id": request.run_id,
                    "path": path,
                    "step_index": request.step_index,
                    "content": request.content,
                },
            )
        return runner_pb2.UploadArtifactResponse()

    async def FetchStateFile(
        self, request: runner_pb2.FetchStateFileRequest, context: Context
    ) -> runner_pb2.FetchStateFileResponse:
        async with self._leased(request.run_id, request.lease_id) as lease:
            # Only a file the run was given (its row says which), of a run of the same account.
            params = {"run_id": request.run_id, "index": request.index}
            row = await fetch_one(lease.conn, Q["state_file"], params, _StateFile)
        if row is None:
            raise NotFound(f"run {request.run_id} has no state file {request.index} (or its source run is gone)")
        return runner_pb2.FetchStateFileResponse(content=bytes(row.content))

    async def RecordGitSha(
        self, request: runner_pb2.RecordGitShaRequest, context: Context
    ) -> runner_pb2.RecordGitShaResponse:
        git_sha = fields.git_sha(request.git_sha)
        if not git_sha:
            raise InvalidArgument("git_sha", "is required")
        async with self._leased(request.run_id, request.lease_id) as lease:
            await lease.conn.execute(Q["record_git_sha"], {"run_id": request.run_id, "git_sha": git_sha})
        return runner_pb2.RecordGitShaResponse()

    async def Finish(self, request: runner_pb2.FinishRequest, context: Context) -> runner_pb2.FinishResponse:
        token, lease_id = caller_token(), _lease_id(request.lease_id)
        status = _finished_status(request.status)
        failure = _FAILURE_KINDS.get(request.failure)
        if status is RunStatus.ERROR and failure is None:
            raise InvalidArgument("failure", "an error needs a failure kind (STEP or INFRASTRUCTURE)")
        outcome = Outcome(status, request.message[:10_000], failure if status is RunStatus.ERROR else None)
        async with self._store.transaction() as conn:
            if await _already_finished(conn, request.run_id, token, lease_id, status):
                return runner_pb2.FinishResponse()  # a retry of a finish that took effect
            await _lock_lease(conn, request.run_id, token, lease_id)
            finished = await finish_run(
                conn,
                request.run_id,
                outcome,
                policy=self._policy,
                from_statuses=(RunStatus.RUNNING,),
                lease_owner=lease_id,
            )
            assert finished is not None  # the lease is locked: the compare-and-set cannot lose
        for account_id in sorted(finished.pickup_accounts):
            await self._pickups.publish(account_id)  # a hint: the scheduler loop resends
        return runner_pb2.FinishResponse(retry_run_id=finished.retry_run_id or 0)

    # --- warm pool Pods

    async def WaitForRun(
        self, request: runner_pb2.WaitForRunRequest, context: Context
    ) -> runner_pb2.WaitForRunResponse:
        """Hold a pool Pod's call until a dispatcher gives it a run, then hand over the run's new token.

        The Pod's heartbeat is written when the call comes in and every ``pool_seen_interval`` while
        it waits; in between the call only reads (a few waiting Pods cost a few reads a second).
        """
        token = caller_token()
        deadline = time.monotonic() + min(max(request.wait_seconds, 0.0), MAX_POOL_WAIT)
        seen_at = 0.0
        while True:
            async with self._store.connection() as conn:
                row = await fetch_one(conn, Q["pool_runner_waiting"], {"token_hash": token}, PoolRunner)
                if row is None:
                    raise PermissionDenied("this token is not a waiting pool Pod's")
                if row.run_id is not None:
                    return await self._hand_over(conn, row.name, row.run_id)
                if time.monotonic() - seen_at >= self._runner.pool_seen_interval:
                    await conn.execute(Q["pool_runner_seen"], {"name": row.name})
                    seen_at = time.monotonic()
            if time.monotonic() >= deadline:
                return runner_pb2.WaitForRunResponse()
            await asyncio.sleep(min(self._runner.pool_poll_interval, max(0.0, deadline - time.monotonic())))

    async def _hand_over(self, conn: Connection, name: str, run_id: int) -> runner_pb2.WaitForRunResponse:
        run_token = new_run_token()
        cur = await conn.execute(Q["hand_run_to_pool_runner"], {"name": name, "run_token_hash": token_hash(run_token)})
        if await cur.fetchone() is None:  # cancelled or relaunched before the Pod asked: the Pod leaves
            raise FailedPrecondition(f"run {run_id} is no longer starting for pool Pod {name}")
        log.info("run handed to a pool pod", extra={"run_id": run_id, "pod": name})
        return runner_pb2.WaitForRunResponse(run_id=run_id, token=run_token)


def _lease_id(value: str) -> str:
    if not value or len(value) > MAX_LEASE_ID:
        raise InvalidArgument("lease_id", f"1 to {MAX_LEASE_ID} characters, from the claim")
    return value


async def _lock_lease(conn: Connection, run_id: int, token: bytes, lease_id: str) -> int:
    """Lock the run while it is ours (token and lease); its step count. Refuses otherwise."""
    row = await fetch_one(conn, Q["lock_lease"], {"run_id": run_id, "token_hash": token, "lease_id": lease_id}, _Locked)
    if row is None:
        await _refuse(conn, run_id, token, lease_id)
    assert row is not None
    return row.step_count


async def _refuse(conn: Connection, run_id: int, token: bytes, lease_id: str, *, claiming: bool = False) -> None:
    """Raise the error that says why the token or the lease does not allow the call."""
    row = await _run_access(conn, run_id, token)
    if claiming and row is not None and row.token_ok:
        status = RunStatus(row.status)
        raise FailedPrecondition(f"run {run_id} is not starting (status {status.name.lower()})")
    _check_access(row, run_id, lease_id)
    raise FailedPrecondition(f"run {run_id} changed under the call; try again")


async def _already_finished(conn: Connection, run_id: int, token: bytes, lease_id: str, status: RunStatus) -> bool:
    row = await _run_access(conn, run_id, token)
    return bool(row and row.token_ok and row.lease_owner == lease_id and row.status == status)


async def _run_access(conn: Connection, run_id: int, token: bytes) -> _RunAccess | None:
    return await fetch_one(conn, Q["run_access"], {"run_id": run_id, "token_hash": token}, _RunAccess)


def _check_access(row: _RunAccess | None, run_id: int, lease_id: str) -> None:
    # An unknown run and another run's token look the same: nothing is learnt about other runs.
    if row is None or not row.token_ok:
        raise PermissionDenied(f"this token is not for run {run_id}")
    status = RunStatus(row.status)
    if status is not RunStatus.RUNNING:
        raise FailedPrecondition(f"run {run_id} is {status.name.lower()}: its token is spent")
    if row.lease_owner != lease_id:
        raise FailedPrecondition(f"run {run_id}: the lease is held by another runner")


def _validate_chunks(chunks: list[runner_pb2.RunnerLogChunk]) -> None:
    if not chunks:
        raise InvalidArgument("chunks", "at least one chunk")
    if len(chunks) > MAX_CHUNKS_PER_CALL:
        raise InvalidArgument("chunks", f"at most {MAX_CHUNKS_PER_CALL} per call")
    seqs = [c.seq for c in chunks]
    if len(set(seqs)) != len(seqs):
        raise InvalidArgument("chunks.seq", "each seq once per call")
    total = 0
    for chunk in chunks:
        if chunk.seq < 1:
            raise InvalidArgument("chunks.seq", "starts at 1")
        if len(chunk.text) > MAX_CHUNK_CHARS:
            raise InvalidArgument("chunks.text", f"at most {MAX_CHUNK_CHARS} characters per chunk")
        if "\x00" in chunk.text:
            raise InvalidArgument("chunks.text", "NUL characters cannot be stored")
        total += len(chunk.text)
    if total > MAX_LOG_CALL_CHARS:
        raise InvalidArgument("chunks", f"at most {MAX_LOG_CALL_CHARS} characters per call")


async def _step(conn: Connection, run_id: int, index: int) -> dict[str, Any]:
    cur = await conn.execute(Q["step_of_run"], {"run_id": run_id, "step_index": index})
    row = await cur.fetchone()
    assert row is not None  # the index was checked against the run's steps under the lock
    return row


def _step_state(step: dict[str, Any]) -> str:
    return RunStatus(step["status"]).name.lower()


def _finished_status(value: int) -> RunStatus:
    try:
        status = RunStatus(value)
    except ValueError:
        status = RunStatus.QUEUED
    if status not in FINISHED_STEP_STATUSES:
        raise InvalidArgument("status", "must be SUCCESS, ERROR or CANCELLED")
    return status


def _artifact_path(path: str) -> str:
    """A relative path inside the work directory, normalised."""
    if not path or len(path) > MAX_ARTIFACT_PATH or "\x00" in path:
        raise InvalidArgument("path", f"1 to {MAX_ARTIFACT_PATH} characters")
    normal = posixpath.normpath(path)
    if normal.startswith(("/", "..")) or normal == ".":
        raise InvalidArgument("path", "must be relative to the work directory")
    return normal
