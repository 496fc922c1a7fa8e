"""Commit statuses: a pull request's CI run reports its state to the Git provider it came from.

A project names where its statuses go (:class:`CommitStatusTargets`): GitHub (``POST
/repos/{owner}/{repo}/statuses/{sha}``, ``Authorization: Bearer <token>``) or GitLab (``POST
/projects/{id}/statuses/{sha}``, ``PRIVATE-TOKEN: <token>``), the API's base URL (GitHub Enterprise
or a self-managed GitLab have their own) and the token, stored encrypted and never answered.

The outbox is filled by a trigger on ``runs`` (migration 0033) in the transaction that queues a CI
run or changes its status: queued and running are *pending* (GitLab: *pending*, *running*), then
*success*, *failure* (GitLab *failed*) or, for a cancelled run, GitHub's *error* and GitLab's
*canceled*; each links to the run's page and is named ``runplane/<job name>``. The
:class:`CommitStatusDeliverer`, a task of each API process as the webhooks' is, sends them at
least once with the webhooks' rules: a lease per claimed state, backoff between attempts, the
provider's address checked as a webhook's is (``webhooks.allowed_networks``). A run's states go out
in the order they happened, and a state that a newer one of its run replaced before it could be
sent is skipped, so a retried *pending* never lands after its *success*.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from psycopg_pool import AsyncConnectionPool

from api.store import Store
from api.validation import text
from api.webhooks.deliveries import backoff
from api.webhooks.targets import TargetPolicy, TargetRefused
from runplane.adapters.db import Connection, fetch_all, fetch_one
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import ApiSettings, WebhookSettings
from runplane.basics.supervise import sleep_or_stop
from runplane.basics.types import AccountId
from runplane.sql import load_queries

log = logging.getLogger(__name__)
Q = load_queries("api.webhooks", "commit_statuses.sql")

PROVIDERS = ("github", "gitlab")
DEFAULT_API_URLS = {"github": "https://api.github.com", "gitlab": "https://gitlab.com/api/v4"}
# runplane's states (the outbox's) in each provider's words.
GITHUB_STATES = {"queued": "pending", "running": "pending", "success": "success", "failure": "failure"}
GITLAB_STATES = {"queued": "pending", "running": "running", "success": "success", "failure": "failed"}
MAX_TOKEN = 1000


@dataclass(frozen=True, slots=True)
class CommitStatusTarget:
    """Where a project's CI runs post their statuses; the token itself never leaves the store."""

    project_id: int
    account_id: AccountId
    provider: str
    repository: str
    api_url: str
    token_set: bool
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class SentStatus:
    """A row of the outbox as an account sees it (no token)."""

    id: int
    run_id: int
    sha: str
    state: str
    description: str
    context: str
    attempts: int
    last_status_code: int | None
    last_error: str
    delivered_at: datetime | None
    abandoned_at: datetime | None
    superseded_at: datetime | None


@dataclass(frozen=True, slots=True)
class _Due:
    id: int
    run_id: int
    sha: str
    state: str
    description: str
    context: str
    attempts: int
    provider: str
    repository: str
    api_url: str
    token: str


@dataclass(frozen=True)
class StatusRequest:
    """One status as the provider's API takes it."""

    url: str
    headers: dict[str, str]
    body: dict[str, str]


def provider_state(provider: str, state: str) -> str:
    """The provider's word for runplane's ``state`` (a cancelled run is GitHub's error)."""
    if state == "cancelled":
        return "error" if provider == "github" else "canceled"
    return (GITHUB_STATES if provider == "github" else GITLAB_STATES)[state]


def status_request(
    *,
    provider: str,
    api_url: str,
    repository: str,
    token: str,
    sha: str,
    state: str,
    description: str,
    context: str,
    target_url: str,
) -> StatusRequest:
    """The request that sets one commit status, in the provider's documented shape."""
    base = api_url.rstrip("/")
    body = {
        "state": provider_state(provider, state),
        "target_url": target_url,
        "description": description,
        "context": context,
    }
    match provider:
        case "github":
            return StatusRequest(
                f"{base}/repos/{repository}/statuses/{sha}",
                {
                    "Authorization": f"Bearer {token}",
                    "Accept": "application/vnd.github+json",
                    "X-GitHub-Api-Version": "2022-11-28",
                },
                body,
            )
        case "gitlab":
            # GitLab names the project by id or by its URL-encoded path; `name` is `context`'s other name.
            return StatusRequest(
                f"{base}/projects/{quote(repository, safe='')}/statuses/{sha}",
                {"PRIVATE-TOKEN": token},
                {**body, "name": context},
            )
        case _:
            raise ValueError(f"no commit statuses for {provider}")


