"""Projects (with their repository) and environments (with their connection), as dbt Cloud's v3 API
reads and writes them; v2 lists and reads projects too.

A body becomes ProjectService's request and goes through the same checks and use cases as gRPC.
Secret fields (the repository's credential, a connection's password or key, the environment's
``DBT_ENV_SECRET_*`` variables) are write-only: an answer says which are set. An update changes what
the body names and keeps the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response
from pydantic import BaseModel, Field

from api import project_definitions as use
from api import warehouse_definitions as warehouse
from api.lookup import existing_environment, existing_project
from api.projects_validation import EnvironmentExtras
from api.rest import params, shapes
from api.rest.auth import Account
from api.rest.envelope import ERROR_RESPONSES, Envelope, Extra, ListEnvelope, Pagination, success
from api.rows import Environment, Project
from api.store import Store
from api.warehouse_definitions import EnvironmentConnection
from runplane.basics.errors import FailedPrecondition, InvalidArgument, NotFound
from runplane.basics.repository_urls import RepositoryRule
from runplane.basics.secrets import SecretBox
from runplane.basics.types import AccountId
from runplane.v1 import projects_pb2

router = APIRouter(responses=ERROR_RESPONSES)
MAX_LIMIT = 100
ProjectPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="Numeric id of the project")]
EnvironmentPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="Numeric id of the environment")]
IfMatch = Annotated[
    str | None,
    Header(
        alias="If-Match",
        description="The version the object was read at (its ETag): the update is refused with 409 when it "
        "was saved since. Without it the update applies to whatever is stored.",
    ),
]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1)]
NameContains = Annotated[
    str | None, Query(max_length=255, pattern=params.PLAIN_TEXT, description="Part of the name, any case.")
]
State = Annotated[
    str | None,
    Query(max_length=10, description="active (1, the default), all, or deleted (2): none is kept deleted."),
]
NAMES = frozenset({"name", "name__icontains", "state", "pk", "pk__in", "include_related"})
PROJECT_FILTERS = NAMES | {"pk__gt"}
ENVIRONMENT_FILTERS = NAMES | {
    "project_id",
    "project_id__in",
    "type",
    "dbt_version",
    "dbt_version__in",
    "id__gt",
    "deployment_type",
    "deployment_type__in",
    "credentials_id",
    "connection_id",
}
DEPLOYMENT_TYPES = (None, "production", "staging")
# What include_related names on a project or an environment: always part of it here.
PROJECT_RELATED = frozenset({"repository"})
ENVIRONMENT_RELATED = frozenset({"connection", "credentials"})
LIST_ORDERS = ("id", "name", "created_at", "updated_at")
# dbt Cloud's ways of cloning a repository, by runplane's kind of git credential.
CLONE_STRATEGIES = {
    None: projects_pb2.GIT_CREDENTIAL_KIND_UNSPECIFIED,
    "deploy_key": projects_pb2.GIT_CREDENTIAL_KIND_SSH_KEY,
    "deploy_token": projects_pb2.GIT_CREDENTIAL_KIND_TOKEN,
}
# runplane's field names as this door's, in the errors of the shared checks.
PROJECT_NAMES = {
    "repository_url": "repository.remote_url",
    "subdirectory": "dbt_project_subdirectory",
    "git_credential_kind": "repository.git_clone_strategy",
    "git_credential": "repository.git_credential",
}
ENVIRONMENT_NAMES = {
    "environment_type": "type",
    "connection.fields": "connection.details",
    "connection.secret_fields": "connection.secrets",
    "connection.adapter_type": "connection.type",
    "schema": "credentials.schema",
    "threads": "credentials.threads",
    "target_name": "credentials.target_name",
    "git_branch": "custom_branch",
    "variables": "custom_environment_variables",
    "clear_secret_fields": "clear_secrets",
}
KINDS = {"none": None, "ssh_key": "deploy_key", "token": "deploy_token"}
ENVIRONMENT_TYPES = {
    "deployment": projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
    "development": projects_pb2.ENVIRONMENT_TYPE_DEVELOPMENT,
}


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _repositories(request: Request) -> RepositoryRule:
    rule: RepositoryRule = request.app.state.repositories
    return rule


def _keys(request: Request) -> use.BoxOf:
    box: SecretBox | None = request.app.state.box

    def keys() -> SecretBox:
        if box is None:
            raise FailedPrecondition("secrets cannot be stored: the API has no secret keys (RUNPLANE_SECRET_KEYS)")
        return box

    return keys


class RepositoryBody(BaseModel):
    remote_url: str = Field(max_length=2048)
    git_clone_strategy: str | None = Field(
        None, max_length=40, description="deploy_key (ssh, git_credential a private key), deploy_token (https)."
    )
    git_credential: str | None = Field(None, max_length=16384, description="Write-only: the key or the token.")


class ProjectBody(BaseModel):
    account_id: int | None = Field(None, description="The URL's account, when sent: another is refused.")
    name: str | None = Field(None, max_length=200)
    description: str | None = Field(None, max_length=1000)
    dbt_project_subdirectory: str | None = Field(None, max_length=1024)
    repository: RepositoryBody | None = None
    repository_id: int | None = Field(
        None, ge=1, le=2**63 - 1, description="Attach a repository made in the project (update only)."
    )


class ConnectionBody(BaseModel):
    type: str = Field(max_length=40, description="The adapter: postgres, ...")
    details: dict[str, str | int | bool] = Field(default_factory=dict, max_length=50)
    secrets: dict[str, str] = Field(default_factory=dict, max_length=20, description="Write-only secret fields.")


class CredentialsBody(BaseModel):
    schema_: str | None = Field(None, alias="schema", max_length=63)
    threads: int | None = Field(None, ge=1, le=64)
    target_name: str | None = Field(None, max_length=64)


class EnvironmentBody(BaseModel):
    account_id: int | None = Field(None, description="The URL's account, when sent: another is refused.")
    project_id: int | None = Field(None, description="The project (v2's create names it here; else the URL's).")
    name: str | None = Field(None, max_length=200)
    type: str | None = Field(None, max_length=20, description="deployment or development")
    description: str | None = Field(None, max_length=1000)
    deployment_type: str | None = Field(None, max_length=20, description="production, staging or null.")
    connection_id: int | None = Field(
        None, ge=1, le=2**63 - 1, description="The account's connection: with credentials_id, instead of connection."
    )
    credentials_id: int | None = Field(
        None, ge=1, le=2**63 - 1, description="The project's credentials: with connection_id, instead of credentials."
    )
    dbt_version: str | None = Field(None, max_length=128)
    use_custom_branch: bool | None = None
    custom_branch: str | None = Field(None, max_length=255)
    connection: ConnectionBody | None = None
    credentials: CredentialsBody | None = None
    custom_environment_variables: dict[str, str] | None = Field(
        None,
        max_length=100,
        description="Replaces the plain variables. DBT_ENV_SECRET_* ones are write-only: one sent with a value "
        "is set, sent empty is removed, not sent is kept; an answer lists them in secret_variable_names.",
    )
    clear_secrets: list[str] = Field(default_factory=list, max_length=20, description="Secret fields to remove.")


def _project_request(body: ProjectBody, current: Project | None) -> dict[str, Any]:
    """The fields of Create/UpdateProjectRequest: the body's, else the stored project's."""
    repository = body.repository
    if current is None and repository is None:
        raise InvalidArgument("repository.remote_url", "is required")
    strategy = repository.git_clone_strategy if repository else KINDS[current.git_credential_kind] if current else None
    if strategy not in CLONE_STRATEGIES:
        raise InvalidArgument("repository.git_clone_strategy", "must be deploy_key, deploy_token or null")
    subdirectory = body.dbt_project_subdirectory
    return {
        "name": body.name if body.name is not None else current.name if current else "",
        "repository_url": repository.remote_url if repository else current.repository_url if current else "",
        "subdirectory": subdirectory if subdirectory is not None else current.subdirectory if current else "",
        "git_credential_kind": CLONE_STRATEGIES[strategy],
        "git_credential": (repository.git_credential if repository else None) or "",
    }


def _environment_request(
    body: EnvironmentBody, current: Environment | None, linked: EnvironmentConnection | None = None
) -> dict[str, Any]:
    """The fields of Create/UpdateEnvironmentRequest: the body's (its connection and credentials
    ``linked`` when it names them by id), else the stored environment's."""
    kind = body.type if body.type is not None else current.environment_type if current else None
    if kind not in ENVIRONMENT_TYPES:
        raise InvalidArgument("type", "must be deployment or development")
    if body.use_custom_branch is False:
        branch = ""
    else:
        branch = body.custom_branch if body.custom_branch is not None else current.git_branch if current else ""
    connection = body.connection
    if linked is not None:
        pb_connection = linked.connection
    elif connection is not None:
        details = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in connection.details.items()}
        pb_connection = projects_pb2.Connection(
            adapter_type=connection.type, fields=details, secret_fields=connection.secrets
        )
    elif current is not None:
        pb_connection = projects_pb2.Connection(adapter_type=current.adapter_type, fields=current.connection)
    else:
        raise InvalidArgument("connection", "is required")
    credentials = body.credentials or CredentialsBody()
    if linked is not None:
        credentials = CredentialsBody.model_validate(
            {"schema": linked.schema, "threads": linked.threads, "target_name": linked.target_name}
        )
    variables = body.custom_environment_variables
    return {
        "name": body.name if body.name is not None else current.name if current else "",
        "environment_type": ENVIRONMENT_TYPES[kind],
        "dbt_version": body.dbt_version if body.dbt_version is not None else current.dbt_version if current else "",
        "git_branch": branch,
        "connection": pb_connection,
        "target_name": credentials.target_name or (current.target_name if current else ""),
        "schema": credentials.schema_ or (current.schema_name if current else ""),
        "threads": credentials.threads or (current.threads if current else 0),
        "variables": variables if variables is not None else dict(current.variables) if current else {},
    }


