"""Deferral and Slim CI with the real dbt project and warehouse."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from api.runner.run_spec import DEFER_STATE_DIR
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, jobs_pb2, runs_pb2
from tests.dbt.conftest import (
    OK,
    SETUP,
    Client,
    Db,
    commands_of,
    commit,
    dbt_job,
    dbt_run_marks,
    environment,
    make_repository,
    run_job,
    run_log,
    tables,
)

pytestmark = dbt_run_marks(timeout=400)


async def executed_nodes(client: Client, run_id: int) -> set[str]:
    content = await client.runs.GetArtifact(
        runs_pb2.GetArtifactRequest(run_id=run_id, path="target/run_results.json", step_index=SETUP)
    )
    return {r["unique_id"] for r in json.loads(content.content)["results"]}


async def test_slim_ci_builds_only_the_changed_model_and_its_children(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    env = await environment(client, database_url, str(repo))
    production = await dbt_job(client, env.id, ["dbt build"])
    ci = await dbt_job(
        client,
        env.id,
        ["dbt build"],
        job_type=common_pb2.JOB_TYPE_CI,
        defer_to_job_id=production.id,
        run_only_modified=True,
    )
    assert ci.settings.defer_to_job_id == production.id and ci.settings.run_only_modified
    built = await run_job(client, dbt_settings, db, production.id)
    assert built.status == OK, await run_log(client, built.id)
    everything = await executed_nodes(client, built.id)

    # A pull request changes stg_payments; its children are orders and customers (and their tests).
    payments = repo / "models" / "staging" / "stg_payments.sql"
    payments.write_text(payments.read_text() + "\n-- amounts are in cents\n")
    sha = commit(repo, "document stg_payments")
    overrides = runs_pb2.RunOverrides(pull_request_number=9, git_sha=sha)
    slim = await run_job(client, dbt_settings, db, ci.id, trigger=common_pb2.TRIGGER_CI, overrides=overrides)
    log = await run_log(client, slim.id)
    assert slim.status == OK, log
    assert slim.deferring_run_id == built.id
    assert [s.command for s in commands_of(slim)] == [
        f"dbt build --defer --state {DEFER_STATE_DIR} --select state:modified+"
    ]
    nodes = await executed_nodes(client, slim.id)
    models = {n for n in nodes if n.startswith("model.")}
    assert models == {"model.jaffle_shop.stg_payments", "model.jaffle_shop.orders", "model.jaffle_shop.customers"}
    assert not {n for n in nodes if n.startswith("seed.")}  # unchanged: deferred to production
    assert nodes < everything and any(n.startswith("test.") for n in nodes)
    schema = f"dbt_cloud_pr_{ci.id}_9"
    assert tables(db, schema) >= {"orders", "customers"} and "raw_orders" not in tables(db, schema)


async def test_defer_to_an_environment_and_what_a_deferral_must_name(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    env = await environment(client, database_url, str(make_repository(tmp_path / "jaffle")))
    seed = await dbt_job(client, env.id, ["dbt seed"])
    downstream = await dbt_job(client, env.id, ["dbt run --select stg_orders"], defer_to_environment_id=env.id)
    # Nothing to defer to yet: the steps run as written.
    first = await run_job(client, dbt_settings, db, downstream.id)
    assert first.deferring_run_id == 0 and [s.command for s in commands_of(first)] == ["dbt run --select stg_orders"]
    seeded = await run_job(client, dbt_settings, db, seed.id)
    assert seeded.status == OK
    second = await run_job(client, dbt_settings, db, downstream.id)
    assert second.status == OK, await run_log(client, second.id)
    assert second.deferring_run_id == seeded.id
    assert [s.command for s in commands_of(second)] == [
        f"dbt run --select stg_orders --defer --state {DEFER_STATE_DIR}"
    ]

    for settings, field in (
        (jobs_pb2.JobSettings(environment_id=env.id, defer_to_job_id=10_000_000), "defer_to_job_id"),
        (jobs_pb2.JobSettings(environment_id=env.id, defer_to_environment_id=10_000_000), "defer_to_environment_id"),
        (jobs_pb2.JobSettings(environment_id=env.id, run_only_modified=True), "run_only_modified"),
        (jobs_pb2.JobSettings(defer_to_job_id=seed.id), "environment_id"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await client.jobs.CreateJob(
                jobs_pb2.CreateJobRequest(
                    name="bad", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=["dbt run"], settings=settings
                )
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in (bad.value.details() or "")
