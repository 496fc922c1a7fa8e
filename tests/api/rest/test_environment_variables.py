"""dbt Cloud's v3 environment variables: project defaults, environment values and job overrides,
each with its id, secrets write-only, bulk create and update; the values land where runs read them."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from api.runner.run_spec import decrypter, load_dbt_context
from runplane.basics.secrets import box_from_settings
from runplane.basics.settings import Settings
from tests.api.conftest import AsyncDb, Rest, scalar


async def project_with_job(rest: Rest, adb: AsyncDb) -> tuple[int, int, int]:
    project, environment = await rest.create_project_and_environment(adb)
    job = await rest.create_job(adb, environment_id=environment)
    return project, environment, job


async def test_three_levels_with_ids_secrets_hidden_and_bulk(rest: Rest, other_rest: Rest, adb: AsyncDb) -> None:
    project, environment, job = await project_with_job(rest, adb)
    base = f"/api/v3/accounts/{rest.account_id}/projects/{project}/environment-variables"

    async def create(**body: Any) -> dict[str, Any]:
        answer = await rest.http.post(f"{base}/", json={"account_id": rest.account_id, "project_id": project, **body})
        assert answer.status_code == 200, answer.text
        data: dict[str, Any] = answer.json()["data"]
        return data

    default = await create(name="DBT_LAKE", type="project", raw_value="lake")
    env_value = await create(name="DBT_LAKE", type="environment", environment_id=environment, raw_value="prod-lake")
    override = await create(name="DBT_LAKE", type="job", job_definition_id=job, raw_value="job-lake")
    secret = await create(name="DBT_ENV_SECRET_KEY", type="environment", environment_id=environment, raw_value="s3cr3t")
    assert len({default["id"], env_value["id"], override["id"], secret["id"]}) == 4
    assert secret["display_value"] == "**********"

    seen = (await rest.http.get(f"{base}/job/", params={"job_definition_id": job})).json()["data"]
    assert seen["DBT_LAKE"] == {
        "project": {"id": default["id"], "value": "lake"},
        "environment": {"id": env_value["id"], "value": "prod-lake"},
        "job": {"id": override["id"], "value": "job-lake"},
    }
    assert seen["DBT_ENV_SECRET_KEY"] == {"environment": {"id": secret["id"], "value": "**********"}}
    by_env = (await rest.http.get(f"{base}/environment/")).json()["data"]
    assert by_env["environments"] == ["project", "prod"]
    assert by_env["variables"]["DBT_LAKE"]["prod"] == {"id": env_value["id"], "value": "prod-lake"}
    assert "s3cr3t" not in str(by_env) and "s3cr3t" not in str(seen)

    # Where runs read them: the job's own variables and its environment's, the secret encrypted.
    assert await scalar(adb, "SELECT environment ->> 'DBT_LAKE' FROM jobs WHERE id = %s", job) == "job-lake"
    assert await scalar(adb, "SELECT variables ->> 'DBT_LAKE' FROM environments WHERE id = %s", environment) == (
        "prod-lake"
    )
    stored = await scalar(
        adb, "SELECT secret_variables ->> 'DBT_ENV_SECRET_KEY' FROM environments WHERE id = %s", environment
    )
    assert stored and stored != "s3cr3t"

    updated = await rest.http.post(f"{base}/{override['id']}/", json={"name": "DBT_LAKE", "raw_value": "job-lake-2"})
    assert updated.json()["data"]["id"] == override["id"]
    assert await scalar(adb, "SELECT environment ->> 'DBT_LAKE' FROM jobs WHERE id = %s", job) == "job-lake-2"
    assert (await rest.http.delete(f"{base}/{override['id']}/")).status_code == 204
    seen = (await rest.http.get(f"{base}/job/", params={"job_definition_id": job})).json()["data"]
    assert "job" not in seen["DBT_LAKE"]

    bulk = await rest.http.post(
        f"{base}/bulk/", json={"env_var": [{"new_name": "DBT_REGION", "project": "eu", "prod": "eu-west-1"}]}
    )
    assert bulk.status_code == 200, bulk.text
    assert [(d["key_name"], d["data"]["type"]) for d in bulk.json()["data"]] == [
        ("DBT_REGION", "project"),
        ("DBT_REGION", "environment"),
    ]
    region = (await rest.http.get(f"{base}/environment/")).json()["data"]["variables"]["DBT_REGION"]
    put = await rest.http.put(
        f"{base}/bulk/", json={"env_vars": {"name": "DBT_REGION", str(region["prod"]["id"]): None, "project": "us"}}
    )
    assert put.status_code == 200, put.text
    assert put.json()["data"]["deleted_var_ids"] == [region["prod"]["id"]]
    region = (await rest.http.get(f"{base}/environment/")).json()["data"]["variables"]["DBT_REGION"]
    assert region == {"project": {"id": region["project"]["id"], "value": "us"}}

    refused = await rest.http.post(f"{base}/", json={"name": "lake", "type": "project", "raw_value": "x"})
    assert refused.status_code == 400
    other_base = f"/api/v3/accounts/{other_rest.account_id}/projects/{project}/environment-variables"
    assert (await other_rest.http.get(f"{other_base}/environment/")).status_code == 404
    assert (await other_rest.http.delete(f"{other_base}/{default['id']}/")).status_code == 404


async def test_a_run_sees_the_project_default_under_its_environments_value(
    rest: Rest, adb: AsyncDb, settings: Settings, database_url: str
) -> None:
    project, environment, job = await project_with_job(rest, adb)
    base = f"/api/v3/accounts/{rest.account_id}/projects/{project}/environment-variables"
    for name, value in (("DBT_LAKE", "lake"), ("DBT_REGION", "eu"), ("DBT_ENV_SECRET_TOKEN", "t0ken")):
        answer = await rest.http.post(f"{base}/", json={"name": name, "type": "project", "raw_value": value})
        assert answer.status_code == 200, answer.text
    answer = await rest.http.post(
        f"{base}/", json={"name": "DBT_LAKE", "type": "environment", "environment_id": environment, "raw_value": "prod"}
    )
    assert answer.status_code == 200, answer.text
    run = (await rest.http.post(f"/api/v2/accounts/{rest.account_id}/jobs/{job}/run/", json={})).json()["data"]
    async with await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row) as conn:
        context = await load_dbt_context(conn, run["id"], decrypter(box_from_settings(settings)))
    assert context is not None
    assert dict(context.variables) == {"DBT_LAKE": "prod", "DBT_REGION": "eu"}
    assert dict(context.secret_variables) == {"DBT_ENV_SECRET_TOKEN": "t0ken"}