def _extras(body: EnvironmentBody, current: Environment | None) -> EnvironmentExtras:
    """dbt Cloud's fields of the environment: the body's, else the stored ones; the ids of its
    connection and credentials go when a connection is sent inline."""
    sent = body.model_fields_set
    deployment = body.deployment_type if "deployment_type" in sent else current.deployment_type if current else None
    if deployment not in DEPLOYMENT_TYPES:
        raise InvalidArgument("deployment_type", "must be production, staging or null")
    description = body.description if body.description is not None else current.description if current else ""
    ids: tuple[int | None, int | None]
    if body.connection_id is not None:
        ids = (body.connection_id, body.credentials_id)
    elif body.connection is not None or current is None:
        ids = (None, None)
    else:
        ids = (current.connection_id, current.credentials_id)
    return EnvironmentExtras(description, deployment, *ids)


async def _linked(
    request: Request, account_id: AccountId, project_id: int, body: EnvironmentBody
) -> EnvironmentConnection | None:
    """The connection the body names by ids (both, and then neither inline part), or None."""
    if body.connection_id is None and body.credentials_id is None:
        return None
    if body.connection_id is None or body.credentials_id is None:
        raise InvalidArgument("connection_id", "name both connection_id and credentials_id, or neither")
    if body.connection is not None or body.credentials is not None:
        raise InvalidArgument("connection_id", "send a connection and credentials by id or inline, not both")
    return await warehouse.environment_connection(
        _store(request),
        _keys(request),
        account_id,
        project_id,
        connection_id=body.connection_id,
        credentials_id=body.credentials_id,
    )


