"""Operator tasks behind ``runplane admin``: accounts and tokens, and the demo of ``make run``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from api.auth import new_token, token_hash, token_prefix
from api.projects_validation import EnvironmentSpec, ProjectSpec
from api.scopes import parse_scopes
from api.store import Store
from api.validation import CompletionTriggerSpec, JobSpec, bounded, text
from runplane.adapters.db import Connection, open_pool
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.settings import Settings
from runplane.basics.types import AccountId, JobId, JobType, RunStatus

log = logging.getLogger(__name__)

MAX_RUN_SLOTS = 10_000
MAX_MEMORY_MB = 1024 * 1024
MAX_DEACTIVATE_AFTER_FAILURES = 1_000_000
MAX_AGE_DAYS = 3650

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
        "account_id": row["id"],
        "deactivate_after_failures": row["deactivate_after_failures"],
        "pull_request_schema_max_age_days": row["pull_request_schema_max_age_days"],
        "run_retention_days": row["run_retention_days"],
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
    log.info("token revoked", extra={"account_id": row["account_id"], "token_id": row["id"]})
    return int(row["account_id"])


async def seed_demo(settings: Settings, name: str, project: DemoProject | None = None) -> tuple[int, str, list[int]]:
    """The demo account (reused by name), a fresh token and the demo jobs (made once), with the dbt
    project, its environment and dbt jobs when ``project`` is given."""
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
            if project is not None:
                job_ids += await _seed_dbt_demo(store, conn, account_id, project)
    finally:
        await pool.close()
    return account_id, token, job_ids


@dataclass(frozen=True)
class DemoProject:
    """Where the demo's dbt project and its warehouse are (made by ``runplane.commands.demo``)."""

    repository_url: str
    warehouse: dict[str, str]  # postgres profile fields: host, port, user, dbname
    dbt_version: str


DEMO_PROJECT_NAME = "jaffle_shop"
DEMO_ENVIRONMENT_NAME = "production"


def demo_dbt_jobs(environment_id: int, build_job_id: int | None) -> list[JobSpec]:
    """The demo's dbt jobs: a scheduled build, a CI job, and one chained to the build's success."""
    jobs = [
        JobSpec(
            name="jaffle-build",
            job_type=JobType.DEPLOY,
            steps=["dbt build", "dbt docs generate", "dbt source freshness"],
            cron="*/10 * * * *",
            timezone="UTC",
            environment_id=environment_id,
            threads=0,
        ),
        JobSpec(
            name="jaffle-ci",
            job_type=JobType.CI,
            steps=["dbt build"],
            on_pull_request=True,
            environment_id=environment_id,
            threads=0,
        ),
    ]
    if build_job_id is not None:
        jobs.append(
            JobSpec(
                name="jaffle-after-build",
                job_type=JobType.DEPLOY,
                steps=["dbt test --select customers orders"],
                on_completion=[CompletionTriggerSpec(JobId(build_job_id), (RunStatus.SUCCESS,))],
                environment_id=environment_id,
                threads=0,
            )
        )
    return jobs


async def _seed_dbt_demo(store: Store, conn: Connection, account_id: AccountId, project: DemoProject) -> list[int]:
    """The demo's project, environment and dbt jobs, each made once (found by name after that)."""
    projects = [p for p in await store.list_projects(conn, account_id) if p["name"] == DEMO_PROJECT_NAME]
    if projects:
        project_id = projects[0]["id"]
    else:
        project_spec = ProjectSpec(DEMO_PROJECT_NAME, project.repository_url, "", "none", "")
        project_id = (await store.insert_project(conn, account_id, project_spec, ""))["id"]
    environments = [
        e for e in await store.list_environments(conn, account_id, project_id) if e["name"] == DEMO_ENVIRONMENT_NAME
    ]
    if environments:
        environment_id = environments[0]["id"]
    else:
        environment = EnvironmentSpec(
            project_id=project_id,
            name=DEMO_ENVIRONMENT_NAME,
            environment_type="deployment",
            dbt_version=project.dbt_version,
            git_branch="main",
            adapter_type="postgres",
            connection=project.warehouse,
            connection_secrets={},
            target_name="prod",
            schema="analytics",
            threads=4,
            variables={"DBT_DEMO": "runplane"},
        )
        environment_id = (await store.insert_environment(conn, account_id, environment, {}))["id"]
    job_ids: list[int] = []
    build_job_id: int | None = None
    for spec in demo_dbt_jobs(environment_id, None)[:1]:
        build_job_id = await _job_once(store, conn, account_id, spec)
        job_ids.append(build_job_id)
    for spec in demo_dbt_jobs(environment_id, build_job_id)[1:]:
        job_id = await _job_once(store, conn, account_id, spec)
        await store.replace_completion_triggers(conn, JobId(job_id), spec)
        job_ids.append(job_id)
    return job_ids


async def _job_once(store: Store, conn: Connection, account_id: AccountId, spec: JobSpec) -> int:
    job = await store.job_by_name(conn, account_id, spec.name)
    if job is None:
        job, _ = await store.insert_job(conn, account_id, spec)
    return int(job["id"])


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
