"""Sending one notification event of the outbox: by email (SMTP), to Slack, or to Microsoft Teams.

The outbox, its claim, lease and backoff are the webhooks' (``deliveries.py``); this module knows only
what a notification event becomes and how each receiver takes it.

Exactly one message per run outcome and receiver: the trigger writes one event per run and
notification (a unique index), and each event is sent until one attempt is known to have arrived.
What cannot be known is whether a message that left arrived when no answer came back (the sender was
killed mid-send, or the receiver did not answer in time). Such an event is *in doubt*: ``sending_at``,
committed just before the message leaves, marks it. A Slack bot can be asked: the message carries the
delivery key in its metadata, and ``conversations.history`` says whether it is in the channel; it is
sent again only when it is not. The other receivers (an SMTP server, a Slack incoming webhook, a
Teams Workflow) cannot be asked and keep no key, so an event in doubt is not sent again: it is closed
as "in doubt" in the delivery log, never doubled. An attempt refused before the message left (no
connection, a refusal, an error answer) is retried after the backoff, with the same delivery key (an
email's Message-ID).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import smtplib
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from email.message import EmailMessage
from email.policy import SMTP as SMTP_POLICY
from typing import Any

import httpx
from psycopg_pool import AsyncConnectionPool

from api.rows import Notification
from api.webhooks import messages
from api.webhooks.messages import NodeResults, Outcome, RunEnd
from api.webhooks.rows import FailingStep, RunSummary
from api.webhooks.targets import TargetPolicy, TargetRefused
from runplane.adapters.db import Connection, fetch_one, fetch_values
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import ApiSettings, NotificationSettings
from runplane.sql import load_queries

log = logging.getLogger(__name__)
Q = load_queries("api.webhooks")
NQ = load_queries("api", "notifications.sql")
RESPONSE_KEPT = 2000
RUN_RESULTS = ("target/run_results.json", "target/sources.json")
MANIFEST = "target/manifest.json"
SLACK_METADATA_TYPE = "runplane_run_notification"
SLACK_HISTORY_PAGE = 200


@dataclass(frozen=True)
class Answer:
    """One attempt's end. ``in_doubt``: the message left and no answer says whether it arrived.
    ``closed``: the event needs nothing more (delivered, skipped, fanned out, or given up in doubt)."""

    delivered: bool
    status_code: int | None = None
    error: str = ""
    response_body: str = ""
    in_doubt: bool = False
    outcome: str = ""
    attempted: bool = True  # False: nothing was sent nor tried (a skip); no attempt row is written
    counts: bool = True  # whether it counts toward the receiver's failures in a row


class SendFailed(Exception):
    """A receiver refused or failed before (or without) taking the message."""

    def __init__(self, error: str, status_code: int | None = None, response_body: str = "", in_doubt: bool = False):
        super().__init__(error)
        self.status_code = status_code
        self.response_body = response_body
        self.in_doubt = in_doubt


Mark = Callable[[], Awaitable[None]]


class Notifier:
    def __init__(
        self,
        pool: AsyncConnectionPool[Connection],
        box: SecretBox,
        settings: NotificationSettings,
        targets: TargetPolicy,
        timeout: float,
        *,
        api: ApiSettings,
    ) -> None:
        self._api = api  # where the run pages are
        self._pool = pool
        self._box = box
        self._settings = settings
        self._targets = targets
        self._timeout = timeout

    async def deliver(self, http: httpx.AsyncClient, event: dict[str, Any]) -> Answer:
        """Send one notification event (claimed from the outbox) and say how it went."""
        async with self._pool.connection() as conn:
            notification = await fetch_one(
                conn,
                NQ["get_notification"],
                {"account_id": event["account_id"], "id": event["notification_id"]},
                Notification,
            )
        if notification is None or notification.state != 1:
            return Answer(
                delivered=False,
                error="the notification was deleted",
                outcome="notification deleted",
                attempted=False,
                counts=False,
            )
        prepared = await self._prepare(event, notification)
        if isinstance(prepared, Answer):
            return prepared
        end, to = prepared
        mark = self._marker(event["id"])
        if event["sending_at"] is not None:
            return await self._in_doubt(http, event, notification=notification, end=end, to=to, mark=mark)
        return await self._send(http, notification, end, to, mark)

    async def _prepare(self, event: dict[str, Any], notification: Notification) -> tuple[RunEnd, str] | Answer:
        """The message's content and its address, or the Answer that closes the event without one."""
        key = event["event_id"]
        if event["event_type"] == "notification.test":
            return _test_end(key, self._api.run_page(0)), notification.external_email
        async with self._pool.connection() as conn:
            run = await fetch_one(conn, Q["run_summary"], {"run_id": event["run_id"]}, RunSummary)
            if run is None:
                return Answer(
                    delivered=False, error="the run was deleted", outcome="run deleted", attempted=False, counts=False
                )
            documents: list[bytes] = []
            for path in RUN_RESULTS:
                documents += await fetch_values(conn, Q["run_artifacts"], {"run_id": run.id, "path": path}, bytes)
            step = await fetch_one(conn, Q["failing_step"], {"run_id": run.id}, FailingStep)
            manifests = await fetch_values(conn, Q["run_artifacts"], {"run_id": run.id, "path": MANIFEST}, bytes)
        nodes = messages.node_results(documents)
        outcome = messages.outcome_of(run.status, nodes)
        if not _wanted(notification, run.job_id, outcome):
            return Answer(
                delivered=True, outcome=f"skipped: {outcome.value} is not asked for", attempted=False, counts=False
            )
        end = self._run_end(run, outcome, nodes, step, key)
        if notification.type == 7:
            owners = messages.owners_of(manifests[-1], [*nodes.failed, *nodes.warned]) if manifests else {}
            if event["event_type"] == "job.run.notification":
                return await self._fan_out(event, notification, owners)
            mine = set(owners.get(event["recipient"], []))
            end = _only(end, mine)
            return end, event["recipient"]
        return end, notification.external_email

    def _run_end(
        self, run: RunSummary, outcome: Outcome, nodes: NodeResults, step: FailingStep | None, key: str
    ) -> RunEnd:
        failing = ""
        lines: list[str] = []
        if step is not None and outcome in (Outcome.FAILED, Outcome.CANCELLED):
            failing = f"{step.step_index + 1}. {step.command}"
            lines = messages.error_lines(step.log, self._settings.error_lines)
        return RunEnd(
            run_id=run.id,
            job_id=run.job_id,
            job_name=run.job_name,
            environment_name=run.environment_name,
            project_name=run.project_name,
            outcome=outcome,
            seconds=messages.seconds_between(run.started_at, run.finished_at),
            status_message=run.status_message if outcome is not Outcome.SUCCEEDED else "",
            failing_step=failing,
            error_lines=lines,
            failed_models=nodes.failed,
            warned_models=nodes.warned,
            run_url=self._api.run_page(run.id),
            delivery_key=key,
        )

    async def _fan_out(self, event: dict[str, Any], notification: Notification, owners: dict[str, list[str]]) -> Answer:
        """One event per owner of a failed or warned model, in one statement (idempotent by the unique index)."""
        async with self._pool.connection() as conn:
            await conn.execute(
                Q["insert_owner_events"],
                {
                    "notification_id": notification.id,
                    "account_id": notification.account_id,
                    "run_id": event["run_id"],
                    "payload": json.dumps({"runId": event["run_id"]}),
                    "owners": sorted(owners),
                },
            )
        return Answer(
            delivered=True, outcome=f"one message to each of {len(owners)} owner(s)", attempted=False, counts=False
        )

    def _marker(self, outbox_id: int) -> Mark:
        async def mark() -> None:
            async with self._pool.connection() as conn:
                await conn.execute(Q["mark_sending"], {"id": outbox_id})

        return mark

    async def _in_doubt(
        self,
        http: httpx.AsyncClient,
        event: dict[str, Any],
        *,
        notification: Notification,
        end: RunEnd,
        to: str,
        mark: Mark,
    ) -> Answer:
        if notification.secret_kind == "slack_bot_token":
            token = self._box.decrypt(notification.secret)
            try:
                found = await self._slack_has(
                    http, token, notification.slack_channel_id, end.delivery_key, event["sending_at"]
                )
            except SendFailed as exc:
                return Answer(
                    delivered=False,
                    status_code=exc.status_code,
                    error=f"cannot check the channel: {exc}",
                    response_body=exc.response_body,
                )
            if found:
                return Answer(
                    delivered=True, status_code=200, outcome="found in the channel after a cut-off send", counts=False
                )
            return await self._send(http, notification, end, to, mark)
        return Answer(
            delivered=False,
            error="cut off mid-send: the receiver may have it, and cannot say; not sent again, so never doubled",
            in_doubt=True,
            outcome="in doubt",
            counts=False,
        )

    async def _send(
        self, http: httpx.AsyncClient, notification: Notification, end: RunEnd, to: str, mark: Mark
    ) -> Answer:
        try:
            match notification.type:
                case 4 | 7:
                    reply = await self._email(end, to, mark)
                    return Answer(delivered=True, status_code=250, response_body=reply)
                case 2 if notification.secret_kind == "slack_bot_token":
                    token = self._box.decrypt(notification.secret)
                    code, body = await self._slack_post(http, token, notification.slack_channel_id, end, mark)
                case 2:
                    payload = messages.slack_message(end, self._settings.models_listed)
                    code, body = await self._post(http, self._box.decrypt(notification.secret), payload, mark)
                case 6:
                    payload = messages.teams_message(end, self._settings.models_listed)
                    code, body = await self._post(http, self._box.decrypt(notification.secret), payload, mark)
                case _:
                    return Answer(delivered=False, error=f"type {notification.type} has no sender", counts=False)
        except SendFailed as exc:
            return Answer(
                delivered=False,
                status_code=exc.status_code,
                error=str(exc)[:500],
                response_body=exc.response_body,
                in_doubt=exc.in_doubt,
                outcome="in doubt" if exc.in_doubt else "",
            )
        return Answer(delivered=True, status_code=code, response_body=body)

    async def _post(self, http: httpx.AsyncClient, url: str, payload: dict[str, Any], mark: Mark) -> tuple[int, str]:
        """POST JSON to an account's URL (checked by the webhooks' address rule); the answer's code and body."""
        try:
            target = await self._targets.resolve(url)
        except TargetRefused as exc:
            raise SendFailed(f"refused: {exc}") from exc
        extensions = {"sni_hostname": target.server_name} if target.server_name else {}
        headers = {"Host": target.host_header, "User-Agent": "runplane-notifications"}
        await mark()
        response = await _http_call(http.post(target.url, json=payload, headers=headers, extensions=extensions))
        return response.status_code, response.text[:RESPONSE_KEPT]

    async def _slack_post(
        self, http: httpx.AsyncClient, token: str, channel: str, end: RunEnd, mark: Mark
    ) -> tuple[int, str]:
        payload = {
            "channel": channel,
            **messages.slack_message(end, self._settings.models_listed),
            "unfurl_links": False,
            "metadata": {
                "event_type": SLACK_METADATA_TYPE,
                "event_payload": {"delivery_key": end.delivery_key, "run_id": end.run_id, "outcome": end.outcome.value},
            },
        }
        await mark()
        response = await _http_call(
            http.post(
                f"{self._settings.slack_api_url.rstrip('/')}/chat.postMessage",
                json=payload,
                headers={"Authorization": f"Bearer {token}"},
            )
        )
        _slack_ok(response)
        return response.status_code, response.text[:RESPONSE_KEPT]

    async def _slack_has(self, http: httpx.AsyncClient, token: str, channel: str, key: str, since: datetime) -> bool:
        """Whether the channel holds a message carrying ``key`` posted since ``since`` (a bit before, for clocks)."""
        cursor = ""
        while True:
            params: dict[str, str | int] = {
                "channel": channel,
                "oldest": f"{since.timestamp() - 300:.6f}",
                "include_all_metadata": "true",
                "limit": SLACK_HISTORY_PAGE,
            }
            if cursor:
                params["cursor"] = cursor
            response = await _http_call(
                http.get(
                    f"{self._settings.slack_api_url.rstrip('/')}/conversations.history",
                    params=params,
                    headers={"Authorization": f"Bearer {token}"},
                )
            )
            answer = _slack_ok(response)
            for message in answer.get("messages") or []:
                metadata = message.get("metadata") or {}
                if (metadata.get("event_payload") or {}).get("delivery_key") == key:
                    return True
            cursor = ((answer.get("response_metadata") or {}).get("next_cursor")) or ""
            if not cursor:
                return False

    async def _email(self, end: RunEnd, to: str, mark: Mark) -> str:
        if not self._settings.smtp_host:
            raise SendFailed("no mail server: set notifications.smtp_host")
        message = messages.email(
            end, sender=self._settings.from_address, to=to, models_listed=self._settings.models_listed
        )
        smtp = await asyncio.to_thread(_smtp_envelope, self._settings, self._timeout, to)
        try:
            await mark()
            return await asyncio.to_thread(_smtp_data, smtp, message)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(smtp.quit)


