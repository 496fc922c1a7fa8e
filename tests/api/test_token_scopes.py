"""API tokens: names, scopes (read-only, job admin, account admin), expiry, and revocation that bites at once."""

from __future__ import annotations

import asyncio
import json
import sys

import grpc
import pytest

from api.admin import create_account, create_token, revoke_token
from api.process import RunningApi
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.settings import Settings
from runplane.v1 import jobs_pb2
from tests.api.conftest import AsyncDb, connect, deploy_job, scalar, status_of


async def test_scopes_decide_what_a_token_may_do(api: RunningApi, settings: Settings, adb: AsyncDb) -> None:
    account_id, admin_token = await create_account(settings, name="acme", run_slots=1, memory_mb=512)
    reader = await create_token(settings, account_id=account_id, name="dashboards", scopes=("read_only",))
    jobs_admin = await create_token(settings, account_id=account_id, name="ci", scopes=("job_admin",))
    async with connect(api, admin_token, account_id) as admin:
        job = await admin.jobs.CreateJob(deploy_job("by the admin"))
    async with connect(api, reader, account_id) as c:
        assert (await c.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))).id == job.id
        assert len((await c.jobs.ListJobs(jobs_pb2.ListJobsRequest())).jobs) == 1
        code, details = await status_of(c.jobs.CreateJob(deploy_job("by a reader")))
        assert code is grpc.StatusCode.PERMISSION_DENIED and "read_only" in details
        code, _ = await status_of(c.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job.id)))
        assert code is grpc.StatusCode.PERMISSION_DENIED
    assert await scalar(adb, "SELECT count(*) FROM jobs WHERE deleted_at IS NULL") == 1  # nothing changed
    async with connect(api, jobs_admin, account_id) as c:
        await c.jobs.CreateJob(deploy_job("by the job admin"))
    names = await scalar(
        adb, "SELECT array_agg(name || ':' || array_to_string(scopes, ',') ORDER BY id) FROM api_tokens"
    )
    assert names == [":account_admin", "dashboards:read_only", "ci:job_admin"]


async def test_an_expired_token_is_refused(api: RunningApi, settings: Settings, adb: AsyncDb) -> None:
    account_id, _ = await create_account(settings, name="acme", run_slots=1, memory_mb=512)
    token = await create_token(settings, account_id=account_id, expires_in_days=1)
    async with connect(api, token, account_id) as c:
        await c.jobs.ListJobs(jobs_pb2.ListJobsRequest())
        await adb.execute("UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE expires_at IS NOT NULL")
        code, details = await status_of(c.jobs.ListJobs(jobs_pb2.ListJobsRequest()))
        assert code is grpc.StatusCode.UNAUTHENTICATED and "expired" in details


async def test_revoke_token_on_the_command_line_fails_the_next_call(
    api: RunningApi, settings: Settings, service_env: dict[str, str]
) -> None:
    account_id, token = await create_account(settings, name="acme", run_slots=1, memory_mb=512)
    async with connect(api, token, account_id) as c:
        await c.jobs.ListJobs(jobs_pb2.ListJobsRequest())
        command = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "runplane",
            "admin",
            "revoke-token",
            "--token",
            token,
            env=service_env,
            stdout=asyncio.subprocess.PIPE,
        )
        stdout, _ = await asyncio.wait_for(command.communicate(), timeout=60)
        assert command.returncode == 0
        assert json.loads(stdout) == {"account_id": account_id, "revoked": True}
        code, _ = await status_of(c.jobs.ListJobs(jobs_pb2.ListJobsRequest()))  # the same open channel
        assert code is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(NotFound):
        await revoke_token(settings, token=token)  # once only


async def test_bad_token_requests_are_refused(settings: Settings) -> None:
    account_id, _ = await create_account(settings, name="acme", run_slots=1, memory_mb=512)
    with pytest.raises(InvalidArgument, match="scopes"):
        await create_token(settings, account_id=account_id, scopes=("superuser",))
    with pytest.raises(InvalidArgument, match="expires_in_days"):
        await create_token(settings, account_id=account_id, expires_in_days=0)
    with pytest.raises(InvalidArgument):
        await revoke_token(settings)
