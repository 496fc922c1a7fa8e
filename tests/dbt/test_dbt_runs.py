"""Runs of the example project with the real dbt against the local Postgres as the warehouse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runner.service import run as run_runner
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, runs_pb2
from tests.dbt.conftest import (
    DBT_VERSION,
    SETUP,
    Client,
    dbt_job,
    environment,
    make_repository,
    run_job,
    run_log,
    start_run,
    tables,
)

pytestmark = [pytest.mark.slow, pytest.mark.dbt, pytest.mark.timeout(400), pytest.mark.usefixtures("_cleanup_bus")]

Db = psycopg.Connection[Any]


async def artifact(client: Client, run_id: int, path: str, step: int | None = None) -> runs_pb2.ArtifactContent:
    request = runs_pb2.GetArtifactRequest(run_id=run_id, path=path)
    if step is not None:
        request.step_index = step
    return await client.runs.GetArtifact(request)


async def test_deploy_run_with_overrides_then_a_ci_run_in_its_own_schema(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    env = await environment(client, database_url, str(repo))
    job = await dbt_job(
        client,
        env.id,
        ["dbt build", "dbt docs generate --target-path docs_target", "env | grep ^DBT_CLOUD_ | sort"],
        threads=2,
    )
    overrides = runs_pb2.RunOverrides(target_name="nightly", schema="analytics_nightly")
    run = await run_job(client, dbt_settings, db, job.id, overrides=overrides, cause="nightly build")
    log = await run_log(client, run.id)
    assert run.status == common_pb2.RUN_STATUS_SUCCESS, log

    # The overrides reached dbt: its own output, and the tables it made.
    assert "Concurrency: 2 threads (target='nightly')" in log
    assert {"customers", "orders", "raw_orders"} <= tables(db, "analytics_nightly")
    assert tables(db, "analytics") == set()  # the environment's default schema was not used
    assert run.git_sha == git_head(repo)
    assert [s.status for s in run.steps] == [common_pb2.RUN_STATUS_SUCCESS] * (SETUP + 3)

    # dbt Cloud's run variables, none empty.
    variables = dict(line.split("=", 1) for line in log.splitlines() if line.startswith("DBT_CLOUD_"))
    assert variables == {
        "DBT_CLOUD_ACCOUNT_ID": str(client.account_id),
        "DBT_CLOUD_ENVIRONMENT_ID": str(env.id),
        "DBT_CLOUD_ENVIRONMENT_TYPE": "deployment",
        "DBT_CLOUD_GIT_BRANCH": "main",
        "DBT_CLOUD_GIT_SHA": run.git_sha,
        "DBT_CLOUD_INVOCATION_CONTEXT": "prod",
        "DBT_CLOUD_JOB_ID": str(job.id),
        "DBT_CLOUD_PROJECT_ID": str(env.project_id),
        "DBT_CLOUD_RUN_ID": str(run.id),
        "DBT_CLOUD_RUN_REASON": "nightly build",
        "DBT_CLOUD_RUN_REASON_CATEGORY": "other",
    }
    # The password reached dbt through the profile, and no output of the run shows it.
    assert "pw-s3cret-xyz" not in log

    # Artifacts per step: the build's run_results.json survives the docs step's, which dbt wrote to
    # another target path.
    listed = await client.runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=run.id))
    kept = {(a.path, a.step_index) for a in listed.artifacts}
    build_step, docs_step = SETUP, SETUP + 1
    assert {("target/run_results.json", build_step), ("target/run_results.json", docs_step)} <= kept
    assert {("target/manifest.json", build_step), ("logs/dbt.log", build_step)} <= kept
    assert {("target/catalog.json", docs_step), ("target/index.html", docs_step)} <= kept
    build = json.loads((await artifact(client, run.id, "target/run_results.json", build_step)).content)
    docs = await artifact(client, run.id, "target/run_results.json")  # the last step that wrote it
    assert docs.artifact.step_index == docs_step
    assert build["args"]["which"] == "build" and json.loads(docs.content)["args"]["which"] == "generate"
    assert len(build["results"]) == 20
    for path, step in kept:
        assert b"pw-s3cret-xyz" not in (await artifact(client, run.id, path, step)).content

    # A CI run for pull request 7 builds into its own schema; production stays as it was.
    ci_job = await dbt_job(client, env.id, ["dbt build --select +customers"], job_type=common_pb2.JOB_TYPE_CI)
    before = tables(db, "analytics_nightly")
    ci = await run_job(
        client,
        dbt_settings,
        db,
        ci_job.id,
        trigger=common_pb2.TRIGGER_CI,
        overrides=runs_pb2.RunOverrides(pull_request_number=7, schema="analytics_nightly"),
    )
    ci_log = await run_log(client, ci.id)
    assert ci.status == common_pb2.RUN_STATUS_SUCCESS, ci_log
    pr_schema = f"dbt_cloud_pr_{ci_job.id}_7"
    assert ci.schema == pr_schema
    assert {"customers", "stg_customers"} <= tables(db, pr_schema)
    assert tables(db, "analytics") == set()
    assert tables(db, "analytics_nightly") == before


def git_head(repo: Path) -> str:
    from tests.dbt.conftest import git

    return git(repo, "rev-parse", "HEAD")


async def test_a_runs_dbt_version_override_picks_the_dbt_it_runs_with(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    env = await environment(client, database_url, str(repo))
    # A version the runners had when the environment was saved and have no more (the API refuses one
    # that is not installed).
    db.execute("UPDATE environments SET dbt_version = '0.9' WHERE id = %s", (env.id,))
    job = await dbt_job(client, env.id, ["dbt --version"])

    as_configured = await run_job(client, dbt_settings, db, job.id)
    assert as_configured.status == common_pb2.RUN_STATUS_ERROR
    assert "dbt version '0.9' is not installed on this runner (installed: 1.10)" in as_configured.status_message

    # What a REST trigger with dbt_version_override records on the run (its recording is tested there).
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    db.execute(
        "UPDATE runs SET overrides = overrides || jsonb_build_object('dbt_version', %s::text) WHERE id = %s",
        (DBT_VERSION, run.id),
    )
    assert await run_runner(dbt_settings, run.id, start_run(db, run.id)) == 0
    overridden = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    log = await run_log(client, run.id)
    assert overridden.status == common_pb2.RUN_STATUS_SUCCESS, log
    assert "installed: 1.10." in log
