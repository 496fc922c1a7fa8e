"""The API's access to Postgres: every read and write, as named queries from ``queries.sql``.

Methods take the connection to use, so a caller can put several of them in one transaction
(``async with store.transaction() as conn``). Rows come back as the dataclasses of ``api.rows``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import scalar_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from api.projects_validation import CredentialsValues, EnvironmentExtras, EnvironmentSpec, ProjectSpec
from api.rows import (
    Account,
    Artifact,
    ArtifactWithContent,
    CompletionTrigger,
    Credentials,
    Environment,
    Job,
    JobMatch,
    JobName,
    JobWithEnvironment,
    LogChunk,
    OnTimeSplit,
    Project,
    Repository,
    RevokedToken,
    Run,
    RunListing,
    RunStep,
    RunWithEnvironment,
    SkippedOccurrence,
    TokenListing,
    Waiting,
    WarehouseConnection,
    WebhookListing,
)
from api.scopes import TokenGrant
from api.validation import JobSpec
from runplane.adapters.db import Connection, RowT, fetch_all, fetch_one, transaction
from runplane.basics.errors import Contention, FailedPrecondition, ServiceUnavailable
from runplane.basics.secrets import SecretBox
from runplane.basics.types import AccountId, JobId, RunId, RunStatus
from runplane.runs.transitions import TRANSITIONS
from runplane.sql import load_queries

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunFilters:
    """The filters of dbt Cloud's run list; None or empty means not filtered."""

    job_id: int | None = None
    statuses: tuple[RunStatus, ...] = ()
    environment_id: int | None = None
    project_ids: tuple[int, ...] = ()
    deferring_run_id: int | None = None
    run_ids: tuple[int, ...] = ()
    id_gt: int | None = None
    dbt_versions: tuple[str, ...] = ()
    has_docs: bool | None = None
    has_sources: bool | None = None
    created: tuple[datetime, datetime] | None = None  # both ends included
    finished: tuple[datetime, datetime] | None = None


@dataclass(frozen=True)
class JobFilters:
    """The filters of dbt Cloud's job list; ``deleted`` lists the deleted jobs instead of the live ones
    (None: both), ``scheduled`` the ones with (or without) a cron schedule."""

    environment_id: int | None = None
    project_ids: tuple[int, ...] = ()
    name_contains: str | None = None
    deleted: bool | None = False
    job_ids: tuple[int, ...] = ()
    id_gt: int | None = None
    dbt_versions: tuple[str, ...] = ()
    scheduled: bool | None = None


QUERIES = {**load_queries("api"), **TRANSITIONS}  # a run's status changes are runplane.runs'


