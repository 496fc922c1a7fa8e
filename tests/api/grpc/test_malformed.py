"""Malformed requests: always INVALID_ARGUMENT, and the answer never echoes unbounded input."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from api.process import RunningApi
from client.cli import channel
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
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
        call = chan.unary_unary("/runplane.v1.JobService/CreateJob", None, None)  # raw bytes: no serializers
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


def _create_in_threads(port: int, token: str, request: jobs_pb2.CreateJobRequest, threads: int) -> list[int]:
    """The ids ``threads`` blocking clients, each on its own thread and channel, got from one create."""
    ids: list[int] = []
    start = threading.Barrier(threads)

    def create() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
            stub = jobs_pb2_grpc.JobServiceStub(chan)
            start.wait()
            job = stub.CreateJob(request, metadata=(("authorization", f"Bearer {token}"),), timeout=60)
            ids.append(job.id)

    workers = [threading.Thread(target=create) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return ids


async def test_creates_from_two_threads_with_one_key_make_one_job(api: RunningApi, client: Client) -> None:
    request = deploy_job()
    request.idempotency_key = "two-threads"
    ids = await asyncio.to_thread(_create_in_threads, api.port, client.token, request, 2)
    assert len(ids) == 2 and len(set(ids)) == 1
    listed = await client.jobs.ListJobs(jobs_pb2.ListJobsRequest())
    assert [job.id for job in listed.jobs] == ids[:1]


async def test_the_same_key_with_another_definition_is_refused(client: Client, other: Client) -> None:
    request = deploy_job(cron="0 2 * * *")
    request.idempotency_key = "create-nightly"
    first = await client.jobs.CreateJob(request)
    changed = jobs_pb2.CreateJobRequest()
    changed.CopyFrom(request)
    changed.name = "another job"
    code, details = await call_status(client.jobs.CreateJob(changed))
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert "idempotency key" in details and str(first.id) in details
    listed = await client.jobs.ListJobs(jobs_pb2.ListJobsRequest())
    assert [job.id for job in listed.jobs] == [first.id]
    # The same definition again still returns the first job; another account's key is its own.
    assert (await client.jobs.CreateJob(request)).id == first.id
    assert (await other.jobs.CreateJob(changed)).name == "another job"
