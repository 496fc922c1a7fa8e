"""The runner's one door to the control plane: the runner API (``runplane.v1.RunnerService``).

Everything the runner learns about its run comes from :meth:`RunnerApi.claim` (a ``RunSpec``), and
everything it records goes through the other calls, each carrying the run's token. The runner holds
no database, Redis or RabbitMQ address.

The lease is renewed (and a cancel read) over a connection of its own with a deadline of its own
(``LEASE_CALL_TIMEOUT``): a run's log and artifact calls, however large and many, never queue in
front of its heartbeat, on the wire or in the channel.

Writes are retried through a short outage (UNAVAILABLE, DEADLINE_EXCEEDED) for as long as the
lease would still be ours: until ``lease_seconds`` after the last renewal the server accepted.
Every call is idempotent on the server, so a retry of a call that took effect changes nothing. An
answer that the lease is gone (FAILED_PRECONDITION, PERMISSION_DENIED), or a lease that ran out
while retrying, raises :class:`LeaseLost`; from then on this object refuses every write itself,
so a runner that lost its lease writes nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from runplane.adapters.grpc_options import RUNNER_CHANNEL
from runplane.basics import backoff
from runplane.basics.errors import RunplaneError
from runplane.basics.types import FailureKind, Outcome
from runplane.v1 import common_pb2, runner_pb2, runner_pb2_grpc

log = logging.getLogger(__name__)

RunSpec = runner_pb2.RunSpec
T = TypeVar("T")

CALL_TIMEOUT = 10.0
LEASE_CALL_TIMEOUT = 3.0  # a renewal that takes longer is sent again while the lease lasts
RETRY_FIRST = 0.1
RETRY_CAP = 2.0
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
_LOST = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
_FAILURE_KINDS = {
    FailureKind.STEP: runner_pb2.FAILURE_KIND_STEP,
    FailureKind.INFRASTRUCTURE: runner_pb2.FAILURE_KIND_INFRASTRUCTURE,
}


class LeaseLost(RunplaneError):
    """The run is no longer ours to write: its lease moved on, it ended, or the token is not for it."""


def runner_channel(address: str, *, connect: bool = False, own_connection: bool = False) -> grpc.aio.Channel:
    """A channel to the runner API; with ``connect``, its connection is started now (without waiting),
    so a runner made ahead of its run finds it open when the run comes. With ``own_connection``, its
    TCP connection is shared with no other channel of this process (gRPC shares one between channels
    of the same target and options otherwise)."""
    options = [*RUNNER_CHANNEL, ("grpc.use_local_subchannel_pool", 1)] if own_connection else RUNNER_CHANNEL
    channel = grpc.aio.insecure_channel(address, options=options)
    if connect:
        channel.get_state(try_to_connect=True)
    return channel


class RunnerApi:
    """A connection to the runner API for one run, holding its token and, after the claim, its lease.

    ``channel``: one already open (a spare runner's, see ``runner.fork_server``); it is closed with this.
    """

    def __init__(
        self,
        address: str,
        token: str,
        run_id: int,
        *,
        claim_window: float = 30.0,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self._channel = channel if channel is not None else runner_channel(address)
        self._stub = runner_pb2_grpc.RunnerServiceStub(self._channel)
        self._lease_channel = runner_channel(address, own_connection=True)
        self._lease_stub = runner_pb2_grpc.RunnerServiceStub(self._lease_channel)
        self._metadata = (("authorization", f"Bearer {token}"),)
        self.run_id = run_id
        self.lease_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._lease_seconds = claim_window  # until the claim says otherwise
        self._lease_until = time.monotonic() + claim_window
        self.lost = False

    async def close(self) -> None:
        await self._lease_channel.close(None)
        await self._channel.close(None)

    @property
    def lease_remaining(self) -> float:
        return self._lease_until - time.monotonic()

    async def claim(self) -> RunSpec | None:
        """Take the run (starting → running); None when it is not starting (a duplicate runner)."""
        request = runner_pb2.ClaimRequest(run_id=self.run_id, lease_id=self.lease_id)
        try:
            spec = await self._call(
                "Claim",
                lambda: self._stub.Claim(request, metadata=self._metadata, timeout=CALL_TIMEOUT, wait_for_ready=True),
            )
        except LeaseLost as exc:
            log.info("run not claimed: %s", exc, extra={"run_id": self.run_id})
            return None
        self._lease_seconds = spec.lease_seconds
        self._lease_until = time.monotonic() + spec.lease_seconds
        return spec

    async def renew_lease(self) -> bool:
        """Extend the lease; whether a cancel was requested."""
        requested_at = time.monotonic()
        response = await self._call(
            "RenewLease",
            lambda: self._lease_stub.RenewLease(
                self._lease(), metadata=self._metadata, timeout=LEASE_CALL_TIMEOUT, wait_for_ready=True
            ),
        )
        # Counted from when the call was sent: the server renewed no earlier than that.
        self._lease_until = requested_at + self._lease_seconds
        return bool(response.cancel_requested)

    async def read_cancel(self) -> bool:
        """Whether a cancel was requested (the lease must still be ours)."""
        response = await self._call(
            "ReadCancel",
            lambda: self._lease_stub.ReadCancel(
                self._lease(), metadata=self._metadata, timeout=LEASE_CALL_TIMEOUT, wait_for_ready=True
            ),
        )
        return bool(response.cancel_requested)

    async def append_logs(self, chunks: Sequence[tuple[int, int, str]]) -> None:
        """Store ``(seq, step_index, text)`` chunks."""
        request = runner_pb2.AppendLogsRequest(
            run_id=self.run_id,
            lease_id=self.lease_id,
            chunks=[runner_pb2.RunnerLogChunk(seq=s, step_index=i, text=t) for s, i, t in chunks],
        )
        await self._call(
            "AppendLogs",
            lambda: self._stub.AppendLogs(request, metadata=self._metadata, timeout=CALL_TIMEOUT, wait_for_ready=True),
        )

    async def step_started(self, index: int) -> None:
        await self._set_step(runner_pb2.SetStepStatusRequest(step_index=index, state=runner_pb2.STEP_STATE_STARTED))

    async def step_finished(self, index: int, status: int, exit_code: int | None, end_reason: str = "") -> None:
        request = runner_pb2.SetStepStatusRequest(
            step_index=index,
            state=runner_pb2.STEP_STATE_FINISHED,
            status=common_pb2.RunStatus.ValueType(status),
            end_reason=end_reason,
        )
        if exit_code is not None:
            request.exit_code = exit_code
        await self._set_step(request)

    async def steps_skipped(self, from_index: int) -> None:
        await self._set_step(
            runner_pb2.SetStepStatusRequest(step_index=from_index, state=runner_pb2.STEP_STATE_SKIPPED)
        )

    async def upload_artifact(self, step_index: int, path: str, content: bytes) -> None:
        request = runner_pb2.UploadArtifactRequest(
            run_id=self.run_id, lease_id=self.lease_id, step_index=step_index, path=path, content=content
        )
        await self._call(
            "UploadArtifact",
            lambda: self._stub.UploadArtifact(request, metadata=self._metadata, timeout=60.0, wait_for_ready=True),
        )

    async def fetch_state_file(self, index: int) -> bytes:
        """The content of ``RunSpec.state_files[index]``."""
        request = runner_pb2.FetchStateFileRequest(run_id=self.run_id, lease_id=self.lease_id, index=index)
        response = await self._call(
            "FetchStateFile",
            lambda: self._stub.FetchStateFile(request, metadata=self._metadata, timeout=60.0, wait_for_ready=True),
        )
        return response.content

    async def record_git_sha(self, git_sha: str) -> None:
        """The commit the run checked out, shown on the run."""
        request = runner_pb2.RecordGitShaRequest(run_id=self.run_id, lease_id=self.lease_id, git_sha=git_sha)
        await self._call(
            "RecordGitSha",
            lambda: self._stub.RecordGitSha(
                request, metadata=self._metadata, timeout=CALL_TIMEOUT, wait_for_ready=True
            ),
        )

    async def finish(self, outcome: Outcome) -> None:
        """Write the outcome; the server frees the slot and tells dispatchers."""
        request = runner_pb2.FinishRequest(
            run_id=self.run_id,
            lease_id=self.lease_id,
            status=common_pb2.RunStatus.ValueType(outcome.status),
            message=outcome.message,
            failure=_FAILURE_KINDS[outcome.failure] if outcome.failure else runner_pb2.FAILURE_KIND_UNSPECIFIED,
        )
        await self._call(
            "Finish",
            lambda: self._stub.Finish(request, metadata=self._metadata, timeout=CALL_TIMEOUT, wait_for_ready=True),
        )
        self.lost = True  # the token is spent: nothing more to write

    async def _set_step(self, request: runner_pb2.SetStepStatusRequest) -> None:
        request.run_id, request.lease_id = self.run_id, self.lease_id
        await self._call(
            "SetStepStatus",
            lambda: self._stub.SetStepStatus(
                request, metadata=self._metadata, timeout=CALL_TIMEOUT, wait_for_ready=True
            ),
        )

    def _lease(self) -> runner_pb2.LeaseRequest:
        return runner_pb2.LeaseRequest(run_id=self.run_id, lease_id=self.lease_id)

    async def _call(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call``, retried through transient failures while the lease lasts."""
        if self.lost:
            raise LeaseLost(f"{name}: run {self.run_id} is no longer ours to write")
        try:
            return await _retried(
                name,
                call,
                until=lambda exc, delay: exc.code() not in _RETRYABLE or self.lease_remaining <= delay,
                run_id=self.run_id,
            )
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code in _LOST:
                self.lost = True
                raise LeaseLost(f"{name}: {exc.details()}") from exc
            if code not in _RETRYABLE:
                raise RunnerApiError(f"{name}: {code.name}: {exc.details()}") from exc
            self.lost = True
            raise LeaseLost(f"{name}: the runner API did not answer within the lease ({code.name})") from exc


async def _retried(
    name: str,
    call: Callable[[], Awaitable[T]],
    *,
    until: Callable[[grpc.aio.AioRpcError, float], bool],
    run_id: int | None = None,
) -> T:
    """``call``, tried again after each failure, waiting longer each time (``backoff.ceiling``), until
    it answers or ``until(error, next wait)`` says to stop: then that error is raised."""
    attempt = 0
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            attempt += 1
            delay = backoff.ceiling(RETRY_FIRST, attempt, cap=RETRY_CAP)
            if until(exc, delay):
                raise
            extra: dict[str, object] = {"code": exc.code().name, "delay": delay}
            if run_id is not None:
                extra["run_id"] = run_id
            log.warning("%s failed; retrying", name, extra=extra)
        await asyncio.sleep(delay)


async def wait_for_run(address: str, pool_token: str, *, wait_seconds: float) -> tuple[int, str] | None:
    """A warm pool Pod's wait: ``(run_id, run token)`` once a run is handed to it; None when its pool
    token is refused (spent, or its Pod replaced) or the run it was given went elsewhere.

    Waits through an outage of the runner API (the pool replaces a Pod it does not hear from).
    """
    channel = grpc.aio.insecure_channel(address, options=RUNNER_CHANNEL)
    stub = runner_pb2_grpc.RunnerServiceStub(channel)
    metadata = (("authorization", f"Bearer {pool_token}"),)
    try:
        while True:
            try:
                answer = await _retried(
                    "WaitForRun",
                    lambda: stub.WaitForRun(
                        runner_pb2.WaitForRunRequest(wait_seconds=wait_seconds),
                        metadata=metadata,
                        timeout=wait_seconds + CALL_TIMEOUT,
                        wait_for_ready=True,
                    ),
                    until=lambda exc, _delay: exc.code() in _LOST,
                )
            except grpc.aio.AioRpcError as exc:
                log.info("no run for this pool pod: %s", exc.details())
                return None
            if answer.run_id:
                return answer.run_id, answer.token
    finally:
        await channel.close(None)


class RunnerApiError(RunplaneError):
    """The runner API refused a call as malformed: a bug in the runner, not a lost lease."""