@dataclass(frozen=True)
class ListQuery:
    """What every list of projects or environments takes: names, ids, state, order and a page."""

    name: str | None
    name__icontains: str | None
    ids: tuple[int, ...]
    id_gt: int | None
    state: params.State
    include: set[str]
    order_by: str
    offset: int
    limit: int


def list_query(
    request: Request,
    *,
    name: Annotated[str | None, Query(max_length=255, pattern=params.PLAIN_TEXT, description="The whole name.")] = None,
    name__icontains: NameContains = None,
    pk: Annotated[int | None, Query(ge=1, le=2**63 - 1, description="One id.")] = None,
    pk__in: Annotated[str | None, Query(max_length=2000, description="Ids, e.g. [1,2].")] = None,
    pk__gt: Annotated[int | None, Query(ge=0, le=2**63 - 1, description="Ids above this one.")] = None,
    id__gt: Annotated[int | None, Query(ge=0, le=2**63 - 1, description="Ids above this one.")] = None,
    state: State = None,
    include_related: Annotated[
        list[str] | None, Query(description="Always included: repository; connection, credentials.")
    ] = None,
    order_by: Annotated[str | None, Query(max_length=40, description="id, name, created_at, updated_at; -x.")] = None,
    offset: Offset = 0,
    limit: Limit = MAX_LIMIT,
) -> ListQuery:
    order = params.order_by(order_by, LIST_ORDERS)
    ids = params.ids(pk__in, "pk__in") + ((pk,) if pk is not None else ())
    above = max((i for i in (pk__gt, id__gt) if i is not None), default=None)
    include = params.related(include_related, PROJECT_RELATED | ENVIRONMENT_RELATED)
    which = params.state(state, params.State.ACTIVE)
    return ListQuery(name, name__icontains, ids, above, which, include, order, offset, limit)


