"""Warehouse connections (the account's: details, no secrets) and credentials (a project's: the
secret part, the schema, threads and target), as dbt Cloud's v3 API makes them: create, list, get,
update, delete. An environment named with ``connection_id`` and ``credentials_id`` gets the
connection it would get inline (``api.warehouse_definitions``).

Secrets are write-only: encrypted as an environment's, never in an answer, which names those set.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated

from fastapi import APIRouter, Body, Path, Request
from pydantic import BaseModel, Field

from api import warehouse_definitions as use
from api.lookup import existing_project
from api.rest import params, shapes
from api.rest.auth import Account
from api.rest.envelope import ERROR_RESPONSES, Envelope, Extra, ListEnvelope, Pagination, success
from api.rest.projects import MAX_LIMIT, Limit, Offset, ProjectPath, _keys, _store
from api.rows import Credentials, WarehouseConnection
from api.store import Store
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.types import AccountId

router = APIRouter(responses=ERROR_RESPONSES)
IdPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="Numeric id")]
Connections = "/api/v3/accounts/{account_id}/connections/"
CredentialsPaths = "/api/v3/accounts/{account_id}/projects/{project_id}/credentials/"
# dbt Cloud's names of connection details, as dbt's profile names them.
PROFILE_NAMES = {"hostname": "host"}
Details = dict[str, str | int | bool]


def _profile_fields(details: Details) -> dict[str, str]:
    return {PROFILE_NAMES.get(k, k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in details.items()}


class ConnectionBody(BaseModel):
    account_id: int | None = None
    name: str | None = Field(None, max_length=200)
    adapter_version: str | None = Field(None, max_length=60, description="e.g. postgres_v0: the adapter, then _v0.")
    type: str | None = Field(None, max_length=40, description="The adapter, when adapter_version is not sent.")
    config: Details = Field(default_factory=dict, max_length=50, description="The details: no secret here.")


def _adapter(body: ConnectionBody) -> str:
    named = body.type or (body.adapter_version or "").rpartition("_v")[0] or body.adapter_version
    if not named:
        raise InvalidArgument("adapter_version", "is required (e.g. postgres_v0)")
    return named


def _page(data: list[shapes.AccountConnection] | list[shapes.ProjectCredentials], offset: int, limit: int) -> Extra:
    return Extra(
        filters={"limit": limit, "offset": offset},
        order_by="id",
        pagination=Pagination(count=len(data[offset : offset + limit]), total_count=len(data)),
    )


async def _answer(store: Store, account_id: AccountId, row: WarehouseConnection) -> shapes.AccountConnection:
    """The connection as an answer shows it, with the number of environments made from it."""
    async with store.connection() as conn:
        environments = await store.list_environments(conn, account_id, None)
    return shapes.account_connection(row, sum(e.connection_id == row.id for e in environments))


@router.post(Connections, summary="Create a connection")
async def create_connection(
    request: Request, account_id: Account, body: Annotated[ConnectionBody, Body()]
) -> Envelope[shapes.AccountConnection]:
    params.same_account(body.account_id, account_id)
    row = await use.create_connection(
        _store(request),
        account_id,
        name=body.name or "",
        adapter_type=_adapter(body),
        details=_profile_fields(body.config),
    )
    return Envelope[shapes.AccountConnection](status=success(), data=shapes.account_connection(row, 0))


@router.get(Connections, summary="List connections")
async def list_connections(
    request: Request, account_id: Account, offset: Offset = 0, limit: Limit = MAX_LIMIT
) -> ListEnvelope[shapes.AccountConnection]:
    params.only_known(request.query_params, frozenset())
    store = _store(request)
    async with store.connection() as conn:
        rows = await store.list_connections(conn, account_id)
        environments = await store.list_environments(conn, account_id, None)
    using = Counter(e.connection_id for e in environments)
    data = [shapes.account_connection(r, using[r.id]) for r in rows]
    return ListEnvelope[shapes.AccountConnection](
        status=success(), data=data[offset : offset + limit], extra=_page(data, offset, limit)
    )


@router.get(f"{Connections}{{connection_id}}/", summary="Get a connection")
async def get_connection(
    request: Request, account_id: Account, connection_id: IdPath
) -> Envelope[shapes.AccountConnection]:
    store = _store(request)
    async with store.connection() as conn:
        row = await use.existing_connection(store, conn, account_id, connection_id)
    return Envelope[shapes.AccountConnection](status=success(), data=await _answer(store, account_id, row))


@router.patch(f"{Connections}{{connection_id}}/", summary="Update a connection")
async def update_connection(
    request: Request, account_id: Account, connection_id: IdPath, body: Annotated[ConnectionBody, Body()]
) -> Envelope[shapes.AccountConnection]:
    """Changes the name and the details sent (an empty value removes one); the adapter stays."""
    params.same_account(body.account_id, account_id)
    store = _store(request)
    row = await use.update_connection(
        store, account_id, connection_id, name=body.name, details=_profile_fields(body.config)
    )
    return Envelope[shapes.AccountConnection](status=success(), data=await _answer(store, account_id, row))


@router.delete(f"{Connections}{{connection_id}}/", summary="Delete a connection")
async def delete_connection(
    request: Request, account_id: Account, connection_id: IdPath
) -> Envelope[shapes.AccountConnection]:
    """200 with the deleted connection (state 2), as a project's delete answers."""
    store = _store(request)
    async with store.connection() as conn:
        row = await use.existing_connection(store, conn, account_id, connection_id)
    answer = await _answer(store, account_id, row)
    await use.delete_connection(store, account_id, connection_id)
    deleted = answer.model_copy(update={"state": shapes.DELETED})
    return Envelope[shapes.AccountConnection](status=success(), data=deleted)


