"""Notifications of a run's end: the checks and writes every door (gRPC, REST, the pages) shares.

A notification is a receiver and the jobs it hears about per outcome, as dbt Cloud's v2
``notifications`` are: ``on_success``, ``on_warning``, ``on_failure``, ``on_cancel``. Its receiver's
secret (a Slack incoming-webhook URL or bot token, a Teams Workflows URL) is stored encrypted and never
shown; an answer says only which kind is set.
"""

from __future__ import annotations

import enum
import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

from api.rows import Notification, NotificationDelivery
from api.store import Store
from api.validation import text
from runplane.adapters.db import Connection, fetch_all, fetch_one, fetch_value
from runplane.basics.addresses import Address, AddressPolicy, literal
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.secrets import SecretBox
from runplane.basics.types import AccountId
from runplane.sql import load_queries

Q = load_queries("api", "notifications.sql")
MAX_JOB_IDS = 1000
DELIVERY_LOG_LIMIT = 100
SECRET_KINDS = ("slack_webhook_url", "slack_bot_token", "teams_webhook_url")


class AddressRule(Protocol):
    """Why an address may not be reached (None: it may); the webhooks' rule is one."""

    def refusal(self, address: Address) -> str | None: ...


def delivery_status(delivered_at: datetime | None, abandoned_at: datetime | None, outcome: str) -> str:
    """One word for an outbox event's state, as the delivery logs show it."""
    if delivered_at is not None:
        return "skipped" if outcome.startswith("skipped") else "delivered"
    if abandoned_at is not None:
        return "in doubt" if outcome == "in doubt" else "abandoned"
    return "pending"


class NotificationType(enum.IntEnum):
    """dbt Cloud's destination types this install sends to (2, 4), and runplane's own (6, 7)."""

    SLACK = 2
    EXTERNAL_EMAIL = 4
    TEAMS = 6
    MODEL_OWNERS = 7


class State(enum.IntEnum):
    ACTIVE = 1
    DELETED = 2


@dataclass(frozen=True)
class NotificationSpec:
    type: NotificationType
    user_id: int
    external_email: str
    slack_channel_id: str
    slack_channel_name: str
    secret_kind: str  # '' keeps the stored secret (an update that does not retype it)
    secret: str
    on_success: list[int]
    on_warning: list[int]
    on_failure: list[int]
    on_cancel: list[int]
    state: State

    def job_ids(self) -> set[int]:
        return {*self.on_success, *self.on_warning, *self.on_failure, *self.on_cancel}


def _job_list(values: list[int], name: str) -> list[int]:
    if len(values) > MAX_JOB_IDS:
        raise InvalidArgument(name, f"at most {MAX_JOB_IDS} jobs")
    for job_id in values:
        if not 1 <= job_id < 2**63:
            raise InvalidArgument(name, f"{job_id} is not a job id")
    return sorted(set(values))


def _https_url(value: str, name: str, allowed: AddressRule) -> str:
    value = text(value.strip(), name, max_length=2048, required=True)
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidArgument(name, "must be an http(s) URL with a host")
    named = literal(parts.hostname)
    if named is not None:
        reason = allowed.refusal(named)
        if reason is not None:
            raise InvalidArgument(name, f"{reason}; notifications go only to public addresses")
    return value