Listing = Annotated[ListQuery, Depends(list_query)]
Listed = TypeVar("Listed", Project, Environment)


def _listed(rows: list[Listed], query: ListQuery, echoed: dict[str, Any]) -> tuple[list[Listed], Extra]:
    """The rows the query's names keep, in its order, one page of them, and the ``extra`` that says so."""
    kept = [
        r
        for r in rows
        if (query.name is None or r.name == query.name)
        and (query.name__icontains is None or query.name__icontains.lower() in r.name.lower())
        and (not query.ids or r.id in query.ids)
        and (query.id_gt is None or r.id > query.id_gt)
        and query.state is not params.State.DELETED  # a deleted project or environment is not kept
    ]
    field = query.order_by.removeprefix("-")
    kept.sort(key=lambda r: (getattr(r, field), r.id), reverse=query.order_by.startswith("-"))
    page = kept[query.offset : query.offset + query.limit]
    filters = {
        **echoed,
        "name": query.name,
        "name__icontains": query.name__icontains,
        "pk__in": list(query.ids) or None,
        "id__gt": query.id_gt,
        "state": query.state.value,
    }
    return page, Extra(
        filters={**{k: v for k, v in filters.items() if v is not None}, "limit": query.limit, "offset": query.offset},
        order_by=query.order_by,
        pagination=Pagination(count=len(page), total_count=len(kept)),
    )


async def _described(request: Request, account_id: AccountId, row: Project, description: str | None) -> Project:
    """The project with the description the body sends (None: not sent, kept)."""
    if description is None or description == row.description:
        return row
    store = _store(request)
    async with store.transaction() as conn:
        return await store.set_project_description(conn, account_id, int(row.id), description)


@router.get("/api/v3/accounts/{account_id}/projects/", summary="List projects")
@router.get("/api/v2/accounts/{account_id}/projects/", summary="List projects (v2)")
async def list_projects(
    request: Request,
    account_id: Account,
    query: Listing,
) -> ListEnvelope[shapes.Project]:
    params.only_known(request.query_params, PROJECT_FILTERS)
    params.related(list(query.include), PROJECT_RELATED)
    store = _store(request)
    async with store.connection() as conn:
        rows = await store.list_projects(conn, account_id)
    page, extra = _listed(rows, query, {})
    return ListEnvelope[shapes.Project](status=success(), data=[shapes.project(r) for r in page], extra=extra)


@router.post("/api/v3/accounts/{account_id}/projects/", summary="Create a project")
async def create_project(
    request: Request, response: Response, account_id: Account, body: Annotated[ProjectBody, Body()]
) -> Envelope[shapes.Project]:
    params.same_account(body.account_id, account_id)
    if body.repository_id is not None:
        raise InvalidArgument(
            "repository_id",
            "a repository is made in a project: create the project, then its repository, then attach it",
        )
    fields = _project_request(body, None)
    with params.named_as(PROJECT_NAMES):
        row = await use.create_project(
            _store(request),
            _keys(request),
            _repositories(request),
            account_id,
            projects_pb2.CreateProjectRequest(**fields),
        )
    row = await _described(request, account_id, row, body.description)
    params.tag(response, row.version)
    return Envelope[shapes.Project](status=success(), data=shapes.project(row))


@router.get("/api/v3/accounts/{account_id}/projects/{project_id}/", summary="Get a project")
@router.get("/api/v2/accounts/{account_id}/projects/{project_id}/", summary="Get a project (v2)")
async def get_project(
    request: Request, response: Response, account_id: Account, project_id: ProjectPath
) -> Envelope[shapes.Project]:
    store = _store(request)
    async with store.connection() as conn:
        row = await existing_project(store, conn, account_id, project_id)
    params.tag(response, row.version)
    return Envelope[shapes.Project](status=success(), data=shapes.project(row))


