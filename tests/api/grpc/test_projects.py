"""Projects and environments changed and deleted: secrets kept unless replaced, nothing in use deleted,
another account's answered as not found."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import psycopg
import pytest

from api.admin import create_account
from api.process import RunningApi
from client.cli import channel
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, projects_pb2, projects_pb2_grpc
from tests.api.conftest import status_of

TOKEN = "ghp_" + "t0ken" * 6
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE=\n-----END OPENSSH PRIVATE KEY-----\n"


class Account:
    def __init__(self, chan: grpc.aio.Channel) -> None:
        self.projects = projects_pb2_grpc.ProjectServiceStub(chan)
        self.jobs = jobs_pb2_grpc.JobServiceStub(chan)


@pytest.fixture
async def account(api: RunningApi, settings: Settings) -> AsyncIterator[Account]:
    _, token = await create_account(settings, name="acme", run_slots=2, memory_mb=1024)
    async with channel(f"127.0.0.1:{api.port}", token) as chan:
        yield Account(chan)


@pytest.fixture
async def stranger(api: RunningApi, settings: Settings) -> AsyncIterator[Account]:
    _, token = await create_account(settings, name="globex", run_slots=1, memory_mb=512)
    async with channel(f"127.0.0.1:{api.port}", token) as chan:
        yield Account(chan)


def _connection(password: str = "", **fields: str) -> projects_pb2.Connection:
    base = {"host": "db.example.com", "port": "5432", "user": "dbt", "dbname": "analytics"}
    return projects_pb2.Connection(
        adapter_type="postgres", fields={**base, **fields}, secret_fields={"password": password} if password else {}
    )


async def _project(account: Account) -> projects_pb2.Project:
    return await account.projects.CreateProject(
        projects_pb2.CreateProjectRequest(
            name="shop",
            repository_url="https://github.com/acme/shop.git",
            git_credential_kind=projects_pb2.GIT_CREDENTIAL_KIND_TOKEN,
            git_credential=TOKEN,
        )
    )


async def _environment(account: Account, project_id: int) -> projects_pb2.Environment:
    return await account.projects.CreateEnvironment(
        projects_pb2.CreateEnvironmentRequest(
            project_id=project_id,
            name="prod",
            environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
            dbt_version="1.10",
            connection=_connection("first-s3cret"),
            schema="analytics",
        )
    )


def _stored(db: psycopg.Connection[Any], sql: str, *params: object) -> Any:
    row = db.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


async def test_a_project_update_keeps_its_credential_unless_it_replaces_or_drops_it(
    account: Account, db: psycopg.Connection[Any]
) -> None:
    project = await _project(account)
    stored = _stored(db, "SELECT git_credential FROM projects WHERE id = %s", project.id)
    renamed = await account.projects.UpdateProject(
        projects_pb2.UpdateProjectRequest(
            project_id=project.id,
            name="shop-2",
            repository_url="https://github.com/acme/shop-2.git",
            subdirectory="dbt",
            git_credential_kind=projects_pb2.GIT_CREDENTIAL_KIND_TOKEN,
        )
    )
    assert (renamed.name, renamed.repository_url, renamed.subdirectory) == (
        "shop-2",
        "https://github.com/acme/shop-2.git",
        "dbt",
    )
    assert renamed.git_credential_set and TOKEN not in str(renamed)
    assert _stored(db, "SELECT git_credential FROM projects WHERE id = %s", project.id) == stored

    # Another kind needs its own secret; given, it replaces the stored one.
    code, details = await status_of(
        account.projects.UpdateProject(
            projects_pb2.UpdateProjectRequest(
                project_id=project.id,
                name="shop-2",
                repository_url="git@github.com:acme/shop-2.git",
                git_credential_kind=projects_pb2.GIT_CREDENTIAL_KIND_SSH_KEY,
            )
        )
    )
    assert (code, details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "git_credential: must be set for git_credential_kind ssh_key",
    )
    keyed = await account.projects.UpdateProject(
        projects_pb2.UpdateProjectRequest(
            project_id=project.id,
            name="shop-2",
            repository_url="git@github.com:acme/shop-2.git",
            git_credential_kind=projects_pb2.GIT_CREDENTIAL_KIND_SSH_KEY,
            git_credential=KEY,
        )
    )
    assert keyed.git_credential_kind == projects_pb2.GIT_CREDENTIAL_KIND_SSH_KEY and keyed.git_credential_set
    replaced = _stored(db, "SELECT git_credential FROM projects WHERE id = %s", project.id)
    assert replaced != stored and "BEGIN" not in replaced

    public = await account.projects.UpdateProject(
        projects_pb2.UpdateProjectRequest(
            project_id=project.id, name="shop-2", repository_url="https://github.com/acme/shop-2.git"
        )
    )
    assert not public.git_credential_set
    assert _stored(db, "SELECT git_credential FROM projects WHERE id = %s", project.id) == ""


async def test_an_environment_update_merges_secret_fields(account: Account, db: psycopg.Connection[Any]) -> None:
    project = await _project(account)
    env = await _environment(account, project.id)
    first = _stored(db, "SELECT connection_secrets->>'password' FROM environments WHERE id = %s", env.id)

    request = projects_pb2.UpdateEnvironmentRequest(
        environment_id=env.id,
        name="production",
        environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
        dbt_version="1.9",
        connection=_connection(host="db2.example.com"),
        schema="marts",
        threads=8,
        target_name="prod",
    )
    kept = await account.projects.UpdateEnvironment(request)
    assert (kept.name, kept.dbt_version, kept.schema, kept.threads, kept.project_id) == (
        "production", "1.9", "marts", 8, project.id,
    )  # fmt: skip
    assert kept.connection_fields["host"] == "db2.example.com" and list(kept.secret_fields_set) == ["password"]
    assert _stored(db, "SELECT connection_secrets->>'password' FROM environments WHERE id = %s", env.id) == first

    request.connection.CopyFrom(_connection("second-s3cret"))
    rotated = await account.projects.UpdateEnvironment(request)
    stored = _stored(db, "SELECT connection_secrets->>'password' FROM environments WHERE id = %s", env.id)
    assert stored != first and "second-s3cret" not in stored and "second-s3cret" not in str(rotated)

    request.connection.CopyFrom(_connection())
    request.clear_secret_fields.append("password")
    cleared = await account.projects.UpdateEnvironment(request)
    assert list(cleared.secret_fields_set) == []
    request.clear_secret_fields[:] = ["keyfile"]
    code, details = await status_of(account.projects.UpdateEnvironment(request))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "clear_secret_fields: 'keyfile' is not set")


async def test_nothing_in_use_is_deleted_and_deleted_is_gone(account: Account, db: psycopg.Connection[Any]) -> None:
    project = await _project(account)
    env = await _environment(account, project.id)
    job = await account.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(
            name="build",
            job_type=common_pb2.JOB_TYPE_DEPLOY,
            steps=["dbt build"],
            settings=jobs_pb2.JobSettings(environment_id=env.id),
        )
    )
    for call, what in (
        (
            account.projects.DeleteEnvironment(projects_pb2.DeleteEnvironmentRequest(environment_id=env.id)),
            "environment",
        ),
        (account.projects.DeleteProject(projects_pb2.DeleteProjectRequest(project_id=project.id)), "project"),
    ):
        code, details = await status_of(call)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert f"is used by jobs {job.id}" in details, what

    await account.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job.id))
    await account.projects.DeleteProject(projects_pb2.DeleteProjectRequest(project_id=project.id))
    gone: tuple[Awaitable[object], ...] = (
        account.projects.GetProject(projects_pb2.GetProjectRequest(project_id=project.id)),
        account.projects.GetEnvironment(projects_pb2.GetEnvironmentRequest(environment_id=env.id)),
        account.projects.DeleteProject(projects_pb2.DeleteProjectRequest(project_id=project.id)),
    )
    for answer in gone:
        assert (await status_of(answer))[0] == grpc.StatusCode.NOT_FOUND
    assert list((await account.projects.ListProjects(projects_pb2.ListProjectsRequest())).projects) == []
    assert list((await account.projects.ListEnvironments(projects_pb2.ListEnvironmentsRequest())).environments) == []
    # Secrets are forgotten with them; the rows stay for the runs made with them.
    assert _stored(db, "SELECT git_credential FROM projects WHERE id = %s", project.id) == ""
    assert _stored(db, "SELECT connection_secrets::text FROM environments WHERE id = %s", env.id) == "{}"
    code, details = await status_of(
        account.jobs.CreateJob(
            jobs_pb2.CreateJobRequest(
                name="late", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=["dbt build"],
                settings=jobs_pb2.JobSettings(environment_id=env.id),
            )
        )
    )  # fmt: skip
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"environment {env.id}" in details


async def test_another_accounts_projects_are_not_found(account: Account, stranger: Account) -> None:
    project = await _project(account)
    env = await _environment(account, project.id)
    for call in (
        stranger.projects.UpdateProject(
            projects_pb2.UpdateProjectRequest(project_id=project.id, name="x", repository_url="https://h/x.git")
        ),
        stranger.projects.DeleteProject(projects_pb2.DeleteProjectRequest(project_id=project.id)),
        stranger.projects.UpdateEnvironment(
            projects_pb2.UpdateEnvironmentRequest(
                environment_id=env.id, name="x", environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
                dbt_version="1.10",
                connection=_connection(), schema="s",
            )
        ),
        stranger.projects.DeleteEnvironment(projects_pb2.DeleteEnvironmentRequest(environment_id=env.id)),
    ):  # fmt: skip
        assert (await status_of(call))[0] == grpc.StatusCode.NOT_FOUND
    assert (await account.projects.GetProject(projects_pb2.GetProjectRequest(project_id=project.id))).name == "shop"


async def test_an_update_naming_an_older_version_is_refused_and_changes_nothing(account: Account) -> None:
    project = await _project(account)
    environment = await _environment(account, project.id)
    assert project.version == 1 and environment.version == 1

    def project_update(name: str, version: int) -> projects_pb2.UpdateProjectRequest:
        return projects_pb2.UpdateProjectRequest(
            project_id=project.id, name=name, repository_url=project.repository_url,
            git_credential_kind=projects_pb2.GIT_CREDENTIAL_KIND_TOKEN, expected_version=version,
        )  # fmt: skip

    first = await account.projects.UpdateProject(project_update("shop-a", 1))
    assert first.version == 2
    code, details = await status_of(account.projects.UpdateProject(project_update("shop-b", 1)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and f"project {project.id} is at version 2, not 1" in details
    assert (await account.projects.GetProject(projects_pb2.GetProjectRequest(project_id=project.id))).name == "shop-a"
    assert (await account.projects.UpdateProject(project_update("shop-c", 0))).version == 3  # 0: no check

    def environment_update(threads: int, version: int) -> projects_pb2.UpdateEnvironmentRequest:
        return projects_pb2.UpdateEnvironmentRequest(
            environment_id=environment.id, name="prod", environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
            dbt_version="1.10", connection=_connection(), schema="analytics", threads=threads,
            expected_version=version,
        )  # fmt: skip

    assert (await account.projects.UpdateEnvironment(environment_update(8, 1))).version == 2
    code, details = await status_of(account.projects.UpdateEnvironment(environment_update(2, 1)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "is at version 2, not 1" in details
    stored = await account.projects.GetEnvironment(projects_pb2.GetEnvironmentRequest(environment_id=environment.id))
    assert (stored.threads, stored.version) == (8, 2)
