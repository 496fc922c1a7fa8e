"""The server as a whole: unexpected errors, the status mapping, and ``runplane api`` as a process."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from api.grpc.errors import status_of
from client.cli import channel
from runplane.basics.errors import FailedPrecondition, InvalidArgument, NotFound, ServiceUnavailable, Unauthenticated
from runplane.v1 import jobs_pb2, runs_pb2
from tests.api.conftest import AsyncDb, Client, deploy_job
from tests.api.conftest import status_of as call_status
from tests.support.polling import eventually
from tests.support.ports import free_port


async def test_an_unexpected_error_is_internal_logged_and_the_server_keeps_serving(
    client: Client, adb: AsyncDb, caplog: pytest.LogCaptureFixture
) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    await adb.execute("ALTER TABLE artifacts RENAME TO artifacts_elsewhere")
    with caplog.at_level(logging.ERROR, logger="api.grpc.errors"):
        code, details = await call_status(client.runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=run.id)))
    assert code is grpc.StatusCode.INTERNAL and details == "internal error"  # no internals leak to clients
    [record] = [r for r in caplog.records if r.name == "api.grpc.errors"]
    assert record.exc_info is not None and "ListArtifacts" in record.getMessage()
    await adb.execute("ALTER TABLE artifacts_elsewhere RENAME TO artifacts")
    listed = await client.runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=run.id))
    assert list(listed.artifacts) == []


def test_runplane_errors_map_to_their_status_codes() -> None:
    assert status_of(InvalidArgument("steps", "empty")) == (grpc.StatusCode.INVALID_ARGUMENT, "steps: empty")
    assert status_of(NotFound("job 1 not found"))[0] is grpc.StatusCode.NOT_FOUND
    assert status_of(Unauthenticated("no"))[0] is grpc.StatusCode.UNAUTHENTICATED
    assert status_of(FailedPrecondition("no"))[0] is grpc.StatusCode.FAILED_PRECONDITION
    assert status_of(ServiceUnavailable("db down"))[0] is grpc.StatusCode.UNAVAILABLE
    assert status_of(KeyError("x")) == (grpc.StatusCode.INTERNAL, "internal error")


async def test_losing_the_database_connections_is_unavailable_then_recovers(client: Client, adb: AsyncDb) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    await adb.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    codes = []
    for _ in range(30):
        code, details = await call_status(client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id)))
        codes.append(code)
        if code is grpc.StatusCode.OK:
            break
        assert code is grpc.StatusCode.UNAVAILABLE and "try again" in details, (code, details)
    assert grpc.StatusCode.UNAVAILABLE in codes and codes[-1] is grpc.StatusCode.OK, codes


@pytest.mark.slow
async def test_runplane_api_serves_until_sigterm_then_drains(service_env: dict[str, str], _cleanup_bus: None) -> None:
    port = free_port()
    # Nothing in flight: the API exits at once, well inside its minute of drain bound.
    env = {**service_env, "RUNPLANE_API__PORT": str(port), "RUNPLANE_DRAIN_SECONDS": "60"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runplane",
        "api",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with channel(f"127.0.0.1:{port}", None) as chan:
            health = health_pb2_grpc.HealthStub(chan)

            async def answer() -> health_pb2.HealthCheckResponse | None:
                try:
                    return await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                except grpc.aio.AioRpcError:
                    assert proc.returncode is None, "runplane api exited"
                    return None

            reply = await eventually(answer, 30, interval=0.1, what="runplane api to answer")
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 15)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        assert proc.stderr is not None
        await proc.stderr.read()