def notification_spec(
    *,
    type: int,
    user_id: int = 0,
    external_email: str = "",
    slack_channel_id: str = "",
    slack_channel_name: str = "",
    slack_webhook_url: str = "",
    slack_bot_token: str = "",
    teams_webhook_url: str = "",
    on_success: list[int] | None = None,
    on_warning: list[int] | None = None,
    on_failure: list[int] | None = None,
    on_cancel: list[int] | None = None,
    state: int = 1,
    creating: bool = True,
    allowed_networks: AddressRule | None = None,
) -> NotificationSpec:
    """A checked notification; a secret left empty on an update keeps the stored one."""
    try:
        kind = NotificationType(type)
    except ValueError:
        raise InvalidArgument(
            "type", "must be 2 (Slack), 4 (external email), 6 (Teams) or 7 (models' owners)"
        ) from None
    try:
        checked_state = State(state)
    except ValueError:
        raise InvalidArgument("state", "must be 1 (active) or 2 (deleted)") from None
    policy = allowed_networks or AddressPolicy()
    lists = {
        "on_success": _job_list(on_success or [], "on_success"),
        "on_warning": _job_list(on_warning or [], "on_warning"),
        "on_failure": _job_list(on_failure or [], "on_failure"),
        "on_cancel": _job_list(on_cancel or [], "on_cancel"),
    }
    email = ""
    channel_id = text(slack_channel_id.strip(), "slack_channel_id", max_length=64)
    channel_name = text(slack_channel_name.strip(), "slack_channel_name", max_length=255)
    secret_kind, secret = "", ""
    match kind:
        case NotificationType.EXTERNAL_EMAIL:
            email = text(external_email.strip(), "external_email", max_length=254, required=True)
            local, _, domain = email.rpartition("@")
            if not local or "." not in domain or any(c in email for c in " ,;<>\"'"):
                raise InvalidArgument("external_email", "must be one email address")
        case NotificationType.SLACK:
            if slack_webhook_url and slack_bot_token:
                raise InvalidArgument("slack_bot_token", "give a bot token or an incoming-webhook URL, not both")
            if slack_webhook_url:
                secret_kind, secret = "slack_webhook_url", _https_url(slack_webhook_url, "slack_webhook_url", policy)
            elif slack_bot_token:
                token = text(slack_bot_token.strip(), "slack_bot_token", max_length=255, required=True)
                if not token.startswith("xox"):
                    raise InvalidArgument("slack_bot_token", "must be a Slack bot token (xoxb-...)")
                secret_kind, secret = "slack_bot_token", token
            elif creating:
                raise InvalidArgument("slack_webhook_url", "give an incoming-webhook URL or a bot token")
            if secret_kind == "slack_bot_token" and not channel_id:
                raise InvalidArgument("slack_channel_id", "a bot token posts to a channel: name its id")
        case NotificationType.TEAMS:
            if teams_webhook_url:
                secret_kind, secret = "teams_webhook_url", _https_url(teams_webhook_url, "teams_webhook_url", policy)
            elif creating:
                raise InvalidArgument("teams_webhook_url", "give the Workflows webhook URL of the channel")
        case NotificationType.MODEL_OWNERS:
            for name in ("on_success", "on_cancel"):
                if lists[name]:
                    raise InvalidArgument(name, "the models' owners hear only of their models' failures and warnings")
    return NotificationSpec(
        type=kind,
        user_id=max(0, user_id),
        external_email=email,
        slack_channel_id=channel_id,
        slack_channel_name=channel_name,
        secret_kind=secret_kind,
        secret=secret,
        state=checked_state,
        **lists,
    )