class CredentialsBody(BaseModel):
    account_id: int | None = None
    project_id: int | None = None
    type: str | None = Field(None, max_length=40, description="The adapter: postgres, ...")
    username: str | None = Field(None, max_length=1024, description="The user (details' user).")
    password: str | None = Field(None, max_length=16384, description="Write-only (secrets' password).")
    default_schema: str | None = Field(None, max_length=63)
    schema_: str | None = Field(None, alias="schema", max_length=63)
    threads: int | None = Field(None, ge=1, le=64)
    target_name: str | None = Field(None, max_length=64)
    details: Details = Field(default_factory=dict, max_length=50, description="More details: no secret here.")
    secrets: dict[str, str] = Field(
        default_factory=dict, max_length=20, description="Write-only secret fields; an empty one is removed."
    )


def _credentials_request(body: CredentialsBody, adapter_type: str | None) -> use.CredentialsRequest:
    adapter = body.type or adapter_type
    if not adapter:
        raise InvalidArgument("type", "is required (the adapter: postgres, ...)")
    details = _profile_fields(body.details)
    if body.username is not None:
        details["user"] = body.username
    secrets = dict(body.secrets)
    if body.password is not None:
        secrets["password"] = body.password
    return use.CredentialsRequest(
        adapter_type=adapter,
        details=details,
        secrets=secrets,
        schema=body.default_schema if body.default_schema is not None else body.schema_,
        threads=body.threads,
        target_name=body.target_name,
    )


async def _credentials(store: Store, account_id: AccountId, project_id: int, credentials_id: int) -> Credentials:
    """The credentials, when they are the project's; else 404 like missing ones."""
    async with store.connection() as conn:
        await existing_project(store, conn, account_id, project_id)
        row = await store.get_credentials(conn, account_id, credentials_id)
    if row is None or row.project_id != project_id:
        raise NotFound(f"credentials {credentials_id} not found in project {project_id}")
    return row


def _same_project(body: CredentialsBody, project_id: int) -> None:
    if body.project_id is not None and body.project_id != project_id:
        raise InvalidArgument("project_id", f"names project {body.project_id}; the URL names project {project_id}")


@router.post(CredentialsPaths, summary="Create credentials")
async def create_credentials(
    request: Request, account_id: Account, project_id: ProjectPath, body: Annotated[CredentialsBody, Body()]
) -> Envelope[shapes.ProjectCredentials]:
    params.same_account(body.account_id, account_id)
    _same_project(body, project_id)
    row = await use.create_credentials(
        _store(request), _keys(request), account_id, project_id, _credentials_request(body, None)
    )
    return Envelope[shapes.ProjectCredentials](status=success(), data=shapes.project_credentials(row))


@router.get(CredentialsPaths, summary="List credentials")
async def list_credentials(
    request: Request, account_id: Account, project_id: ProjectPath, offset: Offset = 0, limit: Limit = MAX_LIMIT
) -> ListEnvelope[shapes.ProjectCredentials]:
    params.only_known(request.query_params, frozenset())
    store = _store(request)
    async with store.connection() as conn:
        await existing_project(store, conn, account_id, project_id)
        rows = await store.list_credentials(conn, account_id, project_id)
    data = [shapes.project_credentials(r) for r in rows]
    return ListEnvelope[shapes.ProjectCredentials](
        status=success(), data=data[offset : offset + limit], extra=_page(data, offset, limit)
    )


@router.get(f"{CredentialsPaths}{{credentials_id}}/", summary="Get credentials")
async def get_credentials(
    request: Request, account_id: Account, project_id: ProjectPath, credentials_id: IdPath
) -> Envelope[shapes.ProjectCredentials]:
    row = await _credentials(_store(request), account_id, project_id, credentials_id)
    return Envelope[shapes.ProjectCredentials](status=success(), data=shapes.project_credentials(row))


@router.post(f"{CredentialsPaths}{{credentials_id}}/", summary="Update credentials")
@router.patch(f"{CredentialsPaths}{{credentials_id}}/", summary="Update credentials (partly)")
async def update_credentials(
    request: Request,
    account_id: Account,
    project_id: ProjectPath,
    credentials_id: IdPath,
    body: Annotated[CredentialsBody, Body()],
) -> Envelope[shapes.ProjectCredentials]:
    """Changes what the body sends; a secret not sent keeps its value, one sent empty is removed."""
    params.same_account(body.account_id, account_id)
    _same_project(body, project_id)
    store = _store(request)
    current = await _credentials(store, account_id, project_id, credentials_id)
    row = await use.update_credentials(
        store, _keys(request), account_id, current, _credentials_request(body, current.adapter_type)
    )
    return Envelope[shapes.ProjectCredentials](status=success(), data=shapes.project_credentials(row))


@router.delete(f"{CredentialsPaths}{{credentials_id}}/", summary="Delete credentials")
async def delete_credentials(
    request: Request, account_id: Account, project_id: ProjectPath, credentials_id: IdPath
) -> Envelope[shapes.ProjectCredentials]:
    """200 with the deleted credentials (state 2), as a project's delete answers."""
    store = _store(request)
    row = await _credentials(store, account_id, project_id, credentials_id)
    await use.delete_credentials(store, account_id, credentials_id)
    deleted = shapes.project_credentials(row).model_copy(update={"state": shapes.DELETED})
    return Envelope[shapes.ProjectCredentials](status=success(), data=deleted)