def _wanted(notification: Notification, job_id: int, outcome: Outcome) -> bool:
    match outcome:
        case Outcome.SUCCEEDED:
            return job_id in notification.on_success
        case Outcome.WARNED:
            return job_id in notification.on_warning
        case Outcome.FAILED:
            return job_id in notification.on_failure
        case Outcome.CANCELLED:
            return job_id in notification.on_cancel


def _only(end: RunEnd, models: set[str]) -> RunEnd:
    """The message to one owner: their own models only."""
    return replace(
        end,
        failed_models=[m for m in end.failed_models if m in models],
        warned_models=[m for m in end.warned_models if m in models],
    )


def _test_end(key: str, run_url: str) -> RunEnd:
    return RunEnd(
        run_id=0,
        job_id=0,
        job_name="Test notification",
        environment_name="",
        project_name="",
        outcome=Outcome.SUCCEEDED,
        seconds=0.0,
        status_message="This is a test of this notification's receiver.",
        failing_step="",
        error_lines=[],
        failed_models=[],
        warned_models=[],
        run_url=run_url,
        delivery_key=key,
        test=True,
    )


async def _http_call(call: Awaitable[httpx.Response]) -> httpx.Response:
    """An HTTP exchange; a failure after the request may have arrived is in doubt."""
    try:
        response = await call
    except (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError) as exc:
        raise SendFailed(f"no answer: {type(exc).__name__}: {exc}", in_doubt=True) from exc
    except httpx.HTTPError as exc:
        raise SendFailed(f"{type(exc).__name__}: {exc}") from exc
    if not response.is_success:
        raise SendFailed(f"HTTP {response.status_code}", response.status_code, response.text[:RESPONSE_KEPT])
    return response


