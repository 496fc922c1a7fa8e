"""Warehouse connections and credentials made on their own, as dbt Cloud's v3 API makes them, and
environments made from them: a run of a job on such an environment gets the very dbt context (so
the very profile) a run on an environment made inline gets."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from api.runner.run_spec import decrypter, load_dbt_context
from runner.profile import write_profile
from runplane.basics.secrets import box_from_settings
from runplane.basics.settings import Settings
from runplane.dbt.context import DbtContext
from tests.api.conftest import AsyncDb, Rest, scalar
from tests.api.rest.test_dbt_cloud import _environment, _project

PASSWORD = "s3cret-pw"
TOKEN = "ghp_not-a-real-token-0123456789"
URL = "https://git.example.com/acme/shop.git"


def _v3(rest: Rest) -> str:
    return f"/api/v3/accounts/{rest.account_id}"


async def _connection(rest: Rest, **body: Any) -> dict[str, Any]:
    body = {"name": "warehouse", "adapter_version": "postgres_v0", **body}
    body.setdefault("config", {"hostname": "db.internal", "dbname": "shop", "port": 5432})
    answer = await rest.http.post(f"{_v3(rest)}/connections/", json=body)
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["data"])


async def _credentials(rest: Rest, project_id: int, **body: Any) -> dict[str, Any]:
    body = {
        "type": "postgres",
        "username": "dbt",
        "password": PASSWORD,
        "default_schema": "analytics",
        "threads": 6,
        "target_name": "prod",
        **body,
    }
    answer = await rest.http.post(f"{_v3(rest)}/projects/{project_id}/credentials/", json=body)
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["data"])


async def test_a_connection_is_created_listed_read_updated_and_deleted(rest: Rest) -> None:
    made = await _connection(rest)
    assert made["config"] == {"host": "db.internal", "dbname": "shop", "port": 5432}
    assert made["type"] == "postgres" and made["adapter_version"] == "postgres_v0" and made["state"] == 1
    base = f"{_v3(rest)}/connections/"
    listed = (await rest.http.get(base)).json()
    assert [c["id"] for c in listed["data"]] == [made["id"]] and listed["extra"]["pagination"]["total_count"] == 1
    assert (await rest.http.get(f"{base}{made['id']}/")).json()["data"] == made
    changed = await rest.http.patch(f"{base}{made['id']}/", json={"name": "lake", "config": {"port": 6432}})
    assert changed.status_code == 200, changed.text
    assert changed.json()["data"]["name"] == "lake" and changed.json()["data"]["config"]["port"] == 6432
    assert changed.json()["data"]["config"]["host"] == "db.internal"
    secret = await rest.http.post(base, json={"name": "x", "type": "postgres", "config": {"password": "p"}})
    assert secret.status_code == 400 and "config[password]" in secret.json()["status"]["user_message"]
    unknown = await rest.http.post(base, json={"name": "x", "adapter_version": "oracle_v0", "config": {}})
    assert unknown.status_code == 400
    deleted = await rest.http.delete(f"{base}{made['id']}/")
    assert deleted.status_code == 200 and deleted.json()["data"]["state"] == 2
    assert (await rest.http.get(f"{base}{made['id']}/")).status_code == 404


async def test_credentials_secrets_are_write_only_and_encrypted(rest: Rest, adb: AsyncDb) -> None:
    project = await _project(rest)
    made = await _credentials(rest, project["id"])
    assert made["secrets_set"] == ["password"] and made["username"] == "dbt"
    assert made["default_schema"] == "analytics" and made["threads"] == 6 and made["target_name"] == "prod"
    base = f"{_v3(rest)}/projects/{project['id']}/credentials/"
    listed = await rest.http.get(base)
    got = await rest.http.get(f"{base}{made['id']}/")
    kept = await rest.http.post(f"{base}{made['id']}/", json={"threads": 8})
    assert kept.status_code == 200 and kept.json()["data"]["threads"] == 8
    assert kept.json()["data"]["secrets_set"] == ["password"]
    stored = await scalar(adb, "SELECT secrets::text FROM credentials WHERE id = %s", made["id"])
    assert PASSWORD not in stored  # encrypted at rest
    for answer in (listed, got, kept):
        assert answer.status_code == 200 and PASSWORD not in answer.text
    cleared = await rest.http.patch(f"{base}{made['id']}/", json={"secrets": {"password": ""}})
    assert cleared.json()["data"]["secrets_set"] == []
    wrong = await rest.http.post(base, json={"type": "postgres", "default_schema": "a", "secrets": {"host": "x"}})
    assert wrong.status_code == 400 and "secrets[host]" in wrong.json()["status"]["user_message"]
    deleted = await rest.http.delete(f"{base}{made['id']}/")
    assert deleted.status_code == 200 and deleted.json()["data"]["state"] == 2 and PASSWORD not in deleted.text
    assert await scalar(adb, "SELECT secrets::text FROM credentials WHERE id = %s", made["id"]) == "{}"
    assert (await rest.http.get(f"{base}{made['id']}/")).status_code == 404
    kept_secret = await _credentials(rest, project["id"])
    assert (await rest.http.delete(f"{_v3(rest)}/projects/{project['id']}/")).status_code == 200
    gone = await scalar(adb, "SELECT secrets::text FROM credentials WHERE id = %s", kept_secret["id"])
    assert gone == "{}"  # a deleted project's credentials forget their secrets


async def test_another_accounts_connections_and_credentials_are_not_found(rest: Rest, other_rest: Rest) -> None:
    project = await _project(rest)
    connection = await _connection(rest)
    credentials = await _credentials(rest, project["id"])
    theirs = _v3(other_rest)
    for path in (f"connections/{connection['id']}/", f"projects/{project['id']}/credentials/{credentials['id']}/"):
        assert (await other_rest.http.get(f"{theirs}/{path}")).status_code == 404, path
        assert (await other_rest.http.delete(f"{theirs}/{path}")).status_code == 404, path
    patched = await other_rest.http.patch(f"{theirs}/connections/{connection['id']}/", json={"name": "x"})
    assert patched.status_code == 404
    assert (await other_rest.http.get(f"{theirs}/connections/")).json()["data"] == []
    assert (await other_rest.http.get(f"{theirs}/projects/{project['id']}/credentials/")).status_code == 404
    own = await _project(other_rest, "globex")
    body = {"name": "x", "type": "deployment", "dbt_version": "1.10"}
    borrowed = await other_rest.http.post(
        f"{theirs}/projects/{own['id']}/environments/",
        json={**body, "connection_id": connection["id"], "credentials_id": credentials["id"]},
    )
    assert borrowed.status_code == 400 and "connection_id" in borrowed.json()["status"]["user_message"]
    assert (await rest.http.get(f"{_v3(rest)}/connections/{connection['id']}/")).status_code == 200


async def test_environments_are_listed_by_deployment_type_connection_and_credentials(rest: Rest) -> None:
    project = await _project(rest)
    connection = await _connection(rest)
    credentials = await _credentials(rest, project["id"])
    linked = await _linked_environment(rest, project["id"], connection["id"], credentials["id"], "staging")
    inline = await _environment(rest, project["id"], "inline", deployment_type="production")
    base = f"{_v3(rest)}/environments/"

    async def ids(**params: Any) -> list[int]:
        answer = await rest.http.get(base, params=params)
        assert answer.status_code == 200, answer.text
        return [e["id"] for e in answer.json()["data"]]

    assert await ids(deployment_type="staging") == [linked["id"]]
    assert await ids(deployment_type__in='["production", "staging"]') == [linked["id"], inline["id"]]
    assert await ids(connection_id=connection["id"]) == [linked["id"]]
    assert await ids(credentials_id=credentials["id"]) == [linked["id"]]
    assert await ids(credentials_id=credentials["id"] + 1000) == []
    counted = await rest.http.get(f"{_v3(rest)}/connections/{connection['id']}/")
    assert counted.json()["data"]["environment__count"] == 1
    inlined = await rest.http.post(
        f"{_v3(rest)}/projects/{project['id']}/environments/{linked['id']}/",
        json={"connection": {"type": "postgres", "details": {"host": "h", "user": "u", "dbname": "d"}}},
    )
    assert inlined.status_code == 200 and inlined.json()["data"]["connection_id"] is None
    assert await ids(connection_id=connection["id"]) == []


async def _linked_environment(
    rest: Rest, project_id: int, connection_id: int, credentials_id: int, deployment_type: str | None = None
) -> dict[str, Any]:
    body = {
        "name": "prod",
        "type": "deployment",
        "dbt_version": "1.10",
        "description": "by id",
        "deployment_type": deployment_type,
        "connection_id": connection_id,
        "credentials_id": credentials_id,
    }
    answer = await rest.http.post(f"{_v3(rest)}/projects/{project_id}/environments/", json=body)
    assert answer.status_code == 200, answer.text
    made = dict(answer.json()["data"])
    assert made["connection_id"] == connection_id and made["credentials_id"] == credentials_id
    assert made["description"] == "by id" and made["deployment_type"] == deployment_type
    return made


async def _run_context(rest: Rest, adb: AsyncDb, settings: Settings, database_url: str, environment: int) -> DbtContext:
    job = await rest.create_job(adb, environment_id=environment, steps=["dbt build"])
    run = (await rest.http.post(f"{rest.base}/jobs/{job}/run/", json={})).json()["data"]
    async with await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row) as conn:
        context = await load_dbt_context(conn, run["id"], decrypter(box_from_settings(settings)))
    assert context is not None
    return context


async def test_a_project_and_environment_made_by_ids_run_with_the_inline_ones_dbt_context(
    rest: Rest, adb: AsyncDb, settings: Settings, database_url: str, tmp_path: Path
) -> None:
    repository = {"remote_url": URL, "git_clone_strategy": "deploy_token", "git_credential": TOKEN}
    inline_project = await _project(rest, "inline", repository=repository)
    inline = await _environment(
        rest,
        inline_project["id"],
        connection={
            "type": "postgres",
            "details": {"host": "db.internal", "user": "dbt", "dbname": "shop", "port": "5432"},
            "secrets": {"password": PASSWORD},
        },
    )
    by_ids = await _project(rest, "by ids")
    made = await rest.http.post(f"{_v3(rest)}/projects/{by_ids['id']}/repositories/", json=repository)
    assert made.status_code == 200, made.text
    attached = await rest.http.post(
        f"{_v3(rest)}/projects/{by_ids['id']}/", json={"repository_id": made.json()["data"]["id"]}
    )
    assert attached.status_code == 200, attached.text
    connection = await _connection(rest)
    credentials = await _credentials(rest, by_ids["id"])
    linked = await _linked_environment(rest, by_ids["id"], connection["id"], credentials["id"])
    assert linked["connection"] == inline["connection"] and linked["credentials"] == inline["credentials"]
    assert PASSWORD not in str(linked)
    contexts = [
        await _run_context(rest, adb, settings, database_url, environment["id"]) for environment in (inline, linked)
    ]
    same = [dataclasses.replace(c, run_id=0, job_id=0, project_id=0, environment_id=0) for c in contexts]
    assert same[0] == same[1]
    assert same[1].connection_secrets == {"password": PASSWORD} and same[1].git_credential == TOKEN
    project = tmp_path / "project"
    project.mkdir()
    (project / "dbt_project.yml").write_text("name: shop\nprofile: shop\n")
    profiles = [write_profile(c, project, tmp_path / f"profile-{i}") for i, c in enumerate(contexts)]
    texts = [(p.directory / "profiles.yml").read_text() for p in profiles]
    assert texts[0] == texts[1] and "db.internal" in texts[0]
    assert profiles[0].environment == profiles[1].environment