@router.post("/api/v3/accounts/{account_id}/projects/{project_id}/", summary="Update a project")
async def update_project(
    request: Request,
    response: Response,
    account_id: Account,
    project_id: ProjectPath,
    *,
    body: Annotated[ProjectBody, Body()],
    if_match: IfMatch = None,
) -> Envelope[shapes.Project]:
    """Changes what the body names; the repository's credential is kept unless one is sent. With
    ``If-Match`` the stored fields the body leaves out are the ones read at that version, or 409."""
    params.same_account(body.account_id, account_id)
    version = params.expected_version(if_match)
    store = _store(request)
    async with store.connection() as conn:
        current = await existing_project(store, conn, account_id, project_id)
    if body.repository_id is not None and body.repository is not None:
        raise InvalidArgument("repository_id", "send a repository or a repository_id, not both")
    fields = _project_request(body, current)
    request_pb = projects_pb2.UpdateProjectRequest(project_id=project_id, expected_version=version, **fields)
    with params.named_as(PROJECT_NAMES):
        if body.repository_id is not None:
            row = await use.attach_repository(
                store, _keys(request), _repositories(request), account_id, request_pb, repository_id=body.repository_id
            )
        else:
            row = await use.update_project(store, _keys(request), _repositories(request), account_id, request_pb)
    row = await _described(request, account_id, row, body.description)
    params.tag(response, row.version)
    return Envelope[shapes.Project](status=success(), data=shapes.project(row))


@router.delete("/api/v3/accounts/{account_id}/projects/{project_id}/", summary="Delete a project")
async def delete_project(request: Request, account_id: Account, project_id: ProjectPath) -> Envelope[shapes.Project]:
    """Refused (409) while a job uses one of its environments; its environments go with it. 200 with the
    deleted project (state 2), as a job's delete answers (see there why not the document's 204)."""
    store = _store(request)
    async with store.connection() as conn:
        row = await existing_project(store, conn, account_id, project_id)
    await use.delete_project(store, account_id, project_id)
    deleted = shapes.project(row).model_copy(update={"state": shapes.DELETED})
    return Envelope[shapes.Project](status=success(), data=deleted)


@dataclass(frozen=True)
class EnvironmentQuery:
    type: str | None
    dbt_versions: tuple[str, ...]
    deployment_types: tuple[str, ...] = ()
    connection_id: int | None = None
    credentials_id: int | None = None

    def keeps(self, row: Environment) -> bool:
        return (
            (self.type is None or row.environment_type == self.type)
            and (not self.dbt_versions or row.dbt_version in self.dbt_versions)
            and (not self.deployment_types or row.deployment_type in self.deployment_types)
            and (self.connection_id is None or row.connection_id == self.connection_id)
            and (self.credentials_id is None or row.credentials_id == self.credentials_id)
        )


Id = Annotated[int | None, Query(ge=1, le=2**63 - 1)]


def environment_query(
    *,
    type_: Annotated[str | None, Query(alias="type", max_length=20, description="deployment or development")] = None,
    dbt_version: Annotated[str | None, Query(max_length=128)] = None,
    dbt_version__in: Annotated[str | None, Query(max_length=2000, description='e.g. ["1.9", "1.10"]')] = None,
    deployment_type: Annotated[str | None, Query(max_length=20, description="production or staging")] = None,
    deployment_type__in: Annotated[str | None, Query(max_length=200, description='e.g. ["production"]')] = None,
    connection_id: Id = None,
    credentials_id: Id = None,
) -> EnvironmentQuery:
    if type_ is not None and type_ not in ENVIRONMENT_TYPES:
        raise InvalidArgument("type", "must be deployment or development")
    versions = tuple(params.words([dbt_version__in]) if dbt_version__in else ()) + (
        (dbt_version,) if dbt_version is not None else ()
    )
    deployments = tuple(params.words([deployment_type__in]) if deployment_type__in else ()) + (
        (deployment_type,) if deployment_type is not None else ()
    )
    for value in deployments:
        if value not in DEPLOYMENT_TYPES:
            raise InvalidArgument("deployment_type", "must be production or staging")
    return EnvironmentQuery(type_, versions, deployments, connection_id, credentials_id)


Environments = Annotated[EnvironmentQuery, Depends(environment_query)]


