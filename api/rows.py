"""The rows the API's store returns, one dataclass per column set its queries return.

A field is a column of the query, in the query's order (``SELECT *``: the table's), typed as psycopg
reads it: a ``jsonb`` column is the JSON value, ``timestamptz`` an aware datetime, a nullable column
``X | None``. Statuses, job types and triggers stay the stored values (``int``, ``str``); callers make
``RunStatus``, ``JobType`` and ``Trigger`` of them where they decide something. A query that returns
more than its table (a job with its environment's project and dbt version) has its own type, a
subclass that adds those columns, so a caller that needs them says so in its signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runplane.basics.types import AccountId, JobId, RunId


@dataclass(frozen=True, slots=True)
class Account:
    """An account's settings (``get_account``, ``update_account_settings``)."""

    id: AccountId
    name: str
    run_slots: int
    deactivate_after_failures: int
    pull_request_schema_max_age_days: int
    run_retention_days: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class RevokedToken:
    id: int
    account_id: AccountId


@dataclass(frozen=True, slots=True)
class Job:
    """A row of ``jobs``; ``secret_environment`` holds ciphertext."""

    id: JobId
    account_id: AccountId
    name: str
    job_type: str
    steps: list[str]
    cron: str | None
    timezone: str
    on_pull_request: bool
    on_merge: bool
    threads: int
    timeout_seconds: int
    target_name: str
    environment: dict[str, str]
    git_branch: str
    retry_max_attempts: int
    retry_on_step_failure: bool
    missed_run_grace_seconds: int
    priority: int
    deactivated_at: datetime | None
    deactivation_reason: str
    consecutive_failures: int
    deleted_at: datetime | None
    version: int
    created_at: datetime
    updated_at: datetime
    secret_environment: dict[str, str]
    create_key: str | None
    environment_id: int | None
    schema_name: str
    paused_at: datetime | None
    generate_docs: bool
    run_source_freshness: bool
    defer_to_job_id: int | None
    defer_to_environment_id: int | None
    run_only_modified: bool
    completion_mode: str
    create_fingerprint: str | None
    kept_cron: str | None  # the cron of a schedule trigger turned off over REST; nothing schedules it
    overlap_policy: str
    jitter_seconds: int
    paused_by: str
    pause_note: str
    catchup_window_seconds: int
    catchup_all: bool


@dataclass(frozen=True, slots=True)
class JobWithEnvironment(Job):
    """A job with the project and dbt version of its environment (None without one): ``get_job``,
    ``list_jobs_by_offset``."""

    project_id: int | None
    dbt_version: str | None


@dataclass(frozen=True, slots=True)
class SkippedOccurrence:
    """A cron occurrence of a job that got no run (``skipped_occurrences``)."""

    job_id: JobId
    scheduled_at: datetime
    reason: str
    detail: str
    blocking_run_id: RunId | None
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class CompletionTrigger:
    """``job_id`` runs when ``upstream_job_id`` ends in one of ``statuses`` (run status codes)."""

    job_id: JobId
    upstream_job_id: JobId
    statuses: list[int]


@dataclass(frozen=True, slots=True)
class JobName:
    id: JobId
    name: str


@dataclass(frozen=True, slots=True)
class JobMatch:
    """A job the web pages' search found."""

    id: JobId
    name: str
    job_type: str
    cron: str | None
    timezone: str
    paused_at: datetime | None
    deactivated_at: datetime | None


@dataclass(frozen=True, slots=True)
class Run:
    """A row of ``runs``; ``status`` is a run status code, ``overrides`` the trigger's JSON object."""

    id: RunId
    account_id: AccountId
    job_id: JobId
    job_type: str
    status: int
    trigger: str
    cause: str
    idempotency_key: str
    attempt: int
    parent_run_id: RunId | None
    upstream_run_id: RunId | None
    priority: int
    takes_slot: bool
    overrides: dict[str, Any]
    pull_request_number: int | None
    schema_name: str
    waiting_reason: str
    status_message: str
    retries_exhausted: bool
    cancel_requested_at: datetime | None
    launch_attempts: int
    not_before: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    heartbeat_at: datetime | None
    pod_name: str
    cluster: str
    trace_parent: str
    observed: int
    scheduled_at: datetime
    queued_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    runner_token_hash: bytes | None
    dispatcher_id: str | None
    git_sha: str
    job_paused: bool
    cancel_reason: str
    deferring_run_id: RunId | None
    trigger_fingerprint: str | None


@dataclass(frozen=True, slots=True)
class RunWithEnvironment(Run):
    """A run with the environment, project and dbt version of its job (None without one): ``get_run``,
    ``list_runs_by_offset``, ``retries_of_runs``."""

    environment_id: int | None
    project_id: int | None
    dbt_version: str | None


@dataclass(frozen=True, slots=True)
class RunStep:
    """A row of ``run_steps``; ``status`` is a run status code."""

    run_id: RunId
    step_index: int
    command: str
    status: int
    exit_code: int | None
    started_at: datetime | None
    finished_at: datetime | None
    skipped: bool
    end_reason: str
    optional: bool
    setup: bool

    def skipped_in(self, run_terminal: bool) -> bool:
        """Whether the step was skipped: marked so, or never started in a run that has ended (dbt Cloud
        shows such a step as "Skipped", and clients retrying from a failure read that name)."""
        return self.skipped or (run_terminal and self.started_at is None)


