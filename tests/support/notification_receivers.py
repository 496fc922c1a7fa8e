"""Real receivers of notifications for the tests: an SMTP server (aiosmtpd, with STARTTLS or TLS and
AUTH as asked) and an HTTP server that takes Slack's incoming webhooks and Web API (chat.postMessage,
conversations.history) and Teams Workflows webhooks, refusing with 400 any payload that breaks the
documented structure (Block Kit blocks; a ``message`` with one Adaptive Card attachment).

Either can hold its answer (a slow receiver) until released, and the HTTP one can fail on purpose.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import ssl
import threading
import time
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from tests.support.ports import free_port

BLOCK_TYPES = {"header", "section", "actions", "context", "divider", "image", "rich_text"}
ADAPTIVE = "application/vnd.microsoft.card.adaptive"
ADAPTIVE_ELEMENTS = {"TextBlock", "FactSet", "Container", "ColumnSet", "Image", "RichTextBlock"}


@dataclass
class Hold:
    """While ``held`` is set, a receiver that got a whole message waits before answering; ``arrived``
    counts the messages it has whole."""

    held: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    arrived: int = 0

    def hold(self) -> None:
        self.released.clear()
        self.held.set()

    def release(self) -> None:
        self.held.clear()
        self.released.set()

    def wait_if_held(self) -> None:
        if self.held.is_set():
            self.released.wait(60)


class _MailHandler:
    def __init__(self, receiver: SmtpReceiver) -> None:
        self._receiver = receiver

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content or b""
        with self._receiver.lock:
            self._receiver.messages.append(
                (list(envelope.rcpt_tos), email.message_from_bytes(content, policy=email.policy.default))
            )
            transport = server.transport
            self._receiver.tls.append(transport is not None and transport.get_extra_info("ssl_object") is not None)
            self._receiver.hold.arrived += 1
        await asyncio.get_running_loop().run_in_executor(None, self._receiver.hold.wait_if_held)
        return "250 Message accepted for delivery"


class SmtpReceiver:
    """An SMTP server on 127.0.0.1: ``security`` starttls, tls or none; ``login`` required when given."""

    def __init__(self, tmp: Path, *, security: str = "starttls", login: tuple[str, str] | None = None) -> None:
        self.port = free_port()
        self.security = security
        self.login = login
        self.messages: list[tuple[list[str], EmailMessage]] = []
        self.tls: list[bool] = []
        self.logins: list[str] = []
        self.hold = Hold()
        self.lock = threading.Lock()
        ca = trustme.CA()
        cert = ca.issue_cert("localhost", "127.0.0.1")
        self.ca_file = tmp / "smtp-ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        kwargs: dict[str, Any] = {}
        if security == "starttls":
            kwargs.update(tls_context=context, require_starttls=True)
        elif security == "tls":
            kwargs.update(ssl_context=context)
        if login is not None:
            kwargs.update(authenticator=self._authenticate, auth_required=True, auth_require_tls=security != "none")
        self._controller = Controller(_MailHandler(self), hostname="127.0.0.1", port=self.port, **kwargs)

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
    ) -> AuthResult:
        assert self.login is not None
        if isinstance(auth_data, LoginPassword):
            user, password = auth_data.login.decode(), auth_data.password.decode()
            if (user, password) == self.login:
                self.logins.append(user)
                return AuthResult(success=True)
        return AuthResult(success=False, handled=False)

    def __enter__(self) -> SmtpReceiver:
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hold.release()
        self._controller.stop()

    def settings(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "smtp_host": "localhost",
            "smtp_port": self.port,
            "smtp_security": self.security,
            "smtp_ca_file": str(self.ca_file),
            "from_address": "runplane@example.test",
        }
        if self.login is not None:
            values.update(smtp_username=self.login[0], smtp_password=self.login[1])
        return values


def _blocks_problem(blocks: Any) -> str | None:
    if not isinstance(blocks, list) or not blocks or len(blocks) > 50:
        return "blocks must be a list of 1-50 blocks"
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in BLOCK_TYPES:
            return f"unknown block type {kind!r}"
        if kind == "header":
            text = block.get("text") or {}
            if text.get("type") != "plain_text" or not 0 < len(text.get("text", "")) <= 150:
                return "a header's text is plain_text of at most 150 characters"
        if kind == "section":
            text, fields = block.get("text"), block.get("fields")
            if text is None and not fields:
                return "a section needs text or fields"
            if text is not None and (text.get("type") not in ("mrkdwn", "plain_text") or len(text["text"]) > 3000):
                return "a section's text is mrkdwn or plain_text of at most 3000 characters"
            if fields is not None and (len(fields) > 10 or any(len(f.get("text", "")) > 2000 for f in fields)):
                return "a section has at most 10 fields of at most 2000 characters"
        if kind == "actions":
            for element in block.get("elements") or []:
                if element.get("type") == "button" and (element.get("text") or {}).get("type") != "plain_text":
                    return "a button's text is plain_text"
        if kind == "context" and not block.get("elements"):
            return "a context block needs elements"
    return None


def slack_problem(payload: Any) -> str | None:
    """What breaks Slack's documented message structure (text as fallback, Block Kit blocks), or None."""
    if not isinstance(payload, dict) or not isinstance(payload.get("text"), str) or not payload["text"]:
        return "a message with blocks needs a top-level text fallback"
    return _blocks_problem(payload.get("blocks"))