class CommitStatusTargets:
    """A project's commit status settings: set (the token write-only), read, removed."""

    def __init__(self, store: Store, box: SecretBox | None, targets: TargetPolicy) -> None:
        self._store = store
        self._box = box
        self._targets = targets

    async def put(
        self, account_id: AccountId, project_id: int, *, provider: str, repository: str, api_url: str, token: str
    ) -> CommitStatusTarget:
        """Set where the project's CI runs post statuses; an empty ``token`` keeps the stored one."""
        if provider not in PROVIDERS:
            raise InvalidArgument("provider", "must be github or gitlab")
        repository = text(repository.strip().strip("/"), "repository", max_length=300, required=True)
        api_url = text((api_url or DEFAULT_API_URLS[provider]).strip(), "api_url", max_length=2048, required=True)
        parts = urlsplit(api_url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise InvalidArgument("api_url", "must be an http(s) URL with a host")
        self._targets.check_url(api_url)
        token = text(token, "token", max_length=MAX_TOKEN)
        if self._box is None:
            raise InvalidArgument("token", "commit statuses need RUNPLANE_SECRET_KEYS on the API (encrypted tokens)")
        async with self._store.transaction() as conn:
            if await self._store.get_project(conn, account_id, project_id, for_update=True) is None:
                raise NotFound(f"project {project_id} not found")
            if not token and await self._get(conn, account_id, project_id) is None:
                raise InvalidArgument("token", "the provider's token is required")
            row = await fetch_one(
                conn,
                Q["put_commit_status_target"],
                {
                    "project_id": project_id,
                    "account_id": account_id,
                    "provider": provider,
                    "repository": repository,
                    "api_url": api_url,
                    "token": self._box.encrypt(token) if token else "",
                },
                CommitStatusTarget,
            )
        assert row is not None
        return row

    async def get(self, account_id: AccountId, project_id: int) -> CommitStatusTarget:
        async with self._store.connection() as conn:
            row = await self._get(conn, account_id, project_id)
        if row is None:
            raise NotFound(f"project {project_id} posts no commit statuses")
        return row

    async def delete(self, account_id: AccountId, project_id: int) -> None:
        async with self._store.transaction() as conn:
            cur = await conn.execute(
                Q["delete_commit_status_target"], {"account_id": account_id, "project_id": project_id}
            )
            if cur.rowcount == 0:
                raise NotFound(f"project {project_id} posts no commit statuses")

    async def of_run(self, account_id: AccountId, run_id: int) -> list[SentStatus]:
        """The statuses a run posted (or is posting), oldest first."""
        async with self._store.connection() as conn:
            return await fetch_all(
                conn, Q["commit_statuses_of_run"], {"account_id": account_id, "run_id": run_id}, SentStatus
            )

    async def _get(self, conn: Connection, account_id: AccountId, project_id: int) -> CommitStatusTarget | None:
        params = {"account_id": account_id, "project_id": project_id}
        return await fetch_one(conn, Q["get_commit_status_target"], params, CommitStatusTarget)


class CommitStatusDeliverer:
    """Sends the commit status outbox, as :class:`api.webhooks.deliveries.WebhookDeliverer` sends webhooks.

    ``public_url`` is where people reach the API's pages: each status links to
    ``{public_url}/ui/runs/{run id}/``.
    """

    def __init__(
        self, pool: AsyncConnectionPool[Connection], box: SecretBox, settings: WebhookSettings, public_url: str
    ) -> None:
        self._pool = pool
        self._box = box
        self._settings = settings
        self._targets = TargetPolicy(settings.allowed_networks)
        self._pages = ApiSettings(public_url=public_url)

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; a pass that found work is followed at once by another."""
        async with httpx.AsyncClient(timeout=self._settings.timeout, follow_redirects=False) as http:
            while not stop.is_set():
                try:
                    busy = await self.deliver_due(http)
                except Exception as exc:  # Postgres away: the outbox waits, this task does not die
                    log.warning("commit status deliveries paused: %s", exc)
                    busy = False
                if not busy and await sleep_or_stop(stop, self._settings.poll_interval):
                    return

    async def deliver_due(self, http: httpx.AsyncClient) -> bool:
        """Claim and send one batch; True when the batch was full (more may be due)."""
        async with self._pool.connection() as conn:
            await conn.execute(Q["supersede_commit_statuses"])
            params = {"lease": self._settings.lease_seconds, "limit": self._settings.batch_size}
            due = await fetch_all(conn, Q["claim_commit_statuses"], params, _Due)
        if due:
            await asyncio.gather(*(self._deliver(http, status) for status in due))
        return len(due) == self._settings.batch_size

    async def _deliver(self, http: httpx.AsyncClient, due: _Due) -> None:
        status_code: int | None = None
        error = ""
        try:
            request = status_request(
                provider=due.provider,
                api_url=due.api_url,
                repository=due.repository,
                token=self._box.decrypt(due.token),
                sha=due.sha,
                state=due.state,
                description=due.description,
                context=due.context,
                target_url=self._pages.run_page(due.run_id),
            )
            target = await self._targets.resolve(request.url)
            headers = {**request.headers, "Host": target.host_header, "User-Agent": "runplane-commit-statuses"}
            extensions: dict[str, Any] = {"sni_hostname": target.server_name} if target.server_name else {}
            response = await http.post(target.url, json=request.body, headers=headers, extensions=extensions)
            status_code = response.status_code
            if not response.is_success:
                error = f"HTTP {status_code}: {response.text[:200]}"
        except TargetRefused as exc:
            error = f"refused: {exc}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a token no key opens, a provider no longer known: recorded, retried
            error = f"{type(exc).__name__}: {exc}"
        delivered = not error
        async with self._pool.connection() as conn:
            await conn.execute(
                Q["record_commit_status_attempt"],
                {
                    "id": due.id,
                    "status_code": status_code,
                    "error": error[:500],
                    "delivered": delivered,
                    "max_attempts": self._settings.max_attempts,
                    "retry_after": backoff(self._settings, due.attempts),
                },
            )
        extra = {"run_id": due.run_id, "state": due.state, "attempt": due.attempts, "status_code": status_code}
        if delivered:
            log.debug("commit status delivered", extra=extra)
        else:
            log.info("commit status delivery failed: %s", error, extra=extra)
