"""Operator tasks behind ``runplane admin``: accounts and tokens, and the demo of ``make run``."""

from __future__ import annotations

import logging

from api.auth import new_token, token_hash, token_prefix
from api.scopes import parse_scopes
from api.store import Store
from api.validation import JobSpec, bounded, text
from runplane.db import Connection, open_pool
from runplane.errors import InvalidArgument, NotFound
from runplane.settings import Settings
from runplane.types import AccountId, JobType

log = logging.getLogger(__name__)

MAX_RUN_SLOTS = 10_000
MAX_MEMORY_MB = 1024 * 1024

DEMO_RUN_SLOTS = 2
DEMO_MEMORY_MB = 1024

# The demo jobs, by name; "run-now" comes first because the banner triggers it.
DEMO_JOBS = [
    JobSpec(
        name="run-now",
        job_type=JobType.DEPLOY,
        steps=[
            "echo start",
            "mkdir -p target && python3 -c \"import json; json.dump({'nodes': {'model.demo.orders': {}}}, "
            "open('target/manifest.json', 'w'))\"",
            "echo done",
        ],
    ),
    JobSpec(
        name="hourly-models",
        job_type=JobType.DEPLOY,
        steps=[
            "echo building models",
            'mkdir -p target && echo \'{"results": [{"status": "success"}]}\' > target/run_results.json',
        ],
        # Every minute, so whoever runs the demo sees the schedule fire.
        cron="* * * * *",
        timezone="UTC",
    ),
    JobSpec(
        name="pr-checks",
        job_type=JobType.CI,
        steps=["echo checking the pull request"],
        on_pull_request=True,
    ),
]


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
            token = await _issue_token(store, conn, account_id)
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
            return await _issue_token(
                store, conn, AccountId(account_id), name=name, scopes=scopes, expires_in_days=expires_in_days
            )
    finally:
        await pool.close()


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
    log.info("token revoked", extra={"account_id": row["account_id"], "token_id": row["id"]})
    return int(row["account_id"])


async def seed_demo(settings: Settings, name: str) -> tuple[int, str, list[int]]:
    """The demo account (reused by name), a fresh token and the demo jobs (made once)."""
    pool = await open_pool(settings.database_url, max_size=1, name="admin")
    try:
        store = Store(pool)
        async with store.transaction() as conn:
            account_id = await store.account_by_name(conn, name)
            if account_id is None:
                account_id = await store.insert_account(
                    conn, name=name, run_slots=DEMO_RUN_SLOTS, memory_mb=DEMO_MEMORY_MB
                )
            token = await _issue_token(store, conn, account_id)
            job_ids: list[int] = []
            for spec in DEMO_JOBS:
                job = await store.job_by_name(conn, account_id, spec.name)
                if job is None:
                    job, _ = await store.insert_job(conn, account_id, spec)
                job_ids.append(job["id"])
    finally:
        await pool.close()
    return account_id, token, job_ids


async def _issue_token(
    store: Store,
    conn: Connection,
    account_id: AccountId,
    *,
    name: str = "",
    scopes: tuple[str, ...] = ("account_admin",),
    expires_in_days: int | None = None,
) -> str:
    token = new_token()
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
