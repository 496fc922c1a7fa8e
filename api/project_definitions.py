"""Saving projects and environments: the one home of what a create or an update checks and writes,
and deleting them, for gRPC's ``ProjectService``, REST and the web pages' forms.

Secret fields (the git credential, a connection's password or keyfile) are encrypted with the box
that ``box`` returns before the store sees them; it is asked for only when a secret is written, so
an API without keys serves everything else. A credential or secret field left out of an update
keeps the stored one. A project's repository must be one the repository rule allows
(``runplane.basics.repository_urls``), its host resolving to addresses it allows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from api.lookup import existing_environment, existing_project
from api.projects_validation import (
    CREDENTIAL_KINDS,
    EnvironmentExtras,
    EnvironmentSpec,
    environment_spec,
    project_spec,
    reachable_repository,
    repository_url,
)
from api.rows import Environment, Project, Repository
from api.store import Store
from api.validation import positive_id
from runplane.adapters.db import Connection
from runplane.basics.errors import FailedPrecondition, InvalidArgument, NotFound, VersionConflict
from runplane.basics.repository_urls import RepositoryRule
from runplane.basics.secrets import SecretBox
from runplane.basics.types import AccountId
from runplane.dbt.versions import InstalledDbtVersions
from runplane.dbt.warehouse_files import WarehouseFiles
from runplane.v1 import projects_pb2

log = logging.getLogger(__name__)
# The stored kind of a git credential, as the requests name it.
GIT_CREDENTIAL_KINDS = {stored: kind for kind, stored in CREDENTIAL_KINDS.items()}

BoxOf = Callable[[], SecretBox]


async def create_project(
    store: Store, box: BoxOf, rule: RepositoryRule, account_id: AccountId, request: projects_pb2.CreateProjectRequest
) -> Project:
    spec = project_spec(request, rule)
    await reachable_repository(rule, spec.repository_url)
    credential = box().encrypt(spec.credential) if spec.credential else ""
    async with store.transaction() as conn:
        row = await store.insert_project(conn, account_id, spec, credential)
    log.info("project created", extra={"account_id": account_id, "project_id": row.id})
    return row


async def update_project(
    store: Store,
    box: BoxOf,
    rule: RepositoryRule,
    account_id: AccountId,
    request: projects_pb2.UpdateProjectRequest,
    *,
    repository_id: int | None = None,
) -> Project:
    """The project changed; ``repository_id`` names the repository whose URL and credential the request
    carries (see ``attach_repository``), None a repository given inline."""
    project_id = positive_id(request.project_id, "project_id")
    try:
        url = repository_url(request.repository_url, "repository_url", rule)
    except InvalidArgument:
        url = ""  # project_spec below refuses it, with every other field it refuses
    if url:
        await reachable_repository(rule, url)  # resolved before the row is locked
    async with store.transaction() as conn:
        current = await store.get_project(conn, account_id, project_id, for_update=True)
        if current is None:
            raise NotFound(f"project {project_id} not found")
        spec = project_spec(request, rule, stored_kind=str(current.git_credential_kind))
        if spec.credential_kind == "none":
            credential: str | None = ""
        elif spec.credential:
            credential = box().encrypt(spec.credential)
        else:
            credential = None  # the stored one, of the same kind
        expected = _expected_version(request.expected_version)
        row = await store.update_project(
            conn, account_id, project_id, spec, credential, expected_version=expected, repository_id=repository_id
        )
        if row is None:  # locked above, so the compare-and-set failed on its version
            raise VersionConflict(f"project {project_id}", current.version, expected)
    log.info("project updated", extra={"account_id": account_id, "project_id": project_id})
    return row


async def create_repository(
    store: Store,
    box: BoxOf,
    rule: RepositoryRule,
    account_id: AccountId,
    request: projects_pb2.CreateProjectRequest,
    *,
    project_id: int,
) -> Repository:
    """A repository made on its own in the project, of the request's URL and git credential: checked as
    a project's repository is (the same rule, refused with the same reasons)."""
    spec = project_spec(request, rule)
    await reachable_repository(rule, spec.repository_url)
    credential = box().encrypt(spec.credential) if spec.credential else ""
    async with store.transaction() as conn:
        await existing_project(store, conn, account_id, project_id)
        row = await store.insert_repository(conn, account_id, project_id, spec, credential)
    log.info("repository created", extra={"account_id": account_id, "project_id": project_id})
    return row


async def attach_repository(
    store: Store,
    box: BoxOf,
    rule: RepositoryRule,
    account_id: AccountId,
    request: projects_pb2.UpdateProjectRequest,
    *,
    repository_id: int,
) -> Project:
    """The project updated as ``request`` asks, its repository the URL and credential of repository
    ``repository_id`` (one of the account's): runs then clone from it as from one given inline."""
    async with store.connection() as conn:
        repository = await store.get_repository(conn, account_id, repository_id)
    if repository is None:
        raise InvalidArgument("repository_id", f"repository {repository_id} not found")
    attached = projects_pb2.UpdateProjectRequest()
    attached.CopyFrom(request)
    attached.repository_url = repository.remote_url
    attached.git_credential_kind = GIT_CREDENTIAL_KINDS[repository.git_credential_kind]
    attached.git_credential = box().decrypt(repository.git_credential) if repository.git_credential else ""
    return await update_project(store, box, rule, account_id, attached, repository_id=repository_id)


