"""Webhook subscriptions of an account: what they may say, and their reads and writes.

The HMAC secret is made here, shown once (in the answer to the create), and stored encrypted.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from api.store import Store
from api.validation import text
from api.webhooks.rows import Delivery, Event, Receipt, Subscription
from api.webhooks.targets import TargetPolicy
from runplane.adapters.db import Connection, fetch_all, fetch_one, fetch_value
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.secrets import SecretBox
from runplane.basics.types import AccountId
from runplane.sql import load_queries

Q = load_queries("api.webhooks")
NQ = load_queries("api", "notifications.sql")
EVENT_TYPES = ("job.run.started", "job.run.completed", "job.run.errored")
MAX_URL = 2048
MAX_JOB_IDS = 1000
DELIVERY_LOG_LIMIT = 100


@dataclass(frozen=True)
class SubscriptionSpec:
    name: str
    description: str
    client_url: str
    event_types: list[str]
    job_ids: list[int]
    active: bool


def subscription_spec(
    *, name: str, description: str, client_url: str, event_types: list[str], job_ids: list[int], active: bool
) -> SubscriptionSpec:
    name = text(name.strip(), "name", max_length=255, required=True)
    description = text(description, "description", max_length=1000, single_line=False)
    client_url = text(client_url.strip(), "client_url", max_length=MAX_URL, required=True)
    parts = urlsplit(client_url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidArgument("client_url", "must be an http(s) URL with a host")
    if not event_types:
        raise InvalidArgument("event_types", f"name at least one of {', '.join(EVENT_TYPES)}")
    for event in event_types:
        if event not in EVENT_TYPES:
            raise InvalidArgument("event_types", f"{event[:60]!r} is not one of {', '.join(EVENT_TYPES)}")
    if len(job_ids) > MAX_JOB_IDS:
        raise InvalidArgument("job_ids", f"at most {MAX_JOB_IDS} jobs")
    for job_id in job_ids:
        if not 1 <= job_id < 2**63:
            raise InvalidArgument("job_ids", f"{job_id} is not a job id")
    return SubscriptionSpec(name, description, client_url, sorted(set(event_types)), sorted(set(job_ids)), active)


class Subscriptions:
    def __init__(self, store: Store, box: SecretBox | None, targets: TargetPolicy) -> None:
        self._store = store
        self._box = box
        self._targets = targets

    async def create(self, account_id: AccountId, spec: SubscriptionSpec) -> tuple[Subscription, str]:
        """The new subscription and its HMAC secret (in clear, this once)."""
        self._targets.check_url(spec.client_url)
        secret = secrets.token_hex(32)
        async with self._store.transaction() as conn:
            await self._check_jobs(conn, account_id, spec)
            row = await _subscription(
                conn,
                "insert_subscription",
                id="wsu_" + secrets.token_hex(12),
                account_id=account_id,
                hmac_secret=self._encrypting().encrypt(secret),
                **spec.__dict__,
            )
        assert row is not None
        return row, secret

    async def all(self, account_id: AccountId) -> list[Subscription]:
        async with self._store.connection() as conn:
            return await fetch_all(conn, Q["list_subscriptions"], {"account_id": account_id}, Subscription)

    async def get(self, account_id: AccountId, subscription_id: str) -> Subscription:
        async with self._store.connection() as conn:
            return await self._existing(conn, account_id, subscription_id)

    async def update(self, account_id: AccountId, subscription_id: str, spec: SubscriptionSpec) -> Subscription:
        self._targets.check_url(spec.client_url)
        async with self._store.transaction() as conn:
            await self._check_jobs(conn, account_id, spec)
            row = await _subscription(
                conn, "update_subscription", id=subscription_id, account_id=account_id, **spec.__dict__
            )
        if row is None:
            raise NotFound(f"webhook {subscription_id[:40]} not found")
        return row

    async def delete(self, account_id: AccountId, subscription_id: str) -> None:
        async with self._store.transaction() as conn:
            cur = await conn.execute(Q["delete_subscription"], {"id": subscription_id, "account_id": account_id})
            if cur.rowcount == 0:
                raise NotFound(f"webhook {subscription_id[:40]} not found")

    async def deliveries(self, account_id: AccountId, subscription_id: str) -> list[Delivery]:
        """The newest events of a subscription, each with every attempt made to deliver it."""
        async with self._store.connection() as conn:
            await self._existing(conn, account_id, subscription_id)
            params = {"id": subscription_id, "account_id": account_id, "limit": DELIVERY_LOG_LIMIT}
            return await fetch_all(conn, Q["deliveries"], params, Delivery)

    async def send_test(self, account_id: AccountId, subscription_id: str) -> str:
        """Queue a test event on the outbox, signed and sent like any other; its event id."""
        event_id = "wev_" + secrets.token_hex(16)
        async with self._store.transaction() as conn:
            row = await self._existing(conn, account_id, subscription_id)
            payload = {
                "accountId": account_id,
                "webhookId": row.id,
                "eventId": event_id,
                "eventType": "test",
                "webhookName": row.name,
                "data": {},
            }
            params = {
                "event_id": event_id,
                "subscription_id": row.id,
                "notification_id": None,
                "account_id": account_id,
                "event_type": "test",
                "payload": json.dumps(payload),
            }
            await fetch_value(conn, NQ["queue_test"], params, str)
        return event_id

    async def events(self, account_id: AccountId, subscription_id: str, *, limit: int, offset: int) -> list[Event]:
        async with self._store.connection() as conn:
            await self._existing(conn, account_id, subscription_id)
            params = {"id": subscription_id, "account_id": account_id, "limit": limit, "offset": offset}
            return await fetch_all(conn, Q["subscription_events"], params, Event)

    async def receipts(self, account_id: AccountId, subscription_id: str, event_id: str) -> list[Receipt]:
        async with self._store.connection() as conn:
            await self._existing(conn, account_id, subscription_id)
            params = {"id": subscription_id, "account_id": account_id, "event_id": event_id}
            return await fetch_all(conn, Q["event_receipts"], params, Receipt)

    def _encrypting(self) -> SecretBox:
        if self._box is None:
            raise InvalidArgument(
                "client_url", "webhooks need RUNPLANE_SECRET_KEYS on the API (their secrets are encrypted)"
            )
        return self._box

    async def _existing(self, conn: Connection, account_id: AccountId, subscription_id: str) -> Subscription:
        row = await _subscription(conn, "get_subscription", id=subscription_id, account_id=account_id)
        if row is None:
            raise NotFound(f"webhook {subscription_id[:40]} not found")
        return row

    async def _check_jobs(self, conn: Connection, account_id: AccountId, spec: SubscriptionSpec) -> None:
        live = await self._store.live_job_ids(conn, account_id, spec.job_ids) if spec.job_ids else set()
        for job_id in spec.job_ids:
            if job_id not in live:
                raise InvalidArgument("job_ids", f"job {job_id} not found")


async def _subscription(conn: Connection, query: str, **params: Any) -> Subscription | None:
    return await fetch_one(conn, Q[query], params, Subscription)
