"""An environment's secret variables (DBT_ENV_SECRET_*) through both doors: encrypted at rest, never
returned (to a read-only token nor to a full one), set, kept and unset one by one. The project's git
credential and the connection's password are never returned either."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from api.admin import create_account, create_token
from api.process import RunningApi
from api.rest.server import RestServer
from client.cli import channel
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import Settings
from runplane.v1 import projects_pb2, projects_pb2_grpc
from tests.api.conftest import AsyncDb, scalar
from tests.conftest import TEST_SECRET_KEYS

SECRET = "env-secret-value-9f3a"
TOKEN = "ghp_" + "gitT0ken" * 4
PASSWORD = "warehouse-pa55word-77"
NEVER_SHOWN = (SECRET, TOKEN, PASSWORD)
CONNECTION = {"host": "db.internal", "port": "5432", "user": "dbt", "dbname": "shop"}


@dataclass
class Tokens:
    account_id: int
    full: str
    read_only: str


@pytest.fixture
async def tokens(settings: Settings) -> Tokens:
    account_id, full = await create_account(settings, name="acme", run_slots=1, memory_mb=512)
    read_only = await create_token(settings, account_id=account_id, name="dashboards", scopes=("read_only",))
    return Tokens(account_id, full, read_only)


Stubs = dict[str, "projects_pb2_grpc.ProjectServiceAsyncStub"]  # by token: "full", "read_only"


@pytest.fixture
async def projects(api: RunningApi, tokens: Tokens) -> AsyncIterator[Stubs]:
    async with (
        channel(f"127.0.0.1:{api.port}", tokens.full) as full,
        channel(f"127.0.0.1:{api.port}", tokens.read_only) as reader,
    ):
        yield {
            "full": projects_pb2_grpc.ProjectServiceStub(full),
            "read_only": projects_pb2_grpc.ProjectServiceStub(reader),
        }


async def _stored(adb: AsyncDb, environment_id: int) -> tuple[dict[str, str], dict[str, str]]:
    """The environment's clear variables and its secret ones, decrypted."""
    box = SecretBox.from_keys(TEST_SECRET_KEYS)
    plain = await scalar(adb, "SELECT variables FROM environments WHERE id = %s", environment_id)
    sealed = await scalar(adb, "SELECT secret_variables FROM environments WHERE id = %s", environment_id)
    raw = await scalar(adb, "SELECT secret_variables::text FROM environments WHERE id = %s", environment_id)
    assert all(value not in raw for value in NEVER_SHOWN)  # ciphertext only
    return plain, {name: box.decrypt(token) for name, token in sealed.items()}


def _update(environment: projects_pb2.Environment, variables: dict[str, str]) -> projects_pb2.UpdateEnvironmentRequest:
    return projects_pb2.UpdateEnvironmentRequest(
        environment_id=environment.id,
        name=environment.name,
        environment_type=environment.environment_type,
        dbt_version=environment.dbt_version,
        connection=projects_pb2.Connection(adapter_type="postgres", fields=CONNECTION),
        schema=environment.schema,
        variables=variables,
    )


async def test_grpc_never_returns_an_environments_secrets_and_sets_them_one_by_one(
    projects: Stubs, adb: AsyncDb
) -> None:
    full = projects["full"]
    project = await full.CreateProject(
        projects_pb2.CreateProjectRequest(
            name="shop",
            repository_url="https://github.com/acme/shop.git",
            git_credential_kind=projects_pb2.GIT_CREDENTIAL_KIND_TOKEN,
            git_credential=TOKEN,
        )
    )
    created = await full.CreateEnvironment(
        projects_pb2.CreateEnvironmentRequest(
            project_id=project.id,
            name="prod",
            environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
            dbt_version="1.10",
            connection=projects_pb2.Connection(
                adapter_type="postgres", fields=CONNECTION, secret_fields={"password": PASSWORD}
            ),
            schema="analytics",
            variables={"PLAIN": "p", "DBT_ENV_SECRET_API_KEY": SECRET},
        )
    )
    responses: list[Any] = [project, created]
    for stub in projects.values():
        responses += [
            await stub.GetProject(projects_pb2.GetProjectRequest(project_id=project.id)),
            await stub.ListProjects(projects_pb2.ListProjectsRequest()),
            await stub.GetEnvironment(projects_pb2.GetEnvironmentRequest(environment_id=created.id)),
            await stub.ListEnvironments(projects_pb2.ListEnvironmentsRequest()),
        ]
    for response in responses:
        wire = response.SerializeToString()
        assert all(value.encode() not in wire for value in NEVER_SHOWN), response
    for environment in (created, responses[-2], responses[-1].environments[0]):
        assert dict(environment.variables) == {"PLAIN": "p"}
        assert list(environment.secret_variable_names) == ["DBT_ENV_SECRET_API_KEY"]
    assert await _stored(adb, created.id) == ({"PLAIN": "p"}, {"DBT_ENV_SECRET_API_KEY": SECRET})

    kept = await full.UpdateEnvironment(_update(created, {"OTHER": "o"}))  # a secret not named keeps its value
    assert list(kept.secret_variable_names) == ["DBT_ENV_SECRET_API_KEY"] and dict(kept.variables) == {"OTHER": "o"}
    assert await _stored(adb, created.id) == ({"OTHER": "o"}, {"DBT_ENV_SECRET_API_KEY": SECRET})
    changed = await full.UpdateEnvironment(_update(created, {"DBT_ENV_SECRET_API_KEY": "", "DBT_ENV_SECRET_B": "b"}))
    assert list(changed.secret_variable_names) == ["DBT_ENV_SECRET_B"]  # empty unsets, a value sets
    assert await _stored(adb, created.id) == ({}, {"DBT_ENV_SECRET_B": "b"})


