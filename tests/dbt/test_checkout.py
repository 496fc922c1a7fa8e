"""Checking out the project: SHA, branch override, the environment's branch, and the host's cache.

These runs execute plain commands in a dbt environment (no dbt invocation): what they prove is which
code the run sees, and that preparing it made a profile for the run alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from api.process import RunningApi
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, projects_pb2, runs_pb2
from tests.dbt.conftest import Client, commit, dbt_job, environment, git, make_repository, run_job, run_log, warehouse

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("_cleanup_bus")]

Db = psycopg.Connection[Any]
MODEL = "models/staging/stg_customers.sql"


async def test_runs_pinned_to_a_sha_or_a_branch_see_that_code(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    first = git(repo, "rev-parse", "HEAD")
    (repo / MODEL).write_text("select 'main two' as version\n")
    second = commit(repo, "main moves on")
    git(repo, "checkout", "--quiet", "-b", "feature", first)
    (repo / MODEL).write_text("select 'feature' as version\n")
    feature = commit(repo, "a feature")
    git(repo, "checkout", "--quiet", "main")

    env = await environment(client, database_url, f"file://{repo}")
    job = await dbt_job(client, env.id, [f"cat {MODEL}", 'cat "$DBT_PROFILES_DIR/profiles.yml"', "git status --short"])

    default = await run_job(client, dbt_settings, db, job.id)
    pinned = await run_job(client, dbt_settings, db, job.id, overrides=runs_pb2.RunOverrides(git_sha=first[:12]))
    branch = await run_job(client, dbt_settings, db, job.id, overrides=runs_pb2.RunOverrides(git_branch="feature"))

    assert (default.git_sha, pinned.git_sha, branch.git_sha) == (second, first, feature)
    logs = [await run_log(client, r.id) for r in (default, pinned, branch)]
    assert "select 'main two'" in logs[0] and "select id as customer_id" in logs[1] and "'feature'" in logs[2]
    assert "cloned" in logs[0] and all("from this host's cache" in log for log in logs[1:])
    # The profile: the environment's target, schema and threads; the password only by reference.
    assert "target: prod" in logs[0] and "schema: analytics" in logs[0] and "threads: 4" in logs[0]
    assert "DBT_ENV_SECRET_RUNPLANE_PASSWORD" in logs[0] and "pw-s3cret-xyz" not in logs[0]
    # Nothing of the run was written into the checkout (the profile lives outside it).
    assert all(r.status == common_pb2.RUN_STATUS_SUCCESS for r in (default, pinned, branch))
    assert "??" not in logs[0]
    assert not list((tmp_path / "repository-cache").glob("*.git/worktrees/*"))  # worktrees removed


async def test_checkout_failures_end_the_run_with_gits_message(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    env = await environment(client, database_url, str(repo))
    job = await dbt_job(client, env.id, ["echo never"])

    missing_branch = await run_job(client, dbt_settings, db, job.id, overrides=runs_pb2.RunOverrides(git_branch="nope"))
    assert missing_branch.status == common_pb2.RUN_STATUS_ERROR
    assert missing_branch.status_message == f"branch 'nope' not found in {repo}"
    assert not missing_branch.git_sha
    # The failure is the clone step's: it ended as error with git's words in its log; nothing after it ran.
    clone, *after = missing_branch.steps
    assert (clone.command, clone.status, clone.setup) == ("Clone git repository", common_pb2.RUN_STATUS_ERROR, True)
    assert f"runplane: branch 'nope' not found in {repo}" in await run_log(client, missing_branch.id, 0)
    assert all(step.skipped for step in after) and [s.command for s in after][-1] == "echo never"

    missing_sha = await run_job(client, dbt_settings, db, job.id, overrides=runs_pb2.RunOverrides(git_sha="deadbeef"))
    assert missing_sha.status_message == f"commit deadbeef not found in {repo}"

    # An unreachable repository with a token: git's own message, and the token nowhere.
    token = "ghp_tokenThatMustNotLeak123"
    project = await client.projects.CreateProject(
        projects_pb2.CreateProjectRequest(
            name="remote",
            repository_url="https://git.invalid/acme/jaffle.git",
            git_credential_kind=projects_pb2.GIT_CREDENTIAL_KIND_TOKEN,
            git_credential=token,
        )
    )
    assert project.git_credential_set and token not in str(project)
    remote = await client.projects.CreateEnvironment(
        projects_pb2.CreateEnvironmentRequest(
            project_id=project.id,
            name="prod",
            environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
            dbt_version="1.10",
            connection=warehouse(database_url),
            schema="analytics",
        )
    )
    unreachable = await run_job(client, dbt_settings, db, (await dbt_job(client, remote.id, ["echo never"])).id)
    assert unreachable.status == common_pb2.RUN_STATUS_ERROR
    assert unreachable.status_message.startswith("git clone of https://git.invalid/acme/jaffle.git failed: ")
    assert "git.invalid" in unreachable.status_message.split("failed: ", 1)[1]  # git's reason names the host
    assert token not in unreachable.status_message and token not in await run_log(client, unreachable.id)

    # A repository without dbt_project.yml where the project says it is.
    elsewhere = await environment(client, database_url, str(repo), subdirectory="analytics")
    no_project = await run_job(client, dbt_settings, db, (await dbt_job(client, elsewhere.id, ["echo never"])).id)
    assert no_project.status_message == (
        "no dbt_project.yml in subdirectory 'analytics': set the project's subdirectory to where it is"
    )


async def test_projects_and_environments_are_checked_and_keep_their_secrets(
    client: Client, database_url: str, tmp_path: Path
) -> None:
    env = await environment(client, database_url, str(tmp_path))
    read = await client.projects.GetEnvironment(projects_pb2.GetEnvironmentRequest(environment_id=env.id))
    assert list(read.secret_fields_set) == ["password"] and "pw-s3cret-xyz" not in str(read)
    stored = await _scalar(database_url, "SELECT connection_secrets::text FROM environments WHERE id = %s", env.id)
    assert "pw-s3cret-xyz" not in stored and "password" in stored

    bad: list[tuple[Any, str]] = [
        (warehouse(database_url, port="fivefourthreetwo"), "connection.fields[port]: must be an integer"),
        (warehouse(database_url, sslmode="sometimes"), "connection.fields[sslmode]: must be one of"),
        (warehouse(database_url, password="in the open"), "connection.fields[password]: is a secret"),
        (projects_pb2.Connection(adapter_type="oracle"), "connection.adapter_type: 'oracle' is not supported"),
        (
            projects_pb2.Connection(adapter_type="snowflake", fields={"account": "a", "user": "u", "database": "d"}),
            "connection.fields[warehouse]: is required",
        ),
        (
            projects_pb2.Connection(
                adapter_type="bigquery", fields={"project": "p"}, secret_fields={"keyfile_json": "pw-s3cret-xyz"}
            ),
            "connection.secret_fields[keyfile_json]: must be a JSON object",
        ),
    ]
    for connection, message in bad:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await environment(client, database_url, str(tmp_path), connection=connection)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (error.value.details() or "")
        assert "pw-s3cret-xyz" not in (error.value.details() or "")
    for url, message in [
        ("https://user:tok@github.com/a/b.git", "must not hold a password or token"),
        ("--upload-pack=evil", "must not start with '-'"),
        ("ftp://host/repo", "must be an https://"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.projects.CreateProject(projects_pb2.CreateProjectRequest(name="x", repository_url=url))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (error.value.details() or "") and "tok@" not in (error.value.details() or "")


async def _scalar(database_url: str, sql: str, *params: object) -> Any:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    assert row is not None
    return row[0]


async def test_the_client_sets_up_a_project_and_reads_a_runs_log_and_artifacts(
    *, api: RunningApi, client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    from api.admin import create_token
    from tests.support.client import run_client, start
    from tests.support.processes import finish

    repo = make_repository(tmp_path / "jaffle")
    token = await create_token(dbt_settings, account_id=client.account_id)
    env = {
        **os.environ,
        "RUNPLANE_TOKEN": token,
        "RUNPLANE_API__HOST": "127.0.0.1",
        "RUNPLANE_API__PORT": str(api.port),
        "WAREHOUSE_PASSWORD": "pw-from-the-cli",
    }
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    project = await run_client(env, "create-project", "--name", "shop", "--url", f"file://{repo}")
    environment_ = await run_client(
        env, "create-environment", "--project", project["id"], "--name", "prod", "--dbt-version", "1.10",
        "--field", "host=127.0.0.1", "--field", f"dbname={info['dbname']}", "--field", "user=postgres",
        "--password-env", "WAREHOUSE_PASSWORD", "--target", "prod", "--schema", "analytics",
    )  # fmt: skip
    assert environment_["secretFieldsSet"] == ["password"] and "pw-from-the-cli" not in json.dumps(environment_)
    job = await run_client(
        env, "create-job", "--name", "cli", "--environment", environment_["id"],
        "--step", "mkdir -p target && echo '{\"ok\": 1}' > target/run_results.json && cat dbt_project.yml",
    )  # fmt: skip
    run = await run_job(client, dbt_settings, db, int(job["id"]))
    assert run.status == common_pb2.RUN_STATUS_SUCCESS
    code, out, _ = await finish(await start(env, "logs", str(run.id)))
    assert code == 0 and "profile: jaffle_shop" in out
    code, out, _ = await finish(await start(env, "artifacts", str(run.id)))
    assert code == 0 and "target/run_results.json" in out
    # The CLI's steps count the setup steps too: the job's command is step 4.
    code, out, _ = await finish(await start(env, "artifact", str(run.id), "target/run_results.json", "--step", "4"))
    assert code == 0 and json.loads(out) == {"ok": 1}
