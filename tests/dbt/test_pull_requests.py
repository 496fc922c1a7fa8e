"""A pull request's CI lifecycle with the real dbt project and warehouse: a newer commit supersedes
the running CI run, closing the pull request (API, GitHub webhook) drops its schema, and the sweep
drops schemas older than the account keeps them."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from api.admin import create_token, update_account_settings
from api.rest.server import RestServer
from runner.service import run as run_runner
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings
from runplane.runs.pull_requests import DROP_SCHEMA_STEP, superseded_message, sweep_pull_request_schemas
from runplane.v1 import common_pb2, jobs_pb2, runs_pb2
from tests.dbt.conftest import (
    Client,
    commit,
    dbt_job,
    environment,
    git,
    make_repository,
    run_log,
    sleeping_queries,
    start_run,
    tables,
)

pytestmark = [pytest.mark.slow, pytest.mark.dbt, pytest.mark.timeout(400), pytest.mark.usefixtures("_cleanup_bus")]

Db = psycopg.Connection[Any]
SLOW_MODEL = "{{ config(materialized='table') }}\nselect 1 as slept from pg_sleep(120)\n"


def schemas(db: Db, prefix: str) -> set[str]:
    rows = db.execute("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s", (prefix + "%",))
    return {str(r[0]) for r in rows}


async def ci_trigger(client: Client, job_id: int, number: int, sha: str) -> runs_pb2.Run:
    return await client.runs.TriggerRun(
        runs_pb2.TriggerRunRequest(
            job_id=job_id,
            trigger=common_pb2.TRIGGER_CI,
            overrides=runs_pb2.RunOverrides(pull_request_number=number, git_sha=sha),
        )
    )


async def execute(client: Client, settings: Settings, db: Db, run_id: int) -> runs_pb2.Run:
    token = start_run(db, run_id)
    assert await run_runner(settings, run_id, token) == 0
    return await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))


async def ci_job(client: Client, environment_id: int) -> jobs_pb2.Job:
    return await dbt_job(
        client,
        environment_id,
        ["dbt build"],
        job_type=common_pb2.JOB_TYPE_CI,
    )


async def test_a_new_commit_supersedes_the_running_ci_run_and_closing_drops_the_schema(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    env = await environment(client, database_url, str(repo))
    job = await ci_job(client, env.id)
    schema = f"dbt_cloud_pr_{job.id}_7"

    # Commit 1 has a model that takes minutes; its CI run is running when commit 2 arrives.
    (repo / "models" / "slow_model.sql").write_text(SLOW_MODEL)
    first_sha = commit(repo, "a slow model")
    first = await ci_trigger(client, job.id, 7, first_sha)
    runner = asyncio.create_task(run_runner(dbt_settings, first.id, start_run(db, first.id)))
    try:
        deadline = time.monotonic() + 180
        while sleeping_queries(db) == 0:
            if runner.done() or time.monotonic() > deadline:
                raise AssertionError(f"the slow model never started: {await run_log(client, first.id)}")
            await asyncio.sleep(0.2)
        (repo / "models" / "slow_model.sql").unlink()
        second_sha = commit(repo, "no slow model")
        second = await ci_trigger(client, job.id, 7, second_sha)
        assert await asyncio.wait_for(runner, timeout=90) == 0
    finally:
        if not runner.done():
            runner.cancel()
    superseded = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=first.id))
    assert superseded.status == common_pb2.RUN_STATUS_CANCELLED
    assert superseded.status_message == superseded_message(second.id, 7, second_sha)
    assert second_sha[:12] in superseded.status_message
    assert sleeping_queries(db) == 0  # dbt cancelled its query in the warehouse

    built = await execute(client, dbt_settings, db, second.id)
    assert built.status == common_pb2.RUN_STATUS_SUCCESS, await run_log(client, second.id)
    assert built.git_sha == second_sha
    assert {"customers", "orders", "raw_orders"} <= tables(db, schema)
    assert "slow_model" not in tables(db, schema)

    # A queued older run is cancelled at once, with the commit that superseded it.
    third = await ci_trigger(client, job.id, 7, second_sha)
    fourth = await ci_trigger(client, job.id, 7, first_sha)
    third = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=third.id))
    assert third.status == common_pb2.RUN_STATUS_CANCELLED
    assert third.status_message == superseded_message(fourth.id, 7, first_sha)

    # Closing pull request 7 queues one run that drops its schema; the still-queued CI run stops.
    closed = await client.runs.ClosePullRequest(runs_pb2.ClosePullRequestRequest(pull_request_number=7))
    (drop,) = closed.drop_runs
    assert (drop.job_id, drop.trigger, drop.schema) == (job.id, common_pb2.TRIGGER_CI, schema)
    assert list(drop.overrides.steps) == [DROP_SCHEMA_STEP]
    fourth = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=fourth.id))
    assert fourth.status == common_pb2.RUN_STATUS_CANCELLED and "pull request #7 was closed" in fourth.status_message
    again = await client.runs.ClosePullRequest(runs_pb2.ClosePullRequestRequest(pull_request_number=7))
    assert list(again.drop_runs) == []  # closing twice drops once

    dropped = await execute(client, dbt_settings, db, drop.id)
    log = await run_log(client, drop.id)
    assert dropped.status == common_pb2.RUN_STATUS_SUCCESS, log
    assert f"dropped schema {schema}" in log
    assert schemas(db, schema) == set()


async def test_a_github_close_drops_the_schema_and_the_sweep_drops_old_ones(
    client: Client, *, rest_server: RestServer, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "acme" / "jaffle")  # a local mirror of GitHub's acme/jaffle
    env = await environment(client, database_url, str(repo))
    job = await ci_job(client, env.id)
    sha = git(repo, "rev-parse", "HEAD")
    for number in (11, 12):
        run = await execute(client, dbt_settings, db, (await ci_trigger(client, job.id, number, sha)).id)
        assert run.status == common_pb2.RUN_STATUS_SUCCESS, await run_log(client, run.id)
    assert schemas(db, f"dbt_cloud_pr_{job.id}_") == {f"dbt_cloud_pr_{job.id}_11", f"dbt_cloud_pr_{job.id}_12"}

    # GitHub says pull request 11 was closed (not merged).
    token = await create_token(dbt_settings, account_id=client.account_id)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rest_server.port}") as http:
        hook = (
            await http.post(
                f"/api/v3/accounts/{client.account_id}/git-webhooks/",
                json={"provider": "github", "repository": "acme/jaffle"},
                headers={"Authorization": f"Token {token}"},
            )
        ).json()["data"]
        payload = {
            "action": "closed",
            "number": 11,
            "pull_request": {"number": 11, "merged": False, "head": {"ref": "pr", "sha": sha}, "base": {"ref": "main"}},
            "repository": {"full_name": "acme/jaffle"},
        }
        body = json.dumps(payload).encode()
        signature = "sha256=" + hmac.new(hook["secret"].encode(), body, hashlib.sha256).hexdigest()
        response = await http.post(
            hook["url_path"],
            content=body,
            headers={"X-GitHub-Event": "pull_request", "X-Hub-Signature-256": signature},
        )
    assert response.status_code == 200, response.text
    (drop_run,) = response.json()["data"]["run_ids"]
    dropped = await execute(client, dbt_settings, db, drop_run)
    assert dropped.status == common_pb2.RUN_STATUS_SUCCESS, await run_log(client, drop_run)
    assert schemas(db, f"dbt_cloud_pr_{job.id}_") == {f"dbt_cloud_pr_{job.id}_12"}

    # The sweep: nothing is old enough yet; with pull request 12's last run 3 days ago and the
    # account keeping schemas 2 days, it queues one drop, once.
    pool = await open_pool(dbt_settings.database_url, max_size=2)
    try:
        assert await sweep_pull_request_schemas(pool, None, dbt_settings.bus_prefix) == []
        await update_account_settings(dbt_settings, account_id=client.account_id, pull_request_schema_max_age_days=2)
        db.execute(
            "UPDATE pull_request_schemas SET last_used_at = now() - interval '3 days' WHERE job_id = %s", (job.id,)
        )
        (swept,) = await sweep_pull_request_schemas(pool, None, dbt_settings.bus_prefix)
        assert (swept.job_id, swept.pull_request_number) == (job.id, 12)
        assert await sweep_pull_request_schemas(pool, None, dbt_settings.bus_prefix) == []
    finally:
        await pool.close()
    dropped = await execute(client, dbt_settings, db, swept.run_id)
    assert dropped.status == common_pb2.RUN_STATUS_SUCCESS, await run_log(client, swept.run_id)
    assert schemas(db, f"dbt_cloud_pr_{job.id}_") == set()


async def test_the_drop_macro_refuses_a_schema_that_is_not_a_pull_requests(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    """Even a run that asks to drop with a production schema (set by hand here) drops nothing."""
    env = await environment(client, database_url, str(make_repository(tmp_path / "jaffle")))
    build = await dbt_job(client, env.id, ["dbt seed"])
    queued = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=build.id))
    seeded = await execute(client, dbt_settings, db, queued.id)
    assert seeded.status == common_pb2.RUN_STATUS_SUCCESS
    job = await ci_job(client, env.id)
    run = await ci_trigger(client, job.id, 5, "")
    db.execute(
        "UPDATE runs SET schema_name = 'analytics', overrides = overrides || %s WHERE id = %s",
        (json.dumps({"steps": [DROP_SCHEMA_STEP], "drop_schema": True}), run.id),
    )
    refused = await execute(client, dbt_settings, db, run.id)
    assert refused.status == common_pb2.RUN_STATUS_ERROR
    assert "runplane drops only pull request schemas" in await run_log(client, run.id)
    assert "raw_orders" in tables(db, "analytics")