async def _environments(
    request: Request, account_id: AccountId, project_ids: tuple[int, ...], query: ListQuery, which: EnvironmentQuery
) -> ListEnvelope[shapes.Environment]:
    params.only_known(request.query_params, ENVIRONMENT_FILTERS)
    params.related(list(query.include), ENVIRONMENT_RELATED)
    store = _store(request)
    async with store.connection() as conn:
        rows = await store.list_environments(conn, account_id, None)
    rows = [r for r in rows if (not project_ids or r.project_id in project_ids) and which.keeps(r)]
    echoed = {
        "project_id__in": list(project_ids) or None,
        "type": which.type,
        "dbt_version__in": list(which.dbt_versions) or None,
        "deployment_type__in": list(which.deployment_types) or None,
        "connection_id": which.connection_id,
        "credentials_id": which.credentials_id,
    }
    page, extra = _listed(rows, query, echoed)
    return ListEnvelope[shapes.Environment](status=success(), data=[shapes.environment(r) for r in page], extra=extra)


def project_ids_query(
    project_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    project_id__in: Annotated[str | None, Query(max_length=2000, description="Project ids, e.g. [1,2].")] = None,
) -> tuple[int, ...]:
    return params.ids(project_id__in, "project_id__in") + ((project_id,) if project_id is not None else ())


ProjectIds = Annotated[tuple[int, ...], Depends(project_ids_query)]


@router.get("/api/v3/accounts/{account_id}/environments/", summary="List environments")
async def list_environments(
    request: Request, account_id: Account, query: Listing, which: Environments, project_ids: ProjectIds
) -> ListEnvelope[shapes.Environment]:
    return await _environments(request, account_id, project_ids, query, which)


@router.get("/api/v2/accounts/{account_id}/environments/", summary="List environments (v2)")
async def list_environments_v2(
    request: Request, account_id: Account, query: Listing, which: Environments, project_ids: ProjectIds
) -> ListEnvelope[shapes.Environment]:
    listed = await _environments(request, account_id, project_ids, query, which)
    return listed.model_copy(update={"data": [e.as_v2() for e in listed.data]})


@router.get(
    "/api/v3/accounts/{account_id}/projects/{project_id}/environments/", summary="List environments in a project"
)
async def list_project_environments(
    request: Request, account_id: Account, project_id: ProjectPath, query: Listing, which: Environments
) -> ListEnvelope[shapes.Environment]:
    store = _store(request)
    async with store.connection() as conn:
        await existing_project(store, conn, account_id, project_id)
    return await _environments(request, account_id, (project_id,), query, which)


@router.post(
    "/api/v3/accounts/{account_id}/projects/{project_id}/environments/",
    summary="Create an environment",
)
async def create_environment(
    request: Request,
    response: Response,
    account_id: Account,
    project_id: ProjectPath,
    body: Annotated[EnvironmentBody, Body()],
) -> Envelope[shapes.Environment]:
    params.same_account(body.account_id, account_id)
    if body.project_id is not None and body.project_id != project_id:
        raise InvalidArgument("project_id", f"names project {body.project_id}; the URL names project {project_id}")
    store = _store(request)
    async with store.connection() as conn:
        await existing_project(store, conn, account_id, project_id)
    extras = _extras(body, None)
    fields = _environment_request(body, None, await _linked(request, account_id, project_id, body))
    request_pb = projects_pb2.CreateEnvironmentRequest(project_id=project_id, **fields)
    with params.named_as(ENVIRONMENT_NAMES):
        row = await use.create_environment(
            store,
            _keys(request),
            params.dbt_versions(request),
            account_id,
            request_pb,
            warehouses=params.warehouses(request),
            extras=extras,
        )
    params.tag(response, row.version)
    return Envelope[shapes.Environment](status=success(), data=shapes.environment(row))


@router.post("/api/v2/accounts/{account_id}/environments/", summary="Create an environment (v2)")
async def create_environment_v2(
    request: Request, response: Response, account_id: Account, body: Annotated[EnvironmentBody, Body()]
) -> Envelope[shapes.Environment]:
    """v2 names the project in the body."""
    if body.project_id is None:
        raise InvalidArgument("project_id", "is required")
    return _v2(await create_environment(request, response, account_id, body.project_id, body))


def _v2(answer: Envelope[shapes.Environment]) -> Envelope[shapes.Environment]:
    return answer.model_copy(update={"data": answer.data.as_v2()})


async def _project_environment(
    request: Request, account_id: AccountId, project_id: int, environment_id: int
) -> Environment:
    """The environment, when it is in the project; else 404 like a missing one."""
    store = _store(request)
    async with store.connection() as conn:
        row = await existing_environment(store, conn, account_id, environment_id)
    if row.project_id != project_id:
        raise NotFound(f"environment {environment_id} not found in project {project_id}")
    return row


