"""Warehouse connections and credentials made on their own, as dbt Cloud's v3 API makes them, and
the environment connection they make together.

A connection is the account's: an adapter and its details, never a secret. Credentials are a
project's: more details (the user), the secret fields (encrypted with the box, as an environment's
are, and never returned), the schema, threads and target. Each part is checked on its own here
(its fields are fields of its adapter); whether both together make a whole connection is checked
when an environment is saved with them, as for one given inline. An environment named with a
connection and credentials gets the connection it would get inline: the same details, secrets,
schema, threads and target, copied at that save (a later change to either reaches it at its next
save).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from api.lookup import existing_project
from api.project_definitions import BoxOf
from api.projects_validation import CredentialsValues
from api.rows import Credentials, WarehouseConnection
from api.store import Store
from api.validation import text
from runplane.adapters.db import Connection
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.types import AccountId
from runplane.dbt import fields as dbt_fields
from runplane.dbt.connections import ConnectionFieldError, check_secret_fields, profile_field_problems
from runplane.v1 import projects_pb2

log = logging.getLogger(__name__)
MAX_FIELD_VALUE = 1024
MAX_SECRET = 16 * 1024


def _details(adapter_type: str, details: Mapping[str, str], where: str) -> dict[str, str]:
    """The details, each a field of the adapter; a required one may be in the other part."""
    try:
        refused = [p for p in profile_field_problems(adapter_type, details) if p.reason != "is required"]
    except ConnectionFieldError as exc:
        raise InvalidArgument("type", exc.reason) from None
    if refused:
        raise InvalidArgument(where + refused[0].field.removeprefix("fields"), refused[0].reason)
    return {k: text(v, f"{where}[{k}]", max_length=MAX_FIELD_VALUE) for k, v in details.items()}


async def create_connection(
    store: Store, account_id: AccountId, *, name: str, adapter_type: str, details: Mapping[str, str]
) -> WarehouseConnection:
    name = text(name.strip(), "name", max_length=200, required=True)
    checked = _details(adapter_type, details, "config")
    async with store.transaction() as conn:
        row = await store.insert_connection(conn, account_id, name, adapter_type, checked)
    log.info("connection created", extra={"account_id": account_id, "connection_id": row.id})
    return row


async def update_connection(
    store: Store, account_id: AccountId, connection_id: int, *, name: str | None, details: Mapping[str, str]
) -> WarehouseConnection:
    """The connection with the details sent changed (an empty value removes one), the rest kept."""
    async with store.transaction() as conn:
        current = await existing_connection(store, conn, account_id, connection_id)
        merged = {k: v for k, v in {**current.details, **details}.items() if v != ""}
        checked = _details(current.adapter_type, merged, "config")
        new_name = text((name if name is not None else current.name).strip(), "name", max_length=200, required=True)
        row = await store.update_connection(conn, account_id, connection_id, new_name, checked)
        assert row is not None  # found above, in this transaction
    log.info("connection updated", extra={"account_id": account_id, "connection_id": connection_id})
    return row


async def delete_connection(store: Store, account_id: AccountId, connection_id: int) -> None:
    """The connection is gone; environments made from it keep the connection they copied."""
    async with store.transaction() as conn:
        await existing_connection(store, conn, account_id, connection_id)
        await store.delete_connection(conn, account_id, connection_id)
    log.info("connection deleted", extra={"account_id": account_id, "connection_id": connection_id})


async def existing_connection(
    store: Store, conn: Connection, account_id: AccountId, connection_id: int
) -> WarehouseConnection:
    row = await store.get_connection(conn, account_id, connection_id)
    if row is None:
        raise NotFound(f"connection {connection_id} not found")
    return row


@dataclass(frozen=True)
class CredentialsRequest:
    """What a create or an update of credentials sends; None: not sent (an update keeps it)."""

    adapter_type: str
    details: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)  # an empty value removes one
    schema: str | None = None
    threads: int | None = None
    target_name: str | None = None


def _credentials_values(
    box: BoxOf, project_id: int, request: CredentialsRequest, current: Credentials | None
) -> CredentialsValues:
    details = {k: v for k, v in {**(current.details if current else {}), **request.details}.items() if v != ""}
    checked = _details(request.adapter_type, details, "details")
    try:
        check_secret_fields(request.adapter_type, request.secrets)
    except ConnectionFieldError as exc:
        raise InvalidArgument(exc.field.replace("secret_fields", "secrets"), exc.reason) from None
    secrets = dict(current.secrets) if current else {}
    for name, value in request.secrets.items():
        if value:
            secrets[name] = box().encrypt(text(value, f"secrets[{name}]", max_length=MAX_SECRET, single_line=False))
        else:
            secrets.pop(name, None)
    schema = request.schema if request.schema is not None else current.schema_name if current else ""
    target = request.target_name if request.target_name is not None else current.target_name if current else ""
    threads = request.threads if request.threads is not None else current.threads if current else 0
    return CredentialsValues(
        project_id=project_id,
        adapter_type=request.adapter_type,
        details=checked,
        secrets=secrets,
        schema_name=dbt_fields.schema(text(schema.strip(), "schema", max_length=63, required=True)),
        threads=dbt_fields.threads(threads) or dbt_fields.DEFAULT_THREADS,
        target_name=dbt_fields.target_name(target.strip() or dbt_fields.DEFAULT_TARGET_NAME),
    )


async def create_credentials(
    store: Store, box: BoxOf, account_id: AccountId, project_id: int, request: CredentialsRequest
) -> Credentials:
    values = _credentials_values(box, project_id, request, None)
    async with store.transaction() as conn:
        await existing_project(store, conn, account_id, project_id)
        row = await store.insert_credentials(conn, account_id, values)
    log.info("credentials created", extra={"account_id": account_id, "project_id": project_id})
    return row


async def update_credentials(
    store: Store, box: BoxOf, account_id: AccountId, credentials: Credentials, request: CredentialsRequest
) -> Credentials:
    """The credentials with what ``request`` sends changed; the adapter stays the stored one."""
    if request.adapter_type != credentials.adapter_type:
        raise InvalidArgument("type", f"credentials stay of their adapter ({credentials.adapter_type})")
    values = _credentials_values(box, int(credentials.project_id), request, credentials)
    async with store.transaction() as conn:
        row = await store.update_credentials(conn, account_id, int(credentials.id), values)
    if row is None:
        raise NotFound(f"credentials {credentials.id} not found")
    log.info("credentials updated", extra={"account_id": account_id, "credentials_id": credentials.id})
    return row


async def delete_credentials(store: Store, account_id: AccountId, credentials_id: int) -> None:
    """The credentials are gone, their secrets forgotten; environments made from them keep their copy."""
    async with store.transaction() as conn:
        await store.delete_credentials(conn, account_id, credentials_id)
    log.info("credentials deleted", extra={"account_id": account_id, "credentials_id": credentials_id})


@dataclass(frozen=True)
class EnvironmentConnection:
    """What an environment made from a connection and credentials takes from them."""

    connection: projects_pb2.Connection = field(repr=False)  # secret fields in plain text, to be sealed again
    schema: str
    threads: int
    target_name: str


async def environment_connection(
    store: Store, box: BoxOf, account_id: AccountId, project_id: int, *, connection_id: int, credentials_id: int
) -> EnvironmentConnection:
    """The connection an environment of the project gets from the account's connection and the
    project's credentials; another account's, or another project's credentials, are not found."""
    async with store.connection() as conn:
        connection = await store.get_connection(conn, account_id, connection_id)
        credentials = await store.get_credentials(conn, account_id, credentials_id)
    if connection is None:
        raise InvalidArgument("connection_id", f"connection {connection_id} not found")
    if credentials is None or credentials.project_id != project_id:
        raise InvalidArgument("credentials_id", f"credentials {credentials_id} not found in project {project_id}")
    if credentials.adapter_type != connection.adapter_type:
        raise InvalidArgument(
            "credentials_id",
            f"are {credentials.adapter_type} credentials; connection {connection_id} is {connection.adapter_type}",
        )
    secrets = {name: box().decrypt(value) for name, value in credentials.secrets.items()}
    return EnvironmentConnection(
        connection=projects_pb2.Connection(
            adapter_type=connection.adapter_type,
            fields={**connection.details, **credentials.details},
            secret_fields=secrets,
        ),
        schema=credentials.schema_name,
        threads=credentials.threads,
        target_name=credentials.target_name,
    )