async def delete_repository(store: Store, account_id: AccountId, repository_id: int) -> None:
    """The repository is gone; a project attached to it keeps the URL and credential it copied."""
    async with store.transaction() as conn:
        await store.delete_repository(conn, account_id, repository_id)
    log.info("repository deleted", extra={"account_id": account_id, "repository_id": repository_id})


async def create_environment(
    store: Store,
    box: BoxOf,
    versions: InstalledDbtVersions,
    account_id: AccountId,
    request: projects_pb2.CreateEnvironmentRequest,
    *,
    warehouses: WarehouseFiles,
    extras: EnvironmentExtras | None = None,
) -> Environment:
    """The new environment, its dbt version one of the installed ``versions``, its warehouse file
    (if any) where ``warehouses`` lets runs keep it, in a directory no other environment holds;
    with ``extras`` (dbt Cloud's fields) saved with it."""
    spec = environment_spec(request, versions=versions, warehouses=warehouses)
    secrets = {name: box().encrypt(value) for name, value in spec.connection_secrets.items()}
    async with store.transaction() as conn:
        if await store.get_project(conn, account_id, spec.project_id) is None:
            raise InvalidArgument("project_id", f"project {spec.project_id} not found")
        row = await store.insert_environment(conn, account_id, spec, secrets)
        await _claim_warehouse_directory(store, conn, account_id, int(row.id), spec)
        if extras is not None:
            row = await store.set_environment_extras(conn, account_id, int(row.id), extras)
    log.info(
        "environment created",
        extra={"account_id": account_id, "project_id": spec.project_id, "environment_id": row.id},
    )
    return row


async def update_environment(
    store: Store,
    box: BoxOf,
    versions: InstalledDbtVersions,
    account_id: AccountId,
    request: projects_pb2.UpdateEnvironmentRequest,
    *,
    warehouses: WarehouseFiles,
    extras: EnvironmentExtras | None = None,
) -> Environment:
    """The environment changed; with ``extras`` (dbt Cloud's fields) saved with it, else they are kept."""
    environment_id = positive_id(request.environment_id, "environment_id")
    async with store.transaction() as conn:
        current = await store.get_environment(conn, account_id, environment_id, for_update=True)
        if current is None:
            raise NotFound(f"environment {environment_id} not found")
        spec = environment_spec(request, versions=versions, warehouses=warehouses, project_id=int(current.project_id))
        await _claim_warehouse_directory(store, conn, account_id, environment_id, spec)
        stored: dict[str, str] = dict(current.connection_secrets)
        for name in request.clear_secret_fields:
            if name not in stored:
                raise InvalidArgument("clear_secret_fields", f"{name[:60]!r} is not set")
            del stored[name]
        secrets = {**stored, **{name: box().encrypt(value) for name, value in spec.connection_secrets.items()}}
        expected = _expected_version(request.expected_version)
        row = await store.update_environment(conn, account_id, environment_id, spec, secrets, expected_version=expected)
        if row is None:  # locked above, so the compare-and-set failed on its version
            raise VersionConflict(f"environment {environment_id}", current.version, expected)
        if extras is not None:
            row = await store.set_environment_extras(conn, account_id, environment_id, extras)
    log.info("environment updated", extra={"account_id": account_id, "environment_id": environment_id})
    return row


async def _claim_warehouse_directory(
    store: Store, conn: Connection, account_id: AccountId, environment_id: int, spec: EnvironmentSpec
) -> None:
    """Hold the directory of the environment's warehouse file for it; refused when another holds it."""
    if not spec.warehouse_directory:
        return
    holder = await store.claim_warehouse_directory(conn, account_id, environment_id, spec.warehouse_directory)
    if holder != environment_id:
        raise InvalidArgument(
            "connection.fields[path]",
            f"is in {spec.warehouse_directory}, the warehouse directory of another environment: "
            "give this environment a directory of its own",
        )


def _expected_version(value: int) -> int:
    if value < 0:
        raise InvalidArgument("expected_version", "must be 0 (no check) or the version the object was read at")
    return value


async def delete_project(store: Store, account_id: AccountId, project_id: int) -> None:
    """Refused while a job uses one of the project's environments; its environments go with it."""
    async with store.transaction() as conn:
        await existing_project(store, conn, account_id, project_id, for_update=True)
        environment_ids = await store.environment_ids_of_project(conn, project_id)
        await _refuse_while_used(store, conn, environment_ids, f"project {project_id}")
        await store.delete_project(conn, account_id, project_id)
    log.info("project deleted", extra={"account_id": account_id, "project_id": project_id})


async def delete_environment(store: Store, account_id: AccountId, environment_id: int) -> None:
    """Refused while a job uses the environment."""
    async with store.transaction() as conn:
        await existing_environment(store, conn, account_id, environment_id, for_update=True)
        await _refuse_while_used(store, conn, [environment_id], f"environment {environment_id}")
        await store.delete_environment(conn, account_id, environment_id)
    log.info("environment deleted", extra={"account_id": account_id, "environment_id": environment_id})


async def _refuse_while_used(store: Store, conn: Connection, environment_ids: list[int], what: str) -> None:
    jobs = await store.live_jobs_of_environments(conn, environment_ids) if environment_ids else []
    if jobs:
        named = ", ".join(str(j) for j in jobs)
        raise FailedPrecondition(f"{what} is used by jobs {named}: delete them or move them to another environment")
