"""Every step of a dbt run, dbt or plain, sees what a plain job's step sees and dbt's own on top."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from runplane.basics.settings import Settings
from runplane.v1 import common_pb2
from tests.dbt.conftest import Client, dbt_job, environment, make_repository, run_job, run_log

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
