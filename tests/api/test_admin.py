"""Accounts and tokens through the real ``runplane admin`` command, and the demo seed."""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys

import pytest

from api.admin import create_account, create_token
from api.demo import DEMO_JOBS, seed_demo
from api.process import RunningApi
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, jobs_pb2
from tests.api.conftest import AsyncDb, connect, deploy_job, scalar
from tests.support.processes import finish


async def runplane(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runplane", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    return await finish(proc)


# Three runplane processes (each imports the CLI and connects to Postgres) beside the API server:
# under 10 s at load 3-6, 18-20 s at load 10-37, where the default 20 s cut it off.
@pytest.mark.timeout(120)
async def test_admin_commands_print_working_tokens(api: RunningApi, service_env: dict[str, str], adb: AsyncDb) -> None:
    code, out, err = await runplane(
        service_env, "admin", "create-account", "--name", "initech", "--run-slots", "3", "--memory-mb", "2048"
    )
    assert code == 0, err
    created = json.loads(out)
    account_id, first = created["account_id"], created["token"]
    assert await scalar(adb, "SELECT run_slots FROM accounts WHERE id = %s", account_id) == 3
    assert await scalar(adb, "SELECT memory_mb FROM accounts WHERE id = %s", account_id) == 2048

    code, out, err = await runplane(service_env, "admin", "create-token", "--account", str(account_id))
    assert code == 0, err
    second = json.loads(out)
    assert second["account_id"] == account_id and second["token"] != first

    for token in (first, second["token"]):
        async with connect(api, token, account_id) as client:
            job = await client.jobs.CreateJob(deploy_job(f"with-{token[:6]}"))
            assert job.account_id == account_id

    code, out, err = await runplane(service_env, "admin", "create-token", "--account", "999999")
    assert code != 0 and "account 999999 not found" in err and out == ""


async def test_create_token_for_a_missing_account_is_not_found(settings: Settings) -> None:
    with pytest.raises(NotFound):
        await create_token(settings, account_id=424242)


async def test_create_account_validates(service_env: dict[str, str], adb: AsyncDb) -> None:
    code, _, err = await runplane(service_env, "admin", "create-account", "--name", "x", "--run-slots", "-1")
    assert code != 0 and "run_slots" in err
    assert await scalar(adb, "SELECT count(*) FROM accounts") == 0


async def test_seed_demo_creates_once_and_reuses(api: RunningApi, settings: Settings) -> None:
    account_id, token, job_ids = await seed_demo(settings, "demo")
    again_account, again_token, again_ids = await seed_demo(settings, "demo")
    assert again_account == account_id and again_ids == job_ids and again_token != token
    async with connect(api, again_token, account_id) as client:
        jobs = {j.name: j for j in (await client.jobs.ListJobs(jobs_pb2.ListJobsRequest())).jobs}
    assert set(jobs) == {"run-now", "hourly-models", "pr-checks"}
    assert job_ids[0] == jobs["run-now"].id
    assert not jobs["run-now"].triggers.HasField("schedule")
    assert jobs["hourly-models"].triggers.schedule.cron == "* * * * *"
    assert jobs["pr-checks"].job_type == common_pb2.JOB_TYPE_CI and jobs["pr-checks"].triggers.on_pull_request
    assert any("target/manifest.json" in step for step in jobs["run-now"].steps)
    assert any("target/run_results.json" in step for step in jobs["hourly-models"].steps)


def test_demo_steps_really_write_their_artifacts(tmp_path: pathlib.Path) -> None:
    """The demo's steps are shell commands a runner will execute: they must work."""
    work = tmp_path
    for spec in DEMO_JOBS[:2]:
        for step in spec.steps:
            subprocess.run(["/bin/sh", "-c", step], cwd=work, check=True, capture_output=True, timeout=30)
    assert json.loads((work / "target/manifest.json").read_text())["nodes"]
    assert json.loads((work / "target/run_results.json").read_text())["results"]


async def test_create_account_rejects_bad_input_before_writing(settings: Settings, adb: AsyncDb) -> None:
    with pytest.raises(InvalidArgument, match="name"):
        await create_account(settings, name="  ", run_slots=1, memory_mb=1)
    with pytest.raises(InvalidArgument, match="memory_mb"):
        await create_account(settings, name="a", run_slots=1, memory_mb=0)
    assert await scalar(adb, "SELECT count(*) FROM accounts") == 0