@dataclass(frozen=True, slots=True)
class RunListing:
    """A run as the web pages list it, with its job's name (``runs_page``, ``search_runs``)."""

    id: RunId
    job_id: JobId
    job_name: str
    status: int
    trigger: str
    cause: str
    attempt: int
    waiting_reason: str
    status_message: str
    scheduled_at: datetime
    queued_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    job_type: str
    git_sha: str
    overrides: dict[str, Any]
    run_schema: str
    job_schema: str
    environment_id: int | None  # its job's environment (None: plain commands)
    environment_name: str | None
    environment_schema: str | None
    project_id: int | None


@dataclass(frozen=True, slots=True)
class LogChunk:
    seq: int
    step_index: int
    text: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Artifact:
    """A file a run kept, without its content."""

    path: str
    step_index: int
    size_bytes: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ArtifactWithContent(Artifact):
    content: bytes


@dataclass(frozen=True, slots=True)
class OnTimeSplit:
    """Runs queued in a window that started, by run delay; the percentiles are None without any."""

    started: int
    within_25s: int
    within_60s: int
    late: int
    late_own: int
    late_platform: int
    delay_p50: float | None
    delay_p99: float | None
    prep_p50: float | None
    prep_p99: float | None


@dataclass(frozen=True, slots=True)
class Waiting:
    """How many of an account's queued runs wait for ``waiting_reason`` (empty: due, not looked at yet);
    ``not_due``: runs queued for a later time (a one-time run at its time), which wait for nobody."""

    waiting_reason: str
    not_due: bool
    runs: int
    oldest_queued_at: datetime


@dataclass(frozen=True, slots=True)
class Project:
    """A row of ``projects``; ``git_credential`` holds ciphertext (empty: none)."""

    id: int
    account_id: AccountId
    name: str
    repository_url: str
    subdirectory: str
    git_credential_kind: str
    git_credential: str
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    version: int  # bumped by every save; an update naming another is refused
    repository_id: int | None = None  # the repository it was attached to by id (None: given inline)
    description: str = ""


@dataclass(frozen=True, slots=True)
class Repository:
    """A row of ``repositories``: one made on its own in a project; ``git_credential`` holds ciphertext."""

    id: int
    account_id: AccountId
    project_id: int
    remote_url: str
    git_credential_kind: str
    git_credential: str
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None


@dataclass(frozen=True, slots=True)
class Environment:
    """A row of ``environments``; ``connection_secrets`` and ``secret_variables`` hold ciphertext."""

    id: int
    account_id: AccountId
    project_id: int
    name: str
    environment_type: str
    dbt_version: str
    git_branch: str
    adapter_type: str
    connection: dict[str, str]
    connection_secrets: dict[str, str]
    target_name: str
    schema_name: str
    threads: int
    variables: dict[str, str]
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    secret_variables: dict[str, str]
    version: int  # bumped by every save; an update naming another is refused
    description: str = ""
    deployment_type: str | None = None  # production, staging or neither
    connection_id: int | None = None  # the connection and credentials it was made from (None: inline)
    credentials_id: int | None = None


@dataclass(frozen=True, slots=True)
class WarehouseConnection:
    """A row of ``connections``: a warehouse connection's details, without secrets."""

    id: int
    account_id: AccountId
    name: str
    adapter_type: str
    details: dict[str, str]
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None


@dataclass(frozen=True, slots=True)
class Credentials:
    """A row of ``credentials``: a project's warehouse login; ``secrets`` hold ciphertext."""

    id: int
    account_id: AccountId
    project_id: int
    adapter_type: str
    details: dict[str, str]
    secrets: dict[str, str]
    schema_name: str
    threads: int
    target_name: str
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None


@dataclass(frozen=True, slots=True)
class TokenListing:
    """A token as the settings page lists it: never its hash, and the token itself is never stored."""

    id: int
    name: str
    token_prefix: str
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None


@dataclass(frozen=True, slots=True)
class WebhookListing:
    """A webhook subscription as the settings page lists it, without its signing secret."""

    id: str
    name: str
    client_url: str
    event_types: list[str]
    job_count: int
    active: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Notification:
    """A row of ``notifications``; ``secret`` holds ciphertext (``secret_kind`` says of what)."""

    id: int
    account_id: AccountId
    user_id: int
    type: int
    external_email: str
    slack_channel_id: str
    slack_channel_name: str
    secret: str
    secret_kind: str
    on_success: list[int]
    on_warning: list[int]
    on_failure: list[int]
    on_cancel: list[int]
    state: int
    consecutive_failures: int
    disabled_at: datetime | None
    disabled_reason: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class NotificationDelivery:
    """A message of a notification with every attempt to send it (``attempt_log`` as ``Delivery``'s, with
    the receiver's ``response_body``); ``outcome`` says how it ended when not plainly delivered."""

    id: int
    event_id: str
    event_type: str
    run_id: RunId | None
    created_at: datetime
    attempts: int
    delivered_at: datetime | None
    abandoned_at: datetime | None
    next_attempt_at: datetime
    recipient: str
    outcome: str
    attempt_log: list[dict[str, Any]]
