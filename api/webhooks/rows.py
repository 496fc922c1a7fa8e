"""The rows of the webhooks' own queries (``queries.sql`` beside this), typed as ``api.rows`` types the store's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runplane.basics.types import AccountId, JobId, RunId


@dataclass(frozen=True, slots=True)
class Subscription:
    """A row of ``webhook_subscriptions``; ``hmac_secret`` holds ciphertext."""

    id: str
    account_id: AccountId
    name: str
    description: str
    client_url: str
    event_types: list[str]
    job_ids: list[int]
    active: bool
    hmac_secret: str
    created_at: datetime
    updated_at: datetime
    consecutive_failures: int = 0
    disabled_at: datetime | None = None
    disabled_reason: str = ""


@dataclass(frozen=True, slots=True)
class Delivery:
    """An event of a subscription with every attempt to deliver it (``attempt_log``: objects with
    ``attempted_at``, ``status_code``, ``latency_ms`` and ``error``)."""

    id: int
    event_id: str
    event_type: str
    run_id: RunId | None
    created_at: datetime
    attempts: int
    delivered_at: datetime | None
    abandoned_at: datetime | None
    next_attempt_at: datetime
    attempt_log: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class GitWebhook:
    """A row of ``git_webhooks``; ``secret`` holds ciphertext, ``job_ids`` empty: every job."""

    id: int
    account_id: AccountId
    provider: str
    repository: str
    secret: str
    job_ids: list[int]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RepositoryJob:
    """A job and the repository of its project (None for plain commands, which have none)."""

    id: JobId
    repository_url: str | None


@dataclass(frozen=True, slots=True)
class Event:
    """An event of a subscription, as dbt Cloud lists them."""

    id: str
    subscription_id: str
    account_id: AccountId
    event_type: str
    payload: dict[str, Any]
    run_id: RunId | None
    created_at: datetime
    job_id: str | None
    status_code: int | None


@dataclass(frozen=True, slots=True)
class Receipt:
    """One attempt to deliver an event, as dbt Cloud calls it."""

    id: int
    event_id: str
    subscription_id: str
    attempted_at: datetime
    status_code: int | None
    error: str
    response_body: str
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A finished run, its job, environment and project, for a message about it."""

    id: RunId
    account_id: AccountId
    job_id: JobId
    status: int
    status_message: str
    started_at: datetime | None
    finished_at: datetime | None
    queued_at: datetime
    job_name: str
    environment_name: str
    project_name: str


@dataclass(frozen=True, slots=True)
class FailingStep:
    step_index: int
    command: str
    exit_code: int | None
    log: str