def _slack_ok(response: httpx.Response) -> dict[str, Any]:
    """Slack's Web API answers 200 with ``ok: false`` and an ``error`` on refusal."""
    try:
        answer = response.json()
    except ValueError as exc:
        raise SendFailed("Slack answered no JSON", response.status_code, response.text[:RESPONSE_KEPT]) from exc
    if not isinstance(answer, dict) or not answer.get("ok"):
        error = answer.get("error") if isinstance(answer, dict) else None
        raise SendFailed(f"Slack refused: {error}", response.status_code, response.text[:RESPONSE_KEPT])
    return answer


def _smtp_envelope(settings: NotificationSettings, timeout: float, to: str) -> smtplib.SMTP:
    """A connection to the mail server, secured and logged in as configured, with the envelope given."""
    context = ssl.create_default_context(cafile=settings.smtp_ca_file or None)
    try:
        smtp: smtplib.SMTP
        if settings.smtp_security == "tls":
            smtp = smtplib.SMTP_SSL(settings.smtp_host, settings.smtp_port, timeout=timeout, context=context)
        else:
            smtp = smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=timeout)
            if settings.smtp_security == "starttls":
                smtp.starttls(context=context)
        try:
            smtp.ehlo()
            if settings.smtp_username:
                smtp.login(settings.smtp_username, settings.smtp_password.get_secret_value())
            code, reply = smtp.mail(settings.from_address)
            if code != 250:
                raise SendFailed(f"the mail server refused the sender: {code} {reply.decode(errors='replace')}", code)
            code, reply = smtp.rcpt(to)
            if code not in (250, 251):
                raise SendFailed(f"the mail server refused {to}: {code} {reply.decode(errors='replace')}", code)
        except BaseException:
            smtp.close()
            raise
        return smtp
    except (smtplib.SMTPException, OSError) as exc:
        raise SendFailed(f"{type(exc).__name__}: {exc}"[:500], getattr(exc, "smtp_code", None)) from exc


def _smtp_data(smtp: smtplib.SMTP, message: EmailMessage) -> str:
    """The message itself: the mail server takes it at the final dot; no answer after that is in doubt."""
    try:
        code, reply = smtp.data(message.as_bytes(policy=SMTP_POLICY))
    except smtplib.SMTPDataError as exc:
        raise SendFailed(
            f"the mail server refused the message: {exc.smtp_code} {exc.smtp_error!r}", exc.smtp_code
        ) from exc
    except (smtplib.SMTPException, OSError) as exc:
        raise SendFailed(f"no answer to the message: {type(exc).__name__}: {exc}", in_doubt=True) from exc
    return f"{code} {reply.decode(errors='replace')}"
