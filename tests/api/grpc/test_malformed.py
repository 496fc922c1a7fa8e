"""Malformed requests: always INVALID_ARGUMENT, and the answer never echoes unbounded input."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from api.process import RunningApi
from client.cli import channel
from runplane.v1 import common_pb2, jobs_pb2
from tests.api.conftest import Client
from tests.api.conftest import status_of as call_status


def deploy_job(**schedule: str) -> jobs_pb2.CreateJobRequest:
    triggers = jobs_pb2.JobTriggers(schedule=jobs_pb2.CronSchedule(**schedule)) if schedule else None
    return jobs_pb2.CreateJobRequest(
        name="nightly", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=["dbt build"], triggers=triggers
    )


@pytest.mark.parametrize(
    "body",
    [b"\xff\xff\xff", b"\x0a\xff\xff\xff\xff\xff", b"\x08" + b"\xff" * 12],
    ids=["garbage", "truncated-string", "overlong-varint"],
)
async def test_an_undecodable_request_is_invalid_argument(api: RunningApi, client: Client, body: bytes) -> None:
    async with channel(f"127.0.0.1:{api.port}", client.token) as chan:
        call = chan.unary_unary("/runplane.v1.JobService/CreateJob")  # type: ignore[call-arg]  # raw bytes: no serializers
        code, details = await call_status(call(body, timeout=10))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "malformed" in details


async def test_a_megabyte_of_bad_input_is_not_echoed(client: Client) -> None:
    huge = "Europe/" + "x" * 1_000_000
    code, details = await call_status(client.jobs.CreateJob(deploy_job(cron="0 2 * * *", timezone=huge)))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert len(details) < 1000 and "xxxx" in details


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4 *"])
async def test_a_schedule_that_never_fires_is_refused(client: Client, cron: str) -> None:
    code, details = await call_status(client.jobs.CreateJob(deploy_job(cron=cron)))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "never fires" in details


async def test_a_retried_create_with_the_same_key_returns_the_same_job(client: Client, other: Client) -> None:
    request = deploy_job(cron="0 2 * * *")
    request.idempotency_key = "create-nightly-1"
    first = await client.jobs.CreateJob(request)
    again = await asyncio.gather(*(client.jobs.CreateJob(request) for _ in range(5)))
    assert {job.id for job in again} == {first.id}
    listed = await client.jobs.ListJobs(jobs_pb2.ListJobsRequest())
    assert [job.id for job in listed.jobs] == [first.id]
    # Keys are per account, and a create without a key always creates.
    theirs = await other.jobs.CreateJob(request)
    assert theirs.id != first.id
    request.idempotency_key = ""
    assert (await client.jobs.CreateJob(request)).id != first.id


async def test_concurrent_creates_with_one_key_make_one_job(client: Client) -> None:
    request = deploy_job()
    request.idempotency_key = "burst"
    jobs = await asyncio.gather(*(client.jobs.CreateJob(request) for _ in range(8)))
    assert len({job.id for job in jobs}) == 1
