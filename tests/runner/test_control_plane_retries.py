"""The runner's calls to the runner API ride out a short outage with one backoff, and stop at once
when the answer says the run is not theirs; served here by a real gRPC server that answers as told."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from runner.control_plane import LeaseLost, RunnerApi, RunnerApiError, wait_for_run
from runplane.v1 import runner_pb2, runner_pb2_grpc

Code = grpc.StatusCode


class ScriptedRunnerApi(runner_pb2_grpc.RunnerServiceServicer):
    """Answers each call with the next status of ``script`` (None: an answer), then answers."""

    def __init__(self) -> None:
        self.script: list[Code | None] = []
        self.calls = 0

    async def _next(self, context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
        self.calls += 1
        code = self.script.pop(0) if self.script else None
        if code is not None:
            await context.abort(code, f"scripted {code.name}")

    async def WaitForRun(
        self,
        request: runner_pb2.WaitForRunRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> runner_pb2.WaitForRunResponse:
        await self._next(context)
        return runner_pb2.WaitForRunResponse(run_id=7, token="run-token")

    async def Claim(
        self,
        request: runner_pb2.ClaimRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> runner_pb2.RunSpec:
        await self._next(context)
        return runner_pb2.RunSpec(run_id=request.run_id, lease_seconds=30)

    async def RenewLease(
        self,
        request: runner_pb2.LeaseRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> runner_pb2.LeaseResponse:
        await self._next(context)
        return runner_pb2.LeaseResponse()


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, ScriptedRunnerApi]]:
    servicer = ScriptedRunnerApi()  # type: ignore[abstract]  # the calls a runner makes here, no more
    grpc_server = grpc.aio.server()
    runner_pb2_grpc.add_RunnerServiceServicer_to_server(servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await grpc_server.stop(None)


async def test_a_pool_pod_waits_through_an_outage_and_stops_when_its_token_is_refused(
    server: tuple[str, ScriptedRunnerApi],
) -> None:
    address, api = server
    api.script = [Code.UNAVAILABLE, Code.UNAVAILABLE, None]
    assert await wait_for_run(address, "pool-token", wait_seconds=1) == (7, "run-token")
    assert api.calls == 3
    api.script = [Code.UNAVAILABLE, Code.PERMISSION_DENIED]
    assert await wait_for_run(address, "pool-token", wait_seconds=1) is None
    assert api.calls == 5


async def test_a_write_is_retried_through_an_outage_while_the_lease_lasts(
    server: tuple[str, ScriptedRunnerApi],
) -> None:
    address, api = server
    runner = RunnerApi(address, "run-token", 3, claim_window=30)
    try:
        api.script = [Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, None]
        spec = await runner.claim()
        assert spec is not None and spec.run_id == 3
        assert api.calls == 3
        api.script = [Code.INVALID_ARGUMENT]
        with pytest.raises(RunnerApiError):
            await runner.renew_lease()
        assert not runner.lost
    finally:
        await runner.close()


async def test_a_lease_that_runs_out_while_retrying_is_lost_and_nothing_more_is_written(
    server: tuple[str, ScriptedRunnerApi],
) -> None:
    address, api = server
    runner = RunnerApi(address, "run-token", 3, claim_window=0.25)  # 0.1 + 0.2 s of retries outlast it
    try:
        api.script = [Code.UNAVAILABLE] * 10
        with pytest.raises(LeaseLost, match="did not answer within the lease"):
            await runner.renew_lease()
        assert runner.lost
        calls = api.calls
        assert 1 <= calls < 10  # a loaded machine may spend the whole lease on the first call
        with pytest.raises(LeaseLost, match="no longer ours"):
            await runner.renew_lease()
        assert api.calls == calls
    finally:
        await runner.close()
