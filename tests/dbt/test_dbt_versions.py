"""A dbt version the runners do not have is refused where it is set — an environment, a job, a run's
override — at every door, naming the installed ones; one they have runs."""

from __future__ import annotations

import re
from collections.abc import Awaitable
from pathlib import Path

import grpc
import httpx
import pytest

from api.admin import create_token
from api.rest.server import RestServer
from runplane.basics.settings import Settings
from runplane.v1 import projects_pb2, runs_pb2
from tests.api.web.conftest import Browser
from tests.dbt.conftest import (
    DBT_VERSION,
    OK,
    Client,
    Db,
    dbt_job,
    dbt_run_marks,
    environment,
    make_repository,
    run_job,
    run_log,
    warehouse,
)

pytestmark = dbt_run_marks(timeout=300)

MISSING = "1.4"
REASON = f"dbt '{MISSING}' is not installed on the runners (installed: {DBT_VERSION})"


async def test_a_dbt_version_not_installed_is_refused_at_every_door_that_sets_it(
    client: Client, *, rest_server: RestServer, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    env = await environment(client, database_url, str(make_repository(tmp_path / "jaffle")))
    job = await dbt_job(client, env.id, ["dbt parse"])

    async def refused_by_grpc(call: Awaitable[object]) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert REASON in str(refused.value.details()), refused.value.details()

    create = projects_pb2.CreateEnvironmentRequest(
        project_id=env.project_id,
        name="staging",
        environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
        dbt_version=MISSING,
        connection=warehouse(database_url),
        schema="staging",
    )
    await refused_by_grpc(client.projects.CreateEnvironment(create))
    update = projects_pb2.UpdateEnvironmentRequest(
        environment_id=env.id,
        name=env.name,
        environment_type=env.environment_type,
        dbt_version=MISSING,
        connection=warehouse(database_url),
        schema="analytics",
    )
    await refused_by_grpc(client.projects.UpdateEnvironment(update))
    override = runs_pb2.RunOverrides(dbt_version=MISSING)
    await refused_by_grpc(client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, overrides=override)))

    token = await create_token(dbt_settings, account_id=client.account_id)
    v2, v3 = f"/api/v2/accounts/{client.account_id}", f"/api/v3/accounts/{client.account_id}"
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{rest_server.port}", headers={"Authorization": f"Token {token}"}
    ) as http:
        answers = [
            await http.post(
                f"{v3}/projects/{env.project_id}/environments/",
                json={
                    "name": "staging",
                    "type": "deployment",
                    "dbt_version": MISSING,
                    "connection": {"type": "postgres", "details": dict(warehouse(database_url).fields)},
                    "credentials": {"schema": "staging"},
                },
            ),
            await http.post(f"{v3}/projects/{env.project_id}/environments/{env.id}/", json={"dbt_version": MISSING}),
            await http.post(
                f"{v2}/jobs/",
                json={"name": "j", "environment_id": env.id, "dbt_version": MISSING, "execute_steps": ["dbt parse"]},
            ),
            await http.post(f"{v2}/jobs/{job.id}/run/", json={"dbt_version_override": MISSING}),
        ]
    for answer in answers:
        assert answer.status_code == 400 and REASON in answer.text, (answer.request.url, answer.text)

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rest_server.port}") as http:
        browser = Browser(http, client.account_id, token)
        await browser.login()
        page = await browser.post(f"/ui/jobs/{job.id}/run", dbt_version=MISSING)
        assert page.status_code == 400, page.text[-2000:]
        assert re.search(r'id="e-dbt_version">[^<]*is not installed on the runners', page.text), page.text[-3000:]

    assert db.execute("SELECT count(*) FROM runs WHERE job_id = %s", (job.id,)).fetchone() == (0,)
    assert db.execute("SELECT dbt_version FROM environments WHERE id = %s", (env.id,)).fetchone() == (DBT_VERSION,)
    ran = await run_job(client, dbt_settings, db, job.id, overrides=runs_pb2.RunOverrides(dbt_version=DBT_VERSION))
    assert ran.status == OK, (await run_log(client, ran.id))[-3000:]
