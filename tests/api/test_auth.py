"""Tokens, the account scope of every call, and the services that need no token."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from api.process import RunningApi
from client.cli import channel
from runplane.basics.tokens import token_hash
from runplane.v1 import jobs_pb2, runs_pb2
from tests.api.conftest import AsyncDb, Client, connect, deploy_job, scalar, status_of


async def test_a_call_without_a_token_is_unauthenticated(api: RunningApi, client: Client) -> None:
    async with connect(api, None) as anonymous:
        code, details = await status_of(anonymous.jobs.ListJobs(jobs_pb2.ListJobsRequest()))
        assert code is grpc.StatusCode.UNAUTHENTICATED
        assert "authorization" in details
        stream = anonymous.runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=1))
        code, _ = await status_of(_drain(stream))
        assert code is grpc.StatusCode.UNAUTHENTICATED


async def test_a_bad_or_malformed_token_is_unauthenticated(api: RunningApi, client: Client) -> None:
    for token in ("rp_not-a-real-token", client.token + "x", ""):
        async with connect(api, token) as bad:
            code, _ = await status_of(bad.jobs.CreateJob(deploy_job()))
            assert code is grpc.StatusCode.UNAUTHENTICATED, token
    async with channel(f"127.0.0.1:{api.port}", None) as chan:
        raw = chan.unary_unary("/runplane.v1.JobService/ListJobs", None, None)  # raw bytes: no serializers
        call = raw(b"", metadata=(("authorization", f"Basic {client.token}"),))
        code, _ = await status_of(call)
        assert code is grpc.StatusCode.UNAUTHENTICATED


async def test_a_revoked_token_is_refused(api: RunningApi, client: Client, adb: AsyncDb) -> None:
    assert (await client.jobs.ListJobs(jobs_pb2.ListJobsRequest())).jobs == []
    await adb.execute("UPDATE api_tokens SET revoked_at = now() WHERE token_hash = %s", (token_hash(client.token),))
    code, details = await status_of(client.jobs.ListJobs(jobs_pb2.ListJobsRequest()))
    assert code is grpc.StatusCode.UNAUTHENTICATED
    assert "revoked" in details


async def test_only_the_hash_of_a_token_is_stored(client: Client, adb: AsyncDb) -> None:
    stored = await scalar(adb, "SELECT token_hash FROM api_tokens WHERE account_id = %s", client.account_id)
    prefix = await scalar(adb, "SELECT token_prefix FROM api_tokens WHERE account_id = %s", client.account_id)
    assert bytes(stored) == token_hash(client.token)
    assert client.token.startswith(prefix) and len(prefix) < len(client.token) // 4


async def test_health_is_serving_without_a_token(api: RunningApi) -> None:
    async with channel(f"127.0.0.1:{api.port}", None) as chan:
        health = health_pb2_grpc.HealthStub(chan)
        for service in ("", "runplane.v1.JobService", "runplane.v1.RunService"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_health_turns_not_serving_when_the_server_drains(api: RunningApi) -> None:
    async with channel(f"127.0.0.1:{api.port}", None) as chan:
        watch = health_pb2_grpc.HealthStub(chan).Watch(health_pb2.HealthCheckRequest(service=""))
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        stopping = asyncio.create_task(api.stop(2.0), name="stop-api")
        second = await asyncio.wait_for(watch.read(), 5)
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        await asyncio.wait_for(stopping, 10)


async def _drain(stream: AsyncIterable[object]) -> None:
    async for _ in stream:
        pass
