"""Rerun from failure with the real dbt project and warehouse: `dbt retry` from the failed run's
run_results.json, and plain commands again from the failed step."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from api.rerunning import RETRY_STATE_DIR
from runner.service import run as run_runner
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, jobs_pb2, runs_pb2
from tests.dbt.conftest import (
    ERROR,
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
    run_log,
    start_run,
    tables,
)

pytestmark = dbt_run_marks(timeout=400)


async def execute(client: Client, settings: Settings, db: Db, run_id: int) -> runs_pb2.Run:
    assert await run_runner(settings, run_id, start_run(db, run_id)) == 0
    return await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))


async def run_results(client: Client, run_id: int, step: int) -> dict[str, str]:
    content = await client.runs.GetArtifact(
        runs_pb2.GetArtifactRequest(run_id=run_id, path="target/run_results.json", step_index=step)
    )
    return {r["unique_id"]: r["status"] for r in json.loads(content.content)["results"]}


async def test_a_failed_dbt_build_resumes_with_dbt_retry_and_runs_only_what_failed(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    customers = repo / "models" / "marts" / "customers.sql"
    good = customers.read_text()
    customers.write_text(good.replace("select", "select no_such_column,", 1))
    commit(repo, "a broken customers model")
    env = await environment(client, database_url, str(repo))
    job = await dbt_job(client, env.id, ["dbt build", "echo after the build"])
    failed = await execute(client, dbt_settings, db, (await client.runs.TriggerRun(
        runs_pb2.TriggerRunRequest(job_id=job.id, overrides=runs_pb2.RunOverrides(threads=2))
    )).id)  # fmt: skip
    assert failed.status == ERROR
    # The setup steps succeeded, the build (the job's first command, dbt Cloud's step 4) failed.
    assert [s.status for s in failed.steps] == [OK] * SETUP + [ERROR, common_pb2.RUN_STATUS_QUEUED]
    first_results = await run_results(client, failed.id, SETUP)
    assert first_results["model.jaffle_shop.customers"] == "error"
    not_done = {node for node, status in first_results.items() if status in ("error", "skipped", "fail")}
    assert "model.jaffle_shop.orders" not in not_done and "seed.jaffle_shop.raw_orders" not in not_done

    customers.write_text(good)
    commit(repo, "customers fixed")
    rerun = await client.runs.RerunRun(runs_pb2.RerunRunRequest(run_id=failed.id))
    assert (rerun.parent_run_id, rerun.trigger) == (failed.id, common_pb2.TRIGGER_RETRY)
    assert rerun.cause == f"Rerun of run {failed.id} from step {SETUP + 1}"
    assert rerun.overrides.threads == 2  # the failed run's overrides are kept
    done = await execute(client, dbt_settings, db, rerun.id)
    log = await run_log(client, rerun.id)
    assert done.status == OK, log
    assert [s.command for s in commands_of(done)] == [f"dbt retry --state {RETRY_STATE_DIR}", "echo after the build"]
    assert f"{RETRY_STATE_DIR}/run_results.json from run {failed.id}" in log
    # dbt retry ran what failed or was skipped, and nothing that had succeeded.
    retried = await run_results(client, rerun.id, SETUP)
    assert set(retried) == not_done
    assert set(retried.values()) <= {"success", "pass"}
    assert "customers" in tables(db, "analytics")

    with pytest.raises(grpc.aio.AioRpcError) as not_failed:
        await client.runs.RerunRun(runs_pb2.RerunRunRequest(run_id=done.id))
    assert not_failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_plain_commands_run_again_from_the_failed_step(
    client: Client, dbt_settings: Settings, db: Db, tmp_path: Path
) -> None:
    flag = tmp_path / "fixed"
    job = await client.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(
            name="plain",
            job_type=common_pb2.JOB_TYPE_DEPLOY,
            steps=["echo one", f"test -f {flag}", "echo three"],
        )
    )
    failed = await execute(client, dbt_settings, db, (await client.runs.TriggerRun(
        runs_pb2.TriggerRunRequest(job_id=job.id)
    )).id)  # fmt: skip
    assert failed.status == ERROR and [s.status for s in failed.steps][:2] == [OK, ERROR]
    flag.write_text("")
    rerun = await client.runs.RerunRun(runs_pb2.RerunRunRequest(run_id=failed.id))
    done = await execute(client, dbt_settings, db, rerun.id)
    assert done.status == OK
    assert [s.command for s in done.steps] == [f"test -f {flag}", "echo three"]
    assert done.parent_run_id == failed.id and done.cause == f"Rerun of run {failed.id} from step 2"
