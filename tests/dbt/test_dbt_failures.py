"""dbt stopped and failing: cancel during a long model, a warehouse that refuses the connection, and the
steps a failure left unrun."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import psutil

from api.admin import create_token
from api.rest.server import RestServer
from runner.service import run as run_runner
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, projects_pb2, runs_pb2
from tests.dbt.conftest import (
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
    sleeping_queries,
    start_run,
    warehouse,
)

pytestmark = dbt_run_marks(timeout=300)


def dbt_processes(marker: str) -> list[int]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if marker in " ".join(process.info["cmdline"] or []):
            found.append(process.pid)
    return found


async def test_cancel_interrupts_dbt_which_cancels_its_query(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    (repo / "models" / "slow_model.sql").write_text(
        "{{ config(materialized='table') }}\nselect 1 as slept from pg_sleep(120)\n"
    )
    commit(repo, "a slow model")
    env = await environment(client, database_url, str(repo))
    job = await dbt_job(client, env.id, ["dbt run --select slow_model", "echo never"])
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    token = start_run(db, run.id)
    runner = asyncio.create_task(run_runner(dbt_settings, run.id, token))
    try:
        deadline = time.monotonic() + 120
        while sleeping_queries(db) == 0:
            if runner.done() or time.monotonic() > deadline:
                raise AssertionError(f"the model's query never started: {await run_log(client, run.id)}")
            await asyncio.sleep(0.2)
        db.execute("UPDATE runs SET cancel_requested_at = now() WHERE id = %s", (run.id,))
        assert await asyncio.wait_for(runner, timeout=60) == 0
    finally:
        if not runner.done():
            runner.cancel()

    done = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    assert done.status == common_pb2.RUN_STATUS_CANCELLED
    first, second = commands_of(done)
    assert first.status == common_pb2.RUN_STATUS_CANCELLED and second.skipped
    # SIGINT was the first signal, and dbt ended of it within the grace period: no SIGTERM was needed.
    ended = first.end_reason
    assert ended.startswith(("exited with code", "SIGINT")) and ended.endswith("SIGINT"), ended
    dbt_log = (
        await client.runs.GetArtifact(
            runs_pb2.GetArtifactRequest(run_id=run.id, path="logs/dbt.log", step_index=first.index)
        )
    ).content.decode()
    assert "CANCEL query model.jaffle_shop.slow_model" in dbt_log, dbt_log[-3000:]
    assert sleeping_queries(db) == 0  # dbt cancelled its query in the warehouse
    assert dbt_processes("--select slow_model") == []


async def test_a_warehouse_that_refuses_the_connection_fails_the_run_with_secrets_masked(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    env = await environment(client, database_url, str(repo), connection=warehouse(database_url, user="no_such_role"))
    job = await dbt_job(client, env.id, ["dbt run --select stg_customers"])
    run = await run_job(client, dbt_settings, db, job.id)
    log = await run_log(client, run.id)
    assert run.status == common_pb2.RUN_STATUS_ERROR
    # The step, and the warehouse's own reason: no need to open the log to see why.
    assert run.status_message.startswith("step 4 failed with exit code 2: dbt run --select stg_customers — ")
    assert 'role "no_such_role" does not exist' in run.status_message, run.status_message
    assert 'role "no_such_role" does not exist' in log
    listed = await client.runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=run.id))
    contents = [
        (
            await client.runs.GetArtifact(
                runs_pb2.GetArtifactRequest(run_id=run.id, path=a.path, step_index=a.step_index)
            )
        ).content
        for a in listed.artifacts
    ]
    assert "pw-s3cret-xyz" not in log and not any(b"pw-s3cret-xyz" in c for c in contents)
    assert "pw-s3cret-xyz" not in run.status_message


async def test_steps_a_failure_left_unrun_are_skipped_over_rest_and_grpc(
    client: Client, *, rest_server: RestServer, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    env = await environment(client, database_url, str(repo), connection=warehouse(database_url, user="no_such_role"))
    job = await dbt_job(client, env.id, ["dbt run --select stg_customers", "dbt build"])
    run = await run_job(client, dbt_settings, db, job.id)
    assert run.status == common_pb2.RUN_STATUS_ERROR
    failed, unrun = commands_of(run)
    assert failed.status == common_pb2.RUN_STATUS_ERROR and not failed.skipped
    assert unrun.skipped and not unrun.started_at.seconds

    token = await create_token(dbt_settings, account_id=client.account_id)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{rest_server.port}", headers={"Authorization": f"Token {token}"}
    ) as http:
        got = await http.get(
            f"/api/v2/accounts/{client.account_id}/runs/{run.id}/", params={"include_related": '["run_steps"]'}
        )
        assert got.status_code == 200, got.text
        steps = {s["index"]: s for s in got.json()["data"]["run_steps"]}
        # What a client retrying from the failure reads: the failed step's name, and the one after it skipped
        # (so it is run again rather than its never-written artifacts fetched).
        assert steps[failed.index + 1]["status_humanized"] == "Error"
        assert steps[unrun.index + 1]["status_humanized"] == "Skipped", steps[unrun.index + 1]
        assert steps[unrun.index + 1]["started_at"] is None


async def test_a_duckdb_file_that_cannot_be_opened_fails_the_run_with_the_adapters_reason(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path, *, kept_directory: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    missing = kept_directory / "no-such-directory" / "warehouse.duckdb"
    connection = projects_pb2.Connection(adapter_type="duckdb", fields={"path": str(missing)})
    env = await environment(client, database_url, str(repo), connection=connection)
    job = await dbt_job(client, env.id, ["dbt build"])
    run = await run_job(client, dbt_settings, db, job.id)
    assert run.status == common_pb2.RUN_STATUS_ERROR
    assert run.status_message.startswith("step 4 failed with exit code 2: dbt build — "), run.status_message
    # dbt's header and the adapter's line after it, as the log has them (without their times).
    reason = run.status_message.removeprefix("step 4 failed with exit code 2: dbt build — ")
    assert reason.startswith(("Runtime Error", "Database Error", "Encountered an error")), reason
    assert str(missing) in reason, reason
    assert str(missing) in await run_log(client, run.id)