class Store:
    """``box`` encrypts secret variables on their way in; without it a job cannot set one."""

    def __init__(self, pool: AsyncConnectionPool[Connection], box: SecretBox | None = None) -> None:
        self._pool = pool
        self._box = box

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        async with _database_errors(), transaction(self._pool) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A pooled connection in autocommit mode: each statement commits on its own."""
        async with _database_errors(), self._pool.connection() as conn:
            yield conn

    # accounts and tokens

    async def account_for_token(self, token_hash: bytes) -> TokenGrant | None:
        async with self.connection() as conn:
            row = await _one(conn, "account_for_token", _TokenScopes, token_hash=token_hash)
        return None if row is None else TokenGrant(row.account_id, frozenset(row.scopes), row.who)

    async def insert_account(self, conn: Connection, *, name: str, run_slots: int, memory_mb: int) -> AccountId:
        account_id = await _value(conn, "insert_account", name=name, run_slots=run_slots, memory_mb=memory_mb)
        assert account_id is not None
        return AccountId(account_id)

    async def account_by_name(self, conn: Connection, name: str) -> AccountId | None:
        account_id = await _value(conn, "account_by_name", name=name)
        return None if account_id is None else AccountId(account_id)

    async def account_exists(self, conn: Connection, account_id: int) -> bool:
        return bool(await _value(conn, "account_exists", account_id=account_id))

    async def insert_token(
        self,
        conn: Connection,
        *,
        account_id: AccountId,
        token_hash: bytes,
        prefix: str,
        name: str = "",
        scopes: tuple[str, ...] = ("account_admin",),
        expires_in_days: int | None = None,
    ) -> int:
        token_id = await _value(
            conn,
            "insert_token",
            account_id=account_id,
            token_hash=token_hash,
            token_prefix=prefix,
            name=name,
            scopes=list(scopes),
            expires_in_days=expires_in_days,
        )
        assert token_id is not None
        return int(token_id)

    async def revoke_token(
        self, conn: Connection, *, token_id: int | None, token_hash: bytes | None
    ) -> RevokedToken | None:
        return await _one(conn, "revoke_token", RevokedToken, token_id=token_id, token_hash=token_hash)

    def _job_params(self, spec: JobSpec) -> dict[str, Any]:
        return {
            "name": spec.name,
            "job_type": spec.job_type.value,
            "steps": spec.steps,
            "cron": spec.cron,
            "kept_cron": spec.kept_cron,
            "timezone": spec.timezone,
            "on_pull_request": spec.on_pull_request,
            "on_merge": spec.on_merge,
            "threads": spec.threads,
            "timeout_seconds": spec.timeout_seconds,
            "target_name": spec.target_name,
            "environment": Jsonb(spec.environment),
            "git_branch": spec.git_branch,
            "retry_max_attempts": spec.retry_max_attempts,
            "retry_on_step_failure": spec.retry_on_step_failure,
            "missed_run_grace_seconds": spec.missed_run_grace_seconds,
            "priority": spec.priority,
            "environment_id": spec.environment_id,
            "schema_name": spec.schema,
            "generate_docs": spec.generate_docs,
            "run_source_freshness": spec.run_source_freshness,
            "defer_to_job_id": spec.defer_to_job_id,
            "defer_to_environment_id": spec.defer_to_environment_id,
            "run_only_modified": spec.run_only_modified,
            "completion_mode": spec.completion_mode,
            "overlap_policy": spec.overlap_policy.value,
            "jitter_seconds": spec.jitter_seconds,
            "catchup_window_seconds": spec.catchup_window_seconds,
            "catchup_all": spec.catchup_all,
            **self._secret_variables(spec.secrets, spec.unset_secrets),
        }

    def _secret_variables(self, secrets: dict[str, str], unset: list[str]) -> dict[str, Any]:
        """The parameters that set and unset secret variables, of a job or an environment, one by one."""
        return {"set_secrets": Jsonb(self._sealed(secrets)), "unset_secrets": unset}

    def _sealed(self, secrets: dict[str, str]) -> dict[str, str]:
        """Secret values as ciphertext: the database never sees them."""
        if not secrets:
            return {}
        if self._box is None:
            raise FailedPrecondition("secret variables need RUNPLANE_SECRET_KEYS on the API server")
        return {name: self._box.encrypt(value) for name, value in secrets.items()}

    def _environment_fields(self, spec: EnvironmentSpec, secrets: dict[str, str]) -> dict[str, object]:
        """An environment's columns as the insert and the update write them (``secrets``: the
        connection's, encrypted)."""
        return {
            "name": spec.name,
            "environment_type": spec.environment_type,
            "dbt_version": spec.dbt_version,
            "git_branch": spec.git_branch,
            "adapter_type": spec.adapter_type,
            "connection": Jsonb(spec.connection),
            "connection_secrets": Jsonb(secrets),
            "target_name": spec.target_name,
            "schema_name": spec.schema,
            "threads": spec.threads,
            "variables": Jsonb(spec.variables.plain),
            **self._secret_variables(spec.variables.secrets, spec.variables.unset_secrets),
        }

    # jobs

    async def insert_job(
        self,
        conn: Connection,
        account_id: AccountId,
        spec: JobSpec,
        *,
        create_key: str | None = None,
        create_fingerprint: str | None = None,
    ) -> tuple[Job, bool]:
        """The new job and True; with a ``create_key`` used before, the job it created and False."""
        row = await _one(
            conn,
            "insert_job",
            Job,
            account_id=account_id,
            create_key=create_key,
            create_fingerprint=create_fingerprint,
            **self._job_params(spec),
        )
        if row is not None:
            return row, True
        existing = await _one(conn, "job_by_create_key", Job, account_id=account_id, create_key=create_key)
        assert existing is not None, "a create key conflicted with no row"
        return existing, False

    async def get_job(
        self, conn: Connection, account_id: AccountId, job_id: int, *, for_update: bool = False
    ) -> JobWithEnvironment | None:
        query = "get_job_for_update" if for_update else "get_job"
        return await _one(conn, query, JobWithEnvironment, account_id=account_id, job_id=job_id)

    async def job_by_name(self, conn: Connection, account_id: AccountId, name: str) -> Job | None:
        return await _one(conn, "job_by_name", Job, account_id=account_id, name=name)

    async def list_jobs(
        self, conn: Connection, account_id: AccountId, *, after_id: int | None, limit: int
    ) -> list[Job]:
        return await _all(conn, "list_jobs", Job, account_id=account_id, after_id=after_id, limit=limit)

    async def live_job_ids(self, conn: Connection, account_id: AccountId, job_ids: list[int]) -> set[int]:
        return set(await _values(conn, "live_job_ids", account_id=account_id, job_ids=job_ids))

    async def completion_creates_cycle(self, conn: Connection, job_id: JobId, upstream_ids: list[int]) -> bool:
        return bool(await _value(conn, "completion_creates_cycle", job_id=job_id, upstream_ids=upstream_ids))

    async def completion_triggers(self, conn: Connection, job_ids: list[int]) -> dict[int, list[CompletionTrigger]]:
        out: dict[int, list[CompletionTrigger]] = {job_id: [] for job_id in job_ids}
        for row in await _all(conn, "completion_triggers", CompletionTrigger, job_ids=job_ids):
            out[row.job_id].append(row)
        return out

    async def replace_completion_triggers(self, conn: Connection, job_id: JobId, spec: JobSpec) -> None:
        await _execute(conn, "delete_completion_triggers", job_id=job_id)
        for trigger in spec.on_completion:
            await _execute(
                conn,
                "insert_completion_trigger",
                job_id=job_id,
                upstream_job_id=trigger.upstream_job_id,
                statuses=[int(s) for s in trigger.statuses],
            )
        await _execute(conn, "baseline_completion_consumed", job_id=job_id)

    async def update_job(self, conn: Connection, account_id: AccountId, job_id: JobId, spec: JobSpec) -> Job:
        row = await _one(conn, "update_job", Job, account_id=account_id, job_id=job_id, **self._job_params(spec))
        assert row is not None, "the caller holds the job's row lock"
        return row

    async def delete_job(self, conn: Connection, account_id: AccountId, job_id: int) -> bool:
        return await _value(conn, "delete_job", account_id=account_id, job_id=job_id) is not None

    async def drop_completion_triggers_on(self, conn: Connection, job_id: int) -> None:
        await _execute(conn, "drop_completion_triggers_on", job_id=job_id)

    async def cancel_queued_runs_of_job(self, conn: Connection, job_id: int, message: str) -> int:
        return await _execute(conn, "cancel_queued_runs_of_job", job_id=job_id, message=message)

    async def set_job_paused(
        self, conn: Connection, account_id: AccountId, job_id: JobId, paused: bool, *, who: str = "", note: str = ""
    ) -> bool:
        """True when this call paused (or unpaused) the job; False when missing or already so. A pause
        keeps ``who`` paused it and their ``note``."""
        found = await _value(
            conn, "set_job_paused", account_id=account_id, job_id=job_id, paused=paused, who=who[:200], note=note
        )
        return found is not None

    async def skipped_occurrences(
        self, conn: Connection, account_id: AccountId, job_id: JobId, *, limit: int
    ) -> list[SkippedOccurrence]:
        """The job's occurrences that got no run, newest first."""
        return await _all(
            conn, "skipped_occurrences", SkippedOccurrence, account_id=account_id, job_id=job_id, limit=limit
        )

    async def reactivate_job(self, conn: Connection, job_id: JobId) -> Job | None:
        return await _one(conn, "reactivate_job", Job, job_id=job_id)

    # runs

    async def run_in_progress_like(self, conn: Connection, job_id: int, overrides: dict[str, object]) -> Run | None:
        """The newest run of the job still queued, starting or running with exactly these overrides."""
        return await _one(conn, "run_in_progress_like", Run, job_id=job_id, overrides=Jsonb(overrides))

    async def run_by_idempotency_key(self, conn: Connection, key: str) -> Run | None:
        return await _one(conn, "run_by_idempotency_key", Run, idempotency_key=key)

    async def insert_run(self, conn: Connection, **params: Any) -> Run | None:
        """The new run, or None when its idempotency key is taken."""
        params["overrides"] = Jsonb(params["overrides"])
        return await _one(conn, "insert_run", Run, **params)

    async def get_run(self, conn: Connection, account_id: AccountId, run_id: int) -> RunWithEnvironment | None:
        return await _one(conn, "get_run", RunWithEnvironment, account_id=account_id, run_id=run_id)

    async def run_steps(self, conn: Connection, run_ids: list[int]) -> dict[int, list[RunStep]]:
        out: dict[int, list[RunStep]] = {run_id: [] for run_id in run_ids}
        for row in await _all(conn, "run_steps", RunStep, run_ids=run_ids):
            out[row.run_id].append(row)
        return out

    async def list_runs(
        self,
        conn: Connection,
        account_id: AccountId,
        *,
        job_id: int | None,
        statuses: list[RunStatus],
        retries_exhausted_only: bool,
        after_id: int | None,
        limit: int,
    ) -> list[Run]:
        return await _all(
            conn,
            "list_runs",
            Run,
            account_id=account_id,
            job_id=job_id,
            statuses=[int(s) for s in statuses],
            retries_exhausted_only=retries_exhausted_only,
            after_id=after_id,
            limit=limit,
        )

    async def cancel_queued_run(self, conn: Connection, account_id: AccountId, run_id: int, message: str) -> Run | None:
        return await _one(conn, "cancel_queued_run", Run, account_id=account_id, run_id=run_id, message=message)

    async def request_cancel(self, conn: Connection, account_id: AccountId, run_id: int) -> Run | None:
        return await _one(conn, "request_cancel", Run, account_id=account_id, run_id=run_id)

    async def run_status(self, conn: Connection, run_id: RunId) -> RunStatus:
        status = await _value(conn, "run_status", run_id=run_id)
        assert status is not None, "runs are never deleted while their account exists"
        return RunStatus(status)

    async def log_chunks(self, conn: Connection, run_id: RunId, *, after_seq: int, limit: int) -> list[LogChunk]:
        return await _all(conn, "log_chunks", LogChunk, run_id=run_id, after_seq=after_seq, limit=limit)

    async def list_artifacts(self, conn: Connection, run_id: RunId) -> list[Artifact]:
        return await _all(conn, "list_artifacts", Artifact, run_id=run_id)

    async def get_artifact(
        self, conn: Connection, run_id: RunId, path: str, step_index: int | None
    ) -> ArtifactWithContent | None:
        return await _one(conn, "get_artifact", ArtifactWithContent, run_id=run_id, path=path, step_index=step_index)

    # projects and environments (secret fields arrive encrypted)

    async def insert_project(
        self, conn: Connection, account_id: AccountId, spec: ProjectSpec, credential: str
    ) -> Project:
        row = await _one(
            conn,
            "insert_project",
            Project,
            account_id=account_id,
            name=spec.name,
            repository_url=spec.repository_url,
            subdirectory=spec.subdirectory,
            git_credential_kind=spec.credential_kind,
            git_credential=credential,
        )
        assert row is not None
        return row

    async def get_project(
        self, conn: Connection, account_id: AccountId, project_id: int, *, for_update: bool = False
    ) -> Project | None:
        query = "get_project_for_update" if for_update else "get_project"
        return await _one(conn, query, Project, account_id=account_id, project_id=project_id)

    async def update_project(
        self,
        conn: Connection,
        account_id: AccountId,
        project_id: int,
        spec: ProjectSpec,
        credential: str | None,
        *,
        expected_version: int = 0,
        repository_id: int | None = None,
    ) -> Project | None:
        """The project changed; a ``credential`` of None keeps the stored one. None when the project is
        gone or, with an ``expected_version`` (0: any), when it is no longer at that version."""
        return await _one(
            conn,
            "update_project",
            Project,
            account_id=account_id,
            project_id=project_id,
            name=spec.name,
            repository_url=spec.repository_url,
            subdirectory=spec.subdirectory,
            git_credential_kind=spec.credential_kind,
            git_credential=credential,
            expected_version=expected_version,
            repository_id=repository_id,
        )

    async def delete_project(self, conn: Connection, account_id: AccountId, project_id: int) -> None:
        """Mark the project, its environments, repositories and credentials deleted and forget their secrets."""
        await _execute(conn, "delete_project", account_id=account_id, project_id=project_id)
        await _execute(conn, "delete_project_parts", account_id=account_id, project_id=project_id)

    async def environment_ids_of_project(self, conn: Connection, project_id: int) -> list[int]:
        return [int(i) for i in await _values(conn, "environment_ids_of_project", project_id=project_id)]

    async def live_jobs_of_environments(self, conn: Connection, environment_ids: list[int]) -> list[int]:
        """Up to ten live jobs that use any of ``environment_ids``."""
        return [int(i) for i in await _values(conn, "live_jobs_of_environments", environment_ids=environment_ids)]

    async def list_projects(self, conn: Connection, account_id: AccountId) -> list[Project]:
        return await _all(conn, "list_projects", Project, account_id=account_id)

    async def insert_repository(
        self, conn: Connection, account_id: AccountId, project_id: int, spec: ProjectSpec, credential: str
    ) -> Repository:
        """A repository of ``spec``'s URL and credential kind, in the project; ``credential`` is ciphertext."""
        row = await _one(
            conn,
            "insert_repository",
            Repository,
            account_id=account_id,
            project_id=project_id,
            remote_url=spec.repository_url,
            git_credential_kind=spec.credential_kind,
            git_credential=credential,
        )
        assert row is not None
        return row

    async def get_repository(self, conn: Connection, account_id: AccountId, repository_id: int) -> Repository | None:
        return await _one(conn, "get_repository", Repository, account_id=account_id, repository_id=repository_id)

    async def list_repositories(self, conn: Connection, account_id: AccountId, project_id: int) -> list[Repository]:
        return await _all(conn, "list_repositories", Repository, account_id=account_id, project_id=project_id)

    async def delete_repository(self, conn: Connection, account_id: AccountId, repository_id: int) -> None:
        """Mark the repository deleted and forget its credential; a project attached to it keeps its copy."""
        await _execute(conn, "delete_repository", account_id=account_id, repository_id=repository_id)

    async def insert_connection(
        self, conn: Connection, account_id: AccountId, name: str, adapter_type: str, details: dict[str, str]
    ) -> WarehouseConnection:
        row = await _one(
            conn,
            "insert_connection",
            WarehouseConnection,
            account_id=account_id,
            name=name,
            adapter_type=adapter_type,
            details=Jsonb(details),
        )
        assert row is not None
        return row

    async def get_connection(
        self, conn: Connection, account_id: AccountId, connection_id: int
    ) -> WarehouseConnection | None:
        return await _one(
            conn, "get_connection", WarehouseConnection, account_id=account_id, connection_id=connection_id
        )

    async def list_connections(self, conn: Connection, account_id: AccountId) -> list[WarehouseConnection]:
        return await _all(conn, "list_connections", WarehouseConnection, account_id=account_id)

    async def update_connection(
        self, conn: Connection, account_id: AccountId, connection_id: int, name: str, details: dict[str, str]
    ) -> WarehouseConnection | None:
        return await _one(
            conn,
            "update_connection",
            WarehouseConnection,
            account_id=account_id,
            connection_id=connection_id,
            name=name,
            details=Jsonb(details),
        )

    async def delete_connection(self, conn: Connection, account_id: AccountId, connection_id: int) -> None:
        await _execute(conn, "delete_connection", account_id=account_id, connection_id=connection_id)

    async def insert_credentials(
        self, conn: Connection, account_id: AccountId, values: CredentialsValues
    ) -> Credentials:
        """Credentials of ``values``, whose secrets arrive encrypted."""
        row = await _one(conn, "insert_credentials", Credentials, account_id=account_id, **_credentials_columns(values))
        assert row is not None
        return row

    async def get_credentials(self, conn: Connection, account_id: AccountId, credentials_id: int) -> Credentials | None:
        return await _one(conn, "get_credentials", Credentials, account_id=account_id, credentials_id=credentials_id)

    async def list_credentials(self, conn: Connection, account_id: AccountId, project_id: int) -> list[Credentials]:
        return await _all(conn, "list_credentials", Credentials, account_id=account_id, project_id=project_id)

    async def update_credentials(
        self, conn: Connection, account_id: AccountId, credentials_id: int, values: CredentialsValues
    ) -> Credentials | None:
        columns = {k: v for k, v in _credentials_columns(values).items() if k not in ("project_id", "adapter_type")}
        return await _one(
            conn, "update_credentials", Credentials, account_id=account_id, credentials_id=credentials_id, **columns
        )

    async def delete_credentials(self, conn: Connection, account_id: AccountId, credentials_id: int) -> None:
        """Mark the credentials deleted and forget their secrets."""
        await _execute(conn, "delete_credentials", account_id=account_id, credentials_id=credentials_id)

    async def set_environment_extras(
        self, conn: Connection, account_id: AccountId, environment_id: int, extras: EnvironmentExtras
    ) -> Environment:
        row = await _one(
            conn,
            "set_environment_extras",
            Environment,
            account_id=account_id,
            environment_id=environment_id,
            description=extras.description,
            deployment_type=extras.deployment_type,
            connection_id=extras.connection_id,
            credentials_id=extras.credentials_id,
        )
        assert row is not None
        return row

    async def set_project_description(
        self, conn: Connection, account_id: AccountId, project_id: int, description: str
    ) -> Project:
        row = await _one(
            conn,
            "set_project_description",
            Project,
            account_id=account_id,
            project_id=project_id,
            description=description,
        )
        assert row is not None
        return row

    async def insert_environment(
        self, conn: Connection, account_id: AccountId, spec: EnvironmentSpec, secrets: dict[str, str]
    ) -> Environment:
        row = await _one(
            conn,
            "insert_environment",
            Environment,
            account_id=account_id,
            project_id=spec.project_id,
            **self._environment_fields(spec, secrets),
        )
        assert row is not None
        return row

    async def get_environment(
        self, conn: Connection, account_id: AccountId, environment_id: int, *, for_update: bool = False
    ) -> Environment | None:
        query = "get_environment_for_update" if for_update else "get_environment"
        return await _one(conn, query, Environment, account_id=account_id, environment_id=environment_id)

    async def update_environment(
        self,
        conn: Connection,
        account_id: AccountId,
        environment_id: int,
        spec: EnvironmentSpec,
        secrets: dict[str, str],
        *,
        expected_version: int = 0,
    ) -> Environment | None:
        """None when the environment is gone or, with an ``expected_version`` (0: any), when it is no
        longer at that version."""
        return await _one(
            conn,
            "update_environment",
            Environment,
            account_id=account_id,
            environment_id=environment_id,
            expected_version=expected_version,
            **self._environment_fields(spec, secrets),
        )

    async def delete_environment(self, conn: Connection, account_id: AccountId, environment_id: int) -> bool:
        deleted = await _value(conn, "delete_environment", account_id=account_id, environment_id=environment_id)
        return deleted is not None

    async def list_environments(
        self, conn: Connection, account_id: AccountId, project_id: int | None
    ) -> list[Environment]:
        return await _all(conn, "list_environments", Environment, account_id=account_id, project_id=project_id)

    async def claim_warehouse_directory(
        self, conn: Connection, account_id: AccountId, environment_id: int, directory: str
    ) -> int:
        """The environment that holds ``directory``: this one, unless another named it first."""
        holder = await _value(
            conn, "claim_warehouse_directory", directory=directory, account_id=account_id, environment_id=environment_id
        )
        if holder is None:  # claimed by a transaction that committed while this statement waited on it
            holder = await _value(conn, "warehouse_directory_holder", directory=directory)
        return int(holder)

    # the REST API's offset pages (dbt Cloud's v2 shape)

    async def update_account_settings(
        self,
        conn: Connection,
        account_id: AccountId,
        *,
        deactivate_after_failures: int | None,
        pull_request_schema_max_age_days: int | None,
        run_retention_days: int | None = None,
    ) -> Account | None:
        return await _one(
            conn,
            "update_account_settings",
            Account,
            account_id=account_id,
            deactivate_after_failures=deactivate_after_failures,
            pull_request_schema_max_age_days=pull_request_schema_max_age_days,
            run_retention_days=run_retention_days,
        )

    async def get_account(self, conn: Connection, account_id: AccountId) -> Account | None:
        return await _one(conn, "get_account", Account, account_id=account_id)

    async def runs_by_offset(
        self,
        conn: Connection,
        account_id: AccountId,
        filters: RunFilters,
        *,
        order_by: str,
        offset: int,
        limit: int,
    ) -> tuple[list[RunWithEnvironment], int]:
        """One page of the account's runs and how many match in all."""
        params: dict[str, Any] = {
            "account_id": account_id,
            "job_id": filters.job_id,
            "statuses": [int(s) for s in filters.statuses],
            "deferring_run_id": filters.deferring_run_id,
            "by_environment": filters.environment_id is not None or bool(filters.project_ids),
            "environment_id": filters.environment_id,
            "project_ids": list(filters.project_ids),
            "run_ids": list(filters.run_ids),
            "id_gt": filters.id_gt,
            "dbt_versions": list(filters.dbt_versions),
            "has_docs": filters.has_docs,
            "has_sources": filters.has_sources,
            "created_from": filters.created[0] if filters.created else None,
            "created_to": filters.created[1] if filters.created else None,
            "finished_from": filters.finished[0] if filters.finished else None,
            "finished_to": filters.finished[1] if filters.finished else None,
        }
        total = await _value(conn, "count_runs", **params)
        rows = await _all(
            conn, "list_runs_by_offset", RunWithEnvironment, **params, order_by=order_by, offset=offset, limit=limit
        )
        return rows, int(total or 0)

    async def jobs_by_offset(
        self, conn: Connection, account_id: AccountId, filters: JobFilters, *, order_by: str, offset: int, limit: int
    ) -> tuple[list[JobWithEnvironment], int]:
        """One page of the account's jobs (live ones, or deleted ones) and how many match in all."""
        name_like = None
        if filters.name_contains is not None:
            escaped = filters.name_contains.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            name_like = f"%{escaped}%"
        params: dict[str, Any] = {
            "account_id": account_id,
            "deleted": filters.deleted,
            "environment_id": filters.environment_id,
            "project_ids": list(filters.project_ids),
            "name_like": name_like,
            "job_ids": list(filters.job_ids),
            "id_gt": filters.id_gt,
            "dbt_versions": list(filters.dbt_versions),
            "scheduled": filters.scheduled,
        }
        total = await _value(conn, "count_jobs", **params)
        rows = await _all(
            conn, "list_jobs_by_offset", JobWithEnvironment, **params, order_by=order_by, offset=offset, limit=limit
        )
        return rows, int(total or 0)

    async def retries_of_runs(
        self, conn: Connection, account_id: AccountId, run_ids: list[int]
    ) -> list[RunWithEnvironment]:
        return await _all(conn, "retries_of_runs", RunWithEnvironment, account_id=account_id, run_ids=run_ids)

    async def latest_docs_run(self, conn: Connection, account_id: AccountId, job_id: int) -> RunId | None:
        run_id = await _value(conn, "latest_docs_run", account_id=account_id, job_id=job_id)
        return None if run_id is None else RunId(run_id)

    async def docs_of_runs(self, conn: Connection, run_ids: list[int]) -> dict[int, set[str]]:
        """Of each run that kept them, which of ``target/catalog.json`` and ``target/sources.json``."""
        out: dict[int, set[str]] = {}
        for row in await _all(conn, "docs_of_runs", _RunFile, run_ids=run_ids):
            out.setdefault(row.run_id, set()).add(row.path)
        return out

    async def latest_run_of_job(self, conn: Connection, account_id: AccountId, job_id: int) -> Run | None:
        return await _one(conn, "latest_run_of_job", Run, account_id=account_id, job_id=job_id)

    async def step_logs(self, conn: Connection, run_ids: list[int]) -> dict[tuple[int, int], str]:
        """Each step's whole log text, by (run id, step index)."""
        rows = await _all(conn, "step_logs", _StepLog, run_ids=run_ids)
        return {(row.run_id, row.step_index): row.text for row in rows}

    async def artifacts_of_step(self, conn: Connection, run_id: RunId, step_index: int | None) -> list[Artifact]:
        return await _all(conn, "list_artifacts_of_step", Artifact, run_id=run_id, step_index=step_index)

    # the web pages

    async def runs_page(
        self,
        conn: Connection,
        account_id: AccountId,
        *,
        filters: dict[str, Any],
        after: RunId | None,
        limit: int,
    ) -> list[RunListing]:
        """One keyset page of the account's runs, newest first; ``after`` is the last row's id.

        Not prepared: each call's own plan uses the one index its filters need.
        """
        params: dict[str, Any] = {"account_id": account_id, "delay": None, "waiting": None}
        params |= {"environment_id": None, "project_id": None}
        params |= {**filters, "after_id": after}
        return await fetch_all(conn, QUERIES["runs_page"], {**params, "limit": limit}, RunListing, prepare=False)

    async def search(
        self, conn: Connection, account_id: AccountId, words: str, *, by_id: bool, limit: int
    ) -> tuple[list[JobMatch], list[RunListing]]:
        """Jobs and runs whose id is ``words`` or, unless ``by_id``, whose name (a run's: its job's, or its
        cause) holds them."""
        escaped = words.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        params = {
            "account_id": account_id,
            "id": int(words) if words.isdigit() and len(words) < 19 else None,
            "pattern": None if by_id else f"%{escaped}%",
            "limit": limit,
        }
        return await _all(conn, "search_jobs", JobMatch, **params), await _all(
            conn, "search_runs", RunListing, **params
        )

    async def on_time_split(self, conn: Connection, account_id: AccountId, since: datetime) -> OnTimeSplit:
        row = await _one(conn, "on_time_split", OnTimeSplit, account_id=account_id, since=since)
        assert row is not None, "an aggregate always answers"
        return row

    async def waiting_now(self, conn: Connection, account_id: AccountId) -> list[Waiting]:
        return await _all(conn, "waiting_now", Waiting, account_id=account_id)

    async def job_names(self, conn: Connection, account_id: AccountId) -> list[JobName]:
        return await _all(conn, "job_names", JobName, account_id=account_id)

    async def account_tokens(self, conn: Connection, account_id: AccountId) -> list[TokenListing]:
        return await _all(conn, "account_tokens", TokenListing, account_id=account_id)

    async def account_webhooks(self, conn: Connection, account_id: AccountId) -> list[WebhookListing]:
        return await _all(conn, "account_webhooks", WebhookListing, account_id=account_id)

    async def run_slots_in_use(self, conn: Connection, account_id: AccountId) -> int:
        return int(await _value(conn, "run_slots_in_use", account_id=account_id))