async def test_rest_never_returns_an_environments_secrets_and_sets_them_one_by_one(
    rest_server: RestServer, tokens: Tokens, adb: AsyncDb
) -> None:
    v3 = f"/api/v3/accounts/{tokens.account_id}"
    async with (
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{rest_server.port}", headers={"Authorization": f"Token {tokens.full}"}
        ) as full,
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{rest_server.port}", headers={"Authorization": f"Token {tokens.read_only}"}
        ) as reader,
    ):
        project = await full.post(
            f"{v3}/projects/",
            json={
                "name": "shop",
                "repository": {
                    "remote_url": "https://github.com/acme/shop.git",
                    "git_clone_strategy": "deploy_token",
                    "git_credential": TOKEN,
                },
            },
        )
        assert project.status_code == 200, project.text
        project_id = project.json()["data"]["id"]
        created = await full.post(
            f"{v3}/projects/{project_id}/environments/",
            json={
                "name": "prod",
                "type": "deployment",
                "dbt_version": "1.10",
                "connection": {"type": "postgres", "details": CONNECTION, "secrets": {"password": PASSWORD}},
                "credentials": {"schema": "analytics"},
                "custom_environment_variables": {"PLAIN": "p", "DBT_ENV_SECRET_API_KEY": SECRET},
            },
        )
        assert created.status_code == 200, created.text
        environment_id = created.json()["data"]["id"]
        path = f"{v3}/projects/{project_id}/environments/{environment_id}/"
        answers = [project, created]
        for client in (full, reader):
            for read in (path, f"{v3}/environments/", f"{v3}/projects/{project_id}/", f"{v3}/projects/"):
                answer = await client.get(read)
                assert answer.status_code == 200, answer.text
                answers.append(answer)
        for answer in answers:
            assert all(value not in answer.text for value in NEVER_SHOWN), answer.text
        for answer in (created, answers[2], answers[6]):
            shown = answer.json()["data"]
            assert shown["custom_environment_variables"] == {"PLAIN": "p"}
            assert shown["secret_variable_names"] == ["DBT_ENV_SECRET_API_KEY"]
        assert (await reader.post(path, json={"name": "x"})).status_code == 403
        assert await _stored(adb, environment_id) == ({"PLAIN": "p"}, {"DBT_ENV_SECRET_API_KEY": SECRET})

        renamed = await full.post(path, json={"name": "production"})  # variables not sent: all kept
        assert renamed.status_code == 200, renamed.text
        assert renamed.json()["data"]["secret_variable_names"] == ["DBT_ENV_SECRET_API_KEY"]
        assert await _stored(adb, environment_id) == ({"PLAIN": "p"}, {"DBT_ENV_SECRET_API_KEY": SECRET})
        replaced = await full.post(path, json={"custom_environment_variables": {"OTHER": "o"}})
        assert replaced.json()["data"]["secret_variable_names"] == ["DBT_ENV_SECRET_API_KEY"]  # not named: kept
        unset = await full.post(path, json={"custom_environment_variables": {"DBT_ENV_SECRET_API_KEY": ""}})
        assert unset.status_code == 200 and unset.json()["data"]["secret_variable_names"] == []
        assert await _stored(adb, environment_id) == ({}, {})