EnvironmentPaths = "/api/v3/accounts/{account_id}/projects/{project_id}/environments/{environment_id}/"


V2EnvironmentPath = "/api/v2/accounts/{account_id}/environments/{environment_id}/"


async def _project_of(request: Request, account_id: AccountId, environment_id: int) -> int:
    """The project of an environment v2 names by its id alone."""
    store = _store(request)
    async with store.connection() as conn:
        return int((await existing_environment(store, conn, account_id, environment_id)).project_id)


@router.get(EnvironmentPaths, summary="Get an environment")
async def get_environment(
    request: Request, response: Response, account_id: Account, project_id: ProjectPath, environment_id: EnvironmentPath
) -> Envelope[shapes.Environment]:
    row = await _project_environment(request, account_id, project_id, environment_id)
    params.tag(response, row.version)
    return Envelope[shapes.Environment](status=success(), data=shapes.environment(row))


@router.get(V2EnvironmentPath, summary="Get an environment (v2)")
async def get_environment_v2(
    request: Request, response: Response, account_id: Account, environment_id: EnvironmentPath
) -> Envelope[shapes.Environment]:
    project_id = await _project_of(request, account_id, environment_id)
    return _v2(await get_environment(request, response, account_id, project_id, environment_id))


@router.post(EnvironmentPaths, summary="Update an environment")
async def update_environment(
    request: Request,
    response: Response,
    account_id: Account,
    project_id: ProjectPath,
    environment_id: EnvironmentPath,
    *,
    body: Annotated[EnvironmentBody, Body()],
    if_match: IfMatch = None,
) -> Envelope[shapes.Environment]:
    """Changes what the body names; a secret not sent keeps its value, ``clear_secrets`` removes some.
    With ``If-Match`` the stored fields the body leaves out are the ones read at that version, or 409."""
    params.same_account(body.account_id, account_id)
    if body.project_id is not None and body.project_id != project_id:
        raise InvalidArgument("project_id", "an environment stays in its project")
    version = params.expected_version(if_match)
    current = await _project_environment(request, account_id, project_id, environment_id)
    extras = _extras(body, current)
    fields = _environment_request(body, current, await _linked(request, account_id, project_id, body))
    request_pb = projects_pb2.UpdateEnvironmentRequest(
        environment_id=environment_id, clear_secret_fields=body.clear_secrets, expected_version=version, **fields
    )
    with params.named_as(ENVIRONMENT_NAMES):
        row = await use.update_environment(
            _store(request),
            _keys(request),
            params.dbt_versions(request),
            account_id,
            request_pb,
            warehouses=params.warehouses(request),
            extras=extras,
        )
    params.tag(response, row.version)
    return Envelope[shapes.Environment](status=success(), data=shapes.environment(row))


@router.post(V2EnvironmentPath, summary="Update an environment (v2)")
async def update_environment_v2(
    request: Request,
    response: Response,
    account_id: Account,
    environment_id: EnvironmentPath,
    *,
    body: Annotated[EnvironmentBody, Body()],
    if_match: IfMatch = None,
) -> Envelope[shapes.Environment]:
    project_id = await _project_of(request, account_id, environment_id)
    return _v2(
        await update_environment(
            request, response, account_id, project_id, environment_id, body=body, if_match=if_match
        )
    )


@router.delete(EnvironmentPaths, summary="Delete an environment")
async def delete_environment(
    request: Request, account_id: Account, project_id: ProjectPath, environment_id: EnvironmentPath
) -> Envelope[shapes.Environment]:
    """Refused (409) while a job uses it; 200 with the deleted environment (state 2), as a job's delete."""
    row = await _project_environment(request, account_id, project_id, environment_id)
    await use.delete_environment(_store(request), account_id, environment_id)
    deleted = shapes.environment(row).model_copy(update={"state": shapes.DELETED})
    return Envelope[shapes.Environment](status=success(), data=deleted)


@router.delete(V2EnvironmentPath, summary="Delete an environment (v2)")
async def delete_environment_v2(
    request: Request, account_id: Account, environment_id: EnvironmentPath
) -> Envelope[shapes.Environment]:
    project_id = await _project_of(request, account_id, environment_id)
    return _v2(await delete_environment(request, account_id, project_id, environment_id))
