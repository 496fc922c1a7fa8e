"""Every step of a dbt run, dbt or plain, sees what a plain job's step sees and dbt's own on top."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, runs_pb2
from tests.dbt.conftest import Client, commands_of, dbt_job, environment, make_repository, run_job, run_log

pytestmark = [pytest.mark.slow, pytest.mark.dbt, pytest.mark.timeout(400), pytest.mark.usefixtures("_cleanup_bus")]


async def test_steps_of_a_dbt_run_get_the_runs_identity_the_hosts_allow_list_and_dbts_variables(
    client: Client, dbt_settings: Settings, db: psycopg.Connection[Any], database_url: str, tmp_path: Path
) -> None:
    env = await environment(client, database_url, str(make_repository(tmp_path / "jaffle")))
    shown = ["RUNPLANE_RUN_ID", "RUNPLANE_ACCOUNT_ID", "DBT_CLOUD_RUN_ID", "DBT_PROFILES_DIR"]
    job = await dbt_job(client, env.id, ["dbt --version", " ".join(["printenv", *shown])])
    run = await run_job(client, dbt_settings, db, job.id)
    log = await run_log(client, run.id)
    assert run.status == common_pb2.RUN_STATUS_SUCCESS, log
    assert f"\n{run.id}\n{client.account_id}\n{run.id}\n" in log
    assert "/runplane-profile-" in log  # dbt's profile directory, from what the dbt environment adds


async def test_an_environments_secret_variables_reach_the_steps_masked_and_a_jobs_of_the_same_name_wins(
    client: Client, dbt_settings: Settings, db: psycopg.Connection[Any], database_url: str, tmp_path: Path
) -> None:
    secret, shadowed, jobs = "env-s3cret-4u9x", "env-side-k2", "job-side-q7"
    variables = {"DBT_ENV_SECRET_ENV_TOKEN": secret, "DBT_ENV_SECRET_BOTH": shadowed, "PLAIN_FROM_ENV": "plain"}
    env = await environment(client, database_url, str(make_repository(tmp_path / "jaffle")), variables=variables)
    step = (
        'sh -c \'echo token=$DBT_ENV_SECRET_ENV_TOKEN; printf "%s\\n" "$DBT_ENV_SECRET_ENV_TOKEN" | rev;'
        ' printf "%s\\n" "$DBT_ENV_SECRET_BOTH" | rev; echo plain=$PLAIN_FROM_ENV;'
        ' mkdir -p target; printf "{\\"token\\": \\"%s\\"}" "$DBT_ENV_SECRET_ENV_TOKEN" > target/seen.json\''
    )
    job = await dbt_job(client, env.id, [step], environment={"DBT_ENV_SECRET_BOTH": jobs})
    run = await run_job(client, dbt_settings, db, job.id)
    log = await run_log(client, run.id)
    assert run.status == common_pb2.RUN_STATUS_SUCCESS, log
    assert "token=*****" in log and secret not in log  # given to the step, masked in its log
    assert secret[::-1] in log  # the value itself reached the step (reversed, so not masked)
    assert jobs[::-1] in log and shadowed[::-1] not in log  # the job's secret wins over the environment's
    assert "plain=plain" in log
    (command,) = commands_of(run)
    artifact = await client.runs.GetArtifact(
        runs_pb2.GetArtifactRequest(run_id=run.id, path="target/seen.json", step_index=command.index)
    )
    assert artifact.content == b'{"token": "*****"}'  # masked in artifacts too