class Notifications:
    def __init__(self, store: Store, box: SecretBox | None) -> None:
        self._store = store
        self._box = box

    async def create(self, account_id: AccountId, spec: NotificationSpec) -> Notification:
        async with self._store.transaction() as conn:
            await self._check_jobs(conn, account_id, spec)
            row = await fetch_one(conn, Q["insert_notification"], self._params(account_id, spec), Notification)
        assert row is not None
        return row

    async def update(self, account_id: AccountId, notification_id: int, spec: NotificationSpec) -> Notification:
        async with self._store.transaction() as conn:
            existing = await self._existing(conn, account_id, notification_id)
            retyped = spec.type != existing.type and spec.type in (NotificationType.SLACK, NotificationType.TEAMS)
            if retyped and not spec.secret_kind:
                raise InvalidArgument("type", "a new receiver type needs its URL or token")
            await self._check_jobs(conn, account_id, spec)
            params = {**self._params(account_id, spec), "id": notification_id}
            row = await fetch_one(conn, Q["update_notification"], params, Notification)
        assert row is not None
        return row

    async def all(
        self,
        account_id: AccountId,
        *,
        state: int | None = 1,
        job_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Notification]:
        params = {"account_id": account_id, "state": state, "job_id": job_id, "limit": limit, "offset": offset}
        async with self._store.connection() as conn:
            return await fetch_all(conn, Q["list_notifications"], params, Notification)

    async def get(self, account_id: AccountId, notification_id: int) -> Notification:
        async with self._store.connection() as conn:
            return await self._existing(conn, account_id, notification_id)

    async def delete(self, account_id: AccountId, notification_id: int) -> Notification:
        async with self._store.transaction() as conn:
            params = {"account_id": account_id, "id": notification_id}
            row = await fetch_one(conn, Q["delete_notification"], params, Notification)
        if row is None:
            raise NotFound(f"notification {notification_id} not found")
        return row

    async def send_test(self, account_id: AccountId, notification_id: int) -> str:
        """Queue a test message on the outbox, sent like any other; its event id (the delivery key)."""
        async with self._store.transaction() as conn:
            existing = await self._existing(conn, account_id, notification_id)
            if existing.state != State.ACTIVE:
                raise InvalidArgument("id", "a deleted notification sends nothing")
            if existing.type == NotificationType.MODEL_OWNERS:
                raise InvalidArgument("type", "the models' owners are known only from a run's manifest: no test")
            event_id = await fetch_value(
                conn,
                Q["queue_test"],
                {
                    "event_id": "ntf_" + secrets.token_hex(16),
                    "subscription_id": None,
                    "notification_id": notification_id,
                    "account_id": account_id,
                    "event_type": "notification.test",
                    "payload": json.dumps({"test": True}),
                },
                str,
            )
        assert event_id is not None
        return event_id

    async def deliveries(self, account_id: AccountId, notification_id: int) -> list[NotificationDelivery]:
        async with self._store.connection() as conn:
            await self._existing(conn, account_id, notification_id)
            params = {"id": notification_id, "account_id": account_id, "limit": DELIVERY_LOG_LIMIT}
            return await fetch_all(conn, Q["notification_deliveries"], params, NotificationDelivery)

    def _params(self, account_id: AccountId, spec: NotificationSpec) -> dict[str, Any]:
        secret = ""
        if spec.secret_kind:
            if self._box is None:
                raise InvalidArgument(
                    spec.secret_kind, "needs RUNPLANE_SECRET_KEYS on the API (it is stored encrypted)"
                )
            secret = self._box.encrypt(spec.secret)
        return {
            "account_id": account_id,
            "user_id": spec.user_id,
            "type": int(spec.type),
            "external_email": spec.external_email,
            "slack_channel_id": spec.slack_channel_id,
            "slack_channel_name": spec.slack_channel_name,
            "secret": secret,
            "secret_kind": spec.secret_kind,
            "on_success": spec.on_success,
            "on_warning": spec.on_warning,
            "on_failure": spec.on_failure,
            "on_cancel": spec.on_cancel,
            "state": int(spec.state),
        }

    async def _existing(self, conn: Connection, account_id: AccountId, notification_id: int) -> Notification:
        row = await fetch_one(
            conn, Q["get_notification"], {"account_id": account_id, "id": notification_id}, Notification
        )
        if row is None:
            raise NotFound(f"notification {notification_id} not found")
        return row

    async def _check_jobs(self, conn: Connection, account_id: AccountId, spec: NotificationSpec) -> None:
        wanted = sorted(spec.job_ids())
        live = await self._store.live_job_ids(conn, account_id, wanted) if wanted else set()
        for job_id in wanted:
            if job_id not in live:
                raise InvalidArgument("on_failure", f"job {job_id} not found")
