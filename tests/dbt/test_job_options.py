"""The job options "run source freshness" and "generate docs" with the real dbt project and warehouse."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from api.admin import create_token
from api.rest.server import RestServer
from runner.service import run as run_runner
from runplane.basics.settings import Settings
from runplane.v1 import runs_pb2
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
    run_job,
    run_log,
    start_run,
)

pytestmark = dbt_run_marks(timeout=400)


def steps_of(run: runs_pb2.Run) -> list[tuple[str, int, bool]]:
    return [(s.command, s.status, s.optional) for s in commands_of(run)]


async def artifact_paths(client: Client, run_id: int) -> set[tuple[str, int]]:
    listed = await client.runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=run_id))
    return {(a.path, a.step_index) for a in listed.artifacts}


async def test_freshness_first_and_docs_last_and_their_failures_do_not_fail_the_run(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    env = await environment(client, database_url, str(repo))
    job = await dbt_job(client, env.id, ["dbt build"], generate_docs=True, run_source_freshness=True)
    assert job.settings.generate_docs and job.settings.run_source_freshness

    # First run: the source table does not exist before the build seeds it, so freshness fails;
    # the run goes on, builds, and generates the docs.
    first = await run_job(client, dbt_settings, db, job.id)
    log = await run_log(client, first.id)
    assert first.status == OK, log
    # dbt Cloud's setup steps first, each with its own status, times and log; the commands after them.
    setup = first.steps[:SETUP]
    assert [(s.index, s.command, s.status, s.setup) for s in setup] == [
        (0, "Clone git repository", OK, True),
        (1, "Create profile from connection postgres", OK, True),
        (2, "Invoke dbt deps", OK, True),
    ]
    assert all(s.started_at.seconds and s.finished_at.seconds for s in setup)
    setup_logs = [await run_log(client, first.id, step) for step in range(SETUP)]
    assert "runplane: checked out " in setup_logs[0]
    assert "runplane: profile 'jaffle_shop': target " in setup_logs[1]
    assert "runplane: no dbt packages to install: dbt deps skipped" in setup_logs[2]
    assert "dbt build" not in "".join(setup_logs)
    assert steps_of(first) == [
        ("dbt source freshness", ERROR, True),
        ("dbt build", OK, False),
        ("dbt docs generate", OK, True),
    ]
    assert f"step {SETUP + 1} failed; it is optional, the run goes on" in log
    docs, build = SETUP + 2, SETUP + 1
    assert {("target/catalog.json", docs), ("target/index.html", docs), ("target/run_results.json", build)} <= (
        await artifact_paths(client, first.id)
    )

    # Second run: the source exists now and is fresh enough (warn only): freshness passes and its
    # sources.json is kept with its step.
    second = await run_job(client, dbt_settings, db, job.id)
    assert second.status == OK
    assert [s.status for s in second.steps] == [OK] * (SETUP + 3)
    sources = await client.runs.GetArtifact(
        runs_pb2.GetArtifactRequest(run_id=second.id, path="target/sources.json", step_index=SETUP)
    )
    assert json.loads(sources.content)["results"][0]["unique_id"] == "source.jaffle_shop.jaffle_raw.raw_orders"

    # A stale source (error_after a day; the orders are from 2018) is reported, not fatal.
    sources_yml = repo / "models" / "staging" / "sources.yml"
    sources_yml.write_text(sources_yml.read_text().replace("warn_after: {count: 36500", "error_after: {count: 1"))
    commit(repo, "sources must be a day fresh")
    stale = await run_job(client, dbt_settings, db, job.id)
    assert stale.status == OK
    assert [s.status for s in commands_of(stale)] == [ERROR, OK, OK]
    assert "ERROR STALE" in await run_log(client, stale.id)


async def test_generate_docs_override_over_grpc_and_rest(
    client: Client, *, rest_server: RestServer, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    env = await environment(client, database_url, str(make_repository(tmp_path / "jaffle")))
    plain = await dbt_job(client, env.id, ["dbt seed"])
    with_docs = await run_job(client, dbt_settings, db, plain.id, overrides=runs_pb2.RunOverrides(generate_docs=True))
    assert with_docs.status == OK and with_docs.overrides.generate_docs
    assert steps_of(with_docs) == [("dbt seed", OK, False), ("dbt docs generate", OK, True)]

    documented = await dbt_job(client, env.id, ["dbt seed"], generate_docs=True)
    token = await create_token(dbt_settings, account_id=client.account_id)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{rest_server.port}", headers={"Authorization": f"Token {token}"}
    ) as http:
        triggered = await http.post(
            f"/api/v2/accounts/{client.account_id}/jobs/{documented.id}/run/", json={"generate_docs_override": False}
        )
        assert triggered.status_code == 200, triggered.text
        run_id = triggered.json()["data"]["id"]
        assert await run_runner(dbt_settings, run_id, start_run(db, run_id)) == 0
        job = (await http.get(f"/api/v2/accounts/{client.account_id}/jobs/{documented.id}/")).json()["data"]
    assert job["generate_docs"] is True and job["run_generate_sources"] is False
    without = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
    assert without.status == OK
    assert steps_of(without) == [("dbt seed", OK, False)]  # the override won over the job's option