def teams_problem(payload: Any) -> str | None:
    """What breaks a Teams Workflows webhook's expected body (a message with an Adaptive Card), or None."""
    if not isinstance(payload, dict) or payload.get("type") != "message":
        return "type must be message"
    attachments = payload.get("attachments")
    if not isinstance(attachments, list) or len(attachments) != 1:
        return "one attachment"
    attachment = attachments[0]
    if attachment.get("contentType") != ADAPTIVE:
        return f"contentType must be {ADAPTIVE}"
    card = attachment.get("content") or {}
    if card.get("type") != "AdaptiveCard" or not str(card.get("version", "")).startswith("1."):
        return "content must be an AdaptiveCard with a 1.x version"
    if not isinstance(card.get("body"), list) or not card["body"]:
        return "the card needs a body"
    for element in card["body"]:
        if element.get("type") not in ADAPTIVE_ELEMENTS:
            return f"unknown card element {element.get('type')!r}"
        if element["type"] == "FactSet" and not all({"title", "value"} <= set(f) for f in element.get("facts", [])):
            return "facts have a title and a value"
    for action in card.get("actions") or []:
        if action.get("type") == "Action.OpenUrl" and not str(action.get("url", "")).startswith("http"):
            return "Action.OpenUrl needs a url"
    return None


class HttpReceiver:
    """Slack (``/slack/webhook``, ``/api/chat.postMessage``, ``/api/conversations.history``) and Teams
    (``/teams``) on one local port. ``failing``: every POST answers 500."""

    def __init__(self, bot_token: str = "xoxb-test") -> None:
        self.port = free_port()
        self.bot_token = bot_token
        self.slack_webhook: list[dict[str, Any]] = []
        self.slack_posts: list[dict[str, Any]] = []
        self.teams: list[dict[str, Any]] = []
        self.failing = False
        self.hold = Hold()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/api/conversations.history":
                    return self._answer(404, {"ok": False, "error": "unknown_method"})
                if self.headers.get("Authorization") != f"Bearer {receiver.bot_token}":
                    return self._answer(200, {"ok": False, "error": "invalid_auth"})
                query = parse_qs(url.query)
                channel = query.get("channel", [""])[0]
                with_metadata = query.get("include_all_metadata", ["false"])[0] == "true"
                with receiver.lock:
                    messages = [
                        {"type": "message", "ts": p["ts"], "text": p["text"]}
                        | ({"metadata": p["metadata"]} if with_metadata and "metadata" in p else {})
                        for p in receiver.slack_posts
                        if p["channel"] == channel
                    ]
                self._answer(200, {"ok": True, "messages": messages, "has_more": False})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    payload = json.loads(body)
                except ValueError:
                    return self._answer(400, "invalid_payload", text=True)
                path = urlsplit(self.path).path
                if receiver.failing:
                    return self._answer(500, "receiver down", text=True)
                if path == "/slack/webhook":
                    problem = slack_problem(payload)
                    if problem:
                        return self._answer(400, f"invalid_blocks: {problem}", text=True)
                    self._keep(receiver.slack_webhook, payload)
                    return self._answer(200, "ok", text=True)
                if path == "/teams":
                    problem = teams_problem(payload)
                    if problem:
                        return self._answer(400, {"error": problem})
                    self._keep(receiver.teams, payload)
                    return self._answer(202, "", text=True)
                if path == "/api/chat.postMessage":
                    if self.headers.get("Authorization") != f"Bearer {receiver.bot_token}":
                        return self._answer(200, {"ok": False, "error": "invalid_auth"})
                    problem = slack_problem(payload) or (None if payload.get("channel") else "channel_not_found")
                    if problem:
                        return self._answer(200, {"ok": False, "error": problem})
                    payload["ts"] = f"{time.time():.6f}"
                    self._keep(receiver.slack_posts, payload)
                    return self._answer(200, {"ok": True, "channel": payload["channel"], "ts": payload["ts"]})
                return self._answer(404, "no such path", text=True)

            def _keep(self, into: list[dict[str, Any]], payload: dict[str, Any]) -> None:
                with receiver.lock:
                    into.append(payload)
                    receiver.hold.arrived += 1
                receiver.hold.wait_if_held()

            def _answer(self, code: int, body: Any, *, text: bool = False) -> None:
                data = (body if text else json.dumps(body)).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="notification-receiver", daemon=True)

    def url(self, path: str) -> str:
        return f"http://localhost:{self.port}{path}"

    def __enter__(self) -> HttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hold.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
