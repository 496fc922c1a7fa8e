"""Operator tasks behind ``runplane admin``: accounts, their settings, and tokens."""

from __future__ import annotations

import logging

from api.auth import token_prefix
from api.scopes import parse_scopes
from api.store import Store
from api.validation import bounded, text
from runplane.adapters.db import Connection, open_pool
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.settings import Settings
from runplane.basics.tokens import new_api_token, token_hash
from runplane.basics.types import AccountId

log = logging.getLogger(__name__)

MAX_RUN_SLOTS = 10_000
MAX_MEMORY_MB = 1024 * 1024
MAX_DEACTIVATE_AFTER_FAILURES = 1_000_000
MAX_AGE_DAYS = 3650


async def create_account(settings: Settings, *, name: str, run_slots: int, memory_mb: int) -> tuple[int, str]:
    """A new account and its first token."""
    text(name.strip(), "name", max_length=200, required=True)
    bounded(run_slots, "run_slots", 0, MAX_RUN_SLOTS)
    bounded(memory_mb, "memory_mb", 1, MAX_MEMORY_MB)
    pool = await open_pool(settings.database_url, max_size=1, name="admin")
    try:
        store = Store(pool)
        async with store.transaction() as conn:
            account_id = await store.insert_account(conn, name=name.strip(), run_slots=run_slots, memory_mb=memory_mb)
            token = await issue_token(store, conn, account_id)
    finally:
        await pool.close()
    log.info("account created", extra={"account_id": account_id})
    return account_id, token


async def create_token(
    settings: Settings,
    *,
    account_id: int,
    name: str = "",
    scopes: tuple[str, ...] = ("account_admin",),
    expires_in_days: int | None = None,
) -> str:
    """A new token for an existing account (NotFound otherwise), with a name, scopes and an optional expiry."""
    text(name, "name", max_length=200)
    scopes = parse_scopes(scopes)
    if expires_in_days is not None:
        bounded(expires_in_days, "expires_in_days", 1, 3650)
    pool = await open_pool(settings.database_url, max_size=1, name="admin")
    try:
        store = Store(pool)
        async with store.transaction() as conn:
            if not await store.account_exists(conn, account_id):
                raise NotFound(f"account {account_id} not found")
            return await issue_token(
                store, conn, AccountId(account_id), name=name, scopes=scopes, expires_in_days=expires_in_days
            )
    finally:
        await pool.close()


async def update_account_settings(
    settings: Settings,
    *,
    account_id: int,
    deactivate_after_failures: int | None = None,
    pull_request_schema_max_age_days: int | None = None,
    run_retention_days: int | None = None,
) -> dict[str, object]:
    """Change an account's settings (None keeps a setting); the account's settings as they are now."""
    if deactivate_after_failures is not None:
        bounded(deactivate_after_failures, "deactivate_after_failures", 0, MAX_DEACTIVATE_AFTER_FAILURES)
    if pull_request_schema_max_age_days is not None:
        bounded(pull_request_schema_max_age_days, "pull_request_schema_max_age_days", 0, MAX_AGE_DAYS)
    if run_retention_days is not None:
        bounded(run_retention_days, "run_retention_days", 0, MAX_AGE_DAYS)
    pool = await open_pool(settings.database_url, max_size=1, name="admin")
    try:
        store = Store(pool)
        async with store.transaction() as conn:
            row = await store.update_account_settings(
                conn,
                AccountId(account_id),
                deactivate_after_failures=deactivate_after_failures,
                pull_request_schema_max_age_days=pull_request_schema_max_age_days,
                run_retention_days=run_retention_days,
            )
    finally:
        await pool.close()
    if row is None:
        raise NotFound(f"account {account_id} not found")
    log.info("account settings changed", extra={"account_id": account_id})
    return {
        "account_id": row.id,
        "deactivate_after_failures": row.deactivate_after_failures,
        "pull_request_schema_max_age_days": row.pull_request_schema_max_age_days,
        "run_retention_days": row.run_retention_days,
    }


async def revoke_token(settings: Settings, *, token_id: int | None = None, token: str | None = None) -> int:
    """Revoke a token by its id or by the token itself; its account id. Effective on the next call."""
    if (token_id is None) == (token is None):
        raise InvalidArgument("token", "name the token by --id or by --token, one of them")
    pool = await open_pool(settings.database_url, max_size=1, name="admin")
    try:
        store = Store(pool)
        async with store.transaction() as conn:
            row = await store.revoke_token(
                conn, token_id=token_id, token_hash=token_hash(token) if token is not None else None
            )
    finally:
        await pool.close()
    if row is None:
        raise NotFound("no such token, or it was revoked already")
    log.info("token revoked", extra={"account_id": row.account_id, "token_id": row.id})
    return int(row.account_id)


async def issue_token(
    store: Store,
    conn: Connection,
    account_id: AccountId,
    *,
    name: str = "",
    scopes: tuple[str, ...] = ("account_admin",),
    expires_in_days: int | None = None,
) -> str:
    token = new_api_token()
    await store.insert_token(
        conn,
        account_id=account_id,
        token_hash=token_hash(token),
        prefix=token_prefix(token),
        name=name,
        scopes=scopes,
        expires_in_days=expires_in_days,
    )
    return token
