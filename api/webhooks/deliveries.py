"""Delivering the outbox: outgoing webhooks, at least once, and notifications (``notifying.py``).

The outbox is filled in the transaction that changes a run's status (a trigger on ``runs``; see
migration 0003). This task, one per API process, claims due events with ``FOR UPDATE SKIP LOCKED``
and a lease, POSTs each with its HMAC-SHA256 signature in ``Authorization`` (as dbt Cloud signs),
and records every attempt (status, latency, error). A failed attempt is retried after an
exponential backoff; an event whose process died mid-delivery is sent again after its lease, with
the same ``eventId``, so a receiver can drop duplicates. Notification events share the claim, lease and backoff; what
they become is ``notifying.py``'s. A receiver (subscription or notification) whose attempts fail
``notifications.switch_off_after`` times in a row is switched off: its undelivered events are closed,
and it says so until it is saved again.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from typing import Any

import httpx
from psycopg_pool import AsyncConnectionPool

from api.webhooks.notifying import Answer, Notifier
from api.webhooks.targets import TargetPolicy, TargetRefused
from runplane.adapters import instruments
from runplane.adapters.db import Connection
from runplane.basics.backoff import jittered
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import ApiSettings, NotificationSettings, WebhookSettings
from runplane.basics.supervise import sleep_or_stop
from runplane.sql import load_queries

log = logging.getLogger(__name__)
Q = load_queries("api.webhooks")


def signature(secret: str, body: bytes) -> str:
    """What dbt Cloud puts in ``Authorization``: the hex HMAC-SHA256 of the raw body."""
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def body_of(payload: dict[str, Any]) -> bytes:
    """The bytes sent for an event: the same on every attempt."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8")


def backoff(settings: WebhookSettings, attempts: int) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones."""
    return jittered(settings.backoff_base, attempts, cap=settings.backoff_cap)


class WebhookDeliverer:
    def __init__(
        self,
        pool: AsyncConnectionPool[Connection],
        box: SecretBox,
        settings: WebhookSettings,
        notifications: NotificationSettings | None = None,
        public_url: str = "http://127.0.0.1:8000",
    ) -> None:
        self._pool = pool
        self._box = box
        self._settings = settings
        self._notifications = notifications or NotificationSettings()
        self._targets = TargetPolicy(settings.allowed_networks)
        self._notifier = Notifier(
            pool, box, self._notifications, self._targets, settings.timeout, api=ApiSettings(public_url=public_url)
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; a pass that found work is followed at once by another."""
        async with httpx.AsyncClient(timeout=self._settings.timeout, follow_redirects=False) as http:
            while not stop.is_set():
                try:
                    busy = await self.deliver_due(http)
                except Exception as exc:  # Postgres away: the outbox waits, this task does not die
                    log.warning("webhook deliveries paused: %s", exc)
                    busy = False
                if not busy and await sleep_or_stop(stop, self._settings.poll_interval):
                    return

    async def deliver_due(self, http: httpx.AsyncClient) -> bool:
        """Claim and send one batch; True when the batch was full (more may be due)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                Q["claim_deliveries"], {"lease": self._settings.lease_seconds, "limit": self._settings.batch_size}
            )
            events = await cur.fetchall()
        if events:
            await asyncio.gather(*(self._deliver(http, event) for event in events))
        return len(events) == self._settings.batch_size

    async def _deliver(self, http: httpx.AsyncClient, event: dict[str, Any]) -> None:
        started = time.perf_counter()
        if event["notification_id"] is not None:
            try:
                answer = await self._notifier.deliver(http, event)
            except Exception as exc:  # a bug or Postgres away: this event waits for its backoff, others go on
                log.exception("notification failed", extra={"event_id": event["event_id"]})
                answer = Answer(delivered=False, error=f"{type(exc).__name__}: {exc}"[:500], counts=False)
        else:
            answer = await self._post_webhook(http, event)
        await self._record(event, answer, (time.perf_counter() - started) * 1000)

    async def _post_webhook(self, http: httpx.AsyncClient, event: dict[str, Any]) -> Answer:
        body = body_of(event["payload"])
        headers = {
            "Content-Type": "application/json",
            "Authorization": signature(self._box.decrypt(event["hmac_secret"]), body),
            "User-Agent": "runplane-webhooks",
        }
        status_code: int | None = None
        error = ""
        response_body = ""
        try:
            target = await self._targets.resolve(event["client_url"])
            headers["Host"] = target.host_header
            extensions = {"sni_hostname": target.server_name} if target.server_name else {}
            response = await http.post(target.url, content=body, headers=headers, extensions=extensions)
            status_code = response.status_code
            response_body = response.text[:2000]
            if not response.is_success:
                error = f"HTTP {status_code}"
        except TargetRefused as exc:
            error = f"refused: {exc}"[:500]
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        return Answer(delivered=not error, status_code=status_code, error=error, response_body=response_body)

    async def _record(self, event: dict[str, Any], answer: Answer, latency_ms: float) -> None:
        async with self._pool.connection() as conn:
            if not answer.attempted and answer.delivered:
                await conn.execute(Q["skip_event"], {"id": event["id"], "outcome": answer.outcome})
            else:
                switch_off_after = self._notifications.switch_off_after
                await conn.execute(
                    Q["record_attempt"],
                    {
                        "id": event["id"],
                        "status_code": answer.status_code,
                        "latency_ms": latency_ms,
                        "error": answer.error,
                        "response_body": answer.response_body,
                        "delivered": answer.delivered,
                        "give_up": answer.in_doubt or not answer.attempted,
                        "outcome": answer.outcome,
                        "max_attempts": self._settings.max_attempts,
                        "retry_after": backoff(self._settings, event["attempts"]),
                        "counts": answer.counts,
                        "switch_off_after": switch_off_after,
                        "switch_off_reason": f"switched off after {switch_off_after} failed attempts in a row; "
                        f"the last: {answer.error}"[:500],
                    },
                )
                if not answer.delivered and answer.counts:
                    await conn.execute(Q["abandon_switched_off"], {})
        delivered = answer.delivered
        instruments.webhook_attempts.add(1, {"result": "delivered" if delivered else "failed"})
        extra = {"event_id": event["event_id"], "attempt": event["attempts"], "status_code": answer.status_code}
        if delivered:
            log.debug("outbox event delivered", extra=extra)
        else:
            log.info("outbox delivery failed: %s", answer.error, extra=extra)