@contextlib.asynccontextmanager
async def _database_errors() -> AsyncIterator[None]:
    """Postgres going away (or a pool with no free connection) becomes ServiceUnavailable."""
    try:
        yield
    except Contention as exc:
        raise ServiceUnavailable("a concurrent change conflicted with this one; try again") from exc
    except ServiceUnavailable as exc:  # clients see no detail of the database
        log.warning("database unavailable: %s", exc)
        raise ServiceUnavailable("the database is unavailable; try again") from exc


@dataclass(frozen=True, slots=True)
class _TokenScopes:
    account_id: AccountId
    scopes: list[str]
    who: str


@dataclass(frozen=True, slots=True)
class _RunFile:
    run_id: int
    path: str


@dataclass(frozen=True, slots=True)
class _StepLog:
    run_id: int
    step_index: int
    text: str


def _credentials_columns(values: CredentialsValues) -> dict[str, Any]:
    return {
        "project_id": values.project_id,
        "adapter_type": values.adapter_type,
        "details": Jsonb(values.details),
        "secrets": Jsonb(values.secrets),
        "schema_name": values.schema_name,
        "threads": values.threads,
        "target_name": values.target_name,
    }


async def _one(conn: Connection, query: str, row: type[RowT], **params: Any) -> RowT | None:
    return await fetch_one(conn, QUERIES[query], params, row)


async def _all(conn: Connection, query: str, row: type[RowT], **params: Any) -> list[RowT]:
    return await fetch_all(conn, QUERIES[query], params, row)


async def _value(conn: Connection, query: str, **params: Any) -> Any:
    """The first column of the query's first row; None without a row."""
    async with conn.cursor(row_factory=scalar_row) as cur:
        await cur.execute(QUERIES[query], params)
        return await cur.fetchone()


async def _values(conn: Connection, query: str, **params: Any) -> list[Any]:
    """The first column of every row of the query."""
    async with conn.cursor(row_factory=scalar_row) as cur:
        await cur.execute(QUERIES[query], params)
        return await cur.fetchall()


async def _execute(conn: Connection, query: str, **params: Any) -> int:
    cur = await conn.execute(QUERIES[query], params)
    return cur.rowcount
