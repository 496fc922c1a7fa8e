"""Git webhooks in: GitHub ``pull_request`` and GitLab merge request events start CI and merge runs.

A hook belongs to one account and one repository and has its own secret: GitHub signs the body
(``X-Hub-Signature-256: sha256=<hmac>``), GitLab sends the secret itself (``X-Gitlab-Token``).
A request that fails the check is Unauthenticated and changes nothing. An event starts the jobs
whose project uses the event's repository (and jobs of plain commands, which have no project);
a job whose project is another repository is never started by it.

- opened / synchronize / reopened (GitLab: open / reopen / update with new commits): a CI run of
  each CI job that runs on pull requests, at the head SHA, in the pull request's schema;
- merged: a run of each merge job at the merge commit;
- closed, merged or not (GitLab: close / merge): the pull request's schemas are dropped
  (:mod:`api.pull_requests`: a drop run for each CI job that built one) and its CI runs stopped.

Each run's idempotency key names the hook, pull request, SHA and job, so a redelivered event
starts nothing twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from api.pickup_publisher import PickupPublisher
from api.pull_requests import close_pull_request
from api.store import Store
from api.triggering import trigger_run
from api.validation import RunOverridesSpec, TriggerSpec, checked_overrides, text
from api.webhooks.rows import GitWebhook, RepositoryJob
from runplane.adapters.db import fetch_all, fetch_one
from runplane.basics.errors import InvalidArgument, NotFound, Unauthenticated
from runplane.basics.secrets import SecretBox
from runplane.basics.types import AccountId, JobId, Trigger
from runplane.sql import load_queries

log = logging.getLogger(__name__)
Q = load_queries("api.webhooks")
PROVIDERS = ("github", "gitlab")
REQUEST_NAMES = {"github": "pull request", "gitlab": "merge request"}


@dataclass(frozen=True)
class GitEvent:
    """What runplane reads of a pull/merge request event."""

    kind: str  # "ci", "merge", "close" or "" (nothing to run)
    repository: str
    number: int
    sha: str
    branch: str
    action: str


def github_event(event_name: str, payload: dict[str, Any]) -> GitEvent:
    if event_name != "pull_request":
        return GitEvent("", "", 0, "", "", event_name)
    pr = payload["pull_request"]
    action = payload["action"]
    repository = payload["repository"]["full_name"]
    if action in ("opened", "synchronize", "reopened"):
        return GitEvent("ci", repository, int(payload["number"]), pr["head"]["sha"], pr["head"]["ref"], action)
    if action == "closed" and pr.get("merged"):
        sha = pr.get("merge_commit_sha") or pr["head"]["sha"]
        return GitEvent("merge", repository, int(payload["number"]), sha, pr["base"]["ref"], "merged")
    if action == "closed":
        return GitEvent("close", repository, int(payload["number"]), "", "", action)
    return GitEvent("", repository, int(payload["number"]), "", "", action)


def gitlab_event(event_name: str, payload: dict[str, Any]) -> GitEvent:
    if event_name != "Merge Request Hook":
        return GitEvent("", "", 0, "", "", event_name)
    mr = payload["object_attributes"]
    action = mr.get("action", "")
    repository = payload["project"]["path_with_namespace"]
    number = int(mr["iid"])
    new_commits = action == "update" and "oldrev" in mr
    if action in ("open", "reopen") or new_commits:
        return GitEvent("ci", repository, number, mr["last_commit"]["id"], mr["source_branch"], action)
    if action == "merge":
        sha = mr.get("merge_commit_sha") or mr["last_commit"]["id"]
        return GitEvent("merge", repository, number, sha, mr["target_branch"], action)
    if action == "close":
        return GitEvent("close", repository, number, "", "", action)
    return GitEvent("", repository, number, "", "", action)


class GitHooks:
    def __init__(self, store: Store, pickups: PickupPublisher, box: SecretBox | None) -> None:
        self._store = store
        self._pickups = pickups
        self._box = box

    async def register(
        self, account_id: AccountId, provider: str, repository: str, job_ids: list[int]
    ) -> tuple[GitWebhook, str]:
        """A hook for ``repository`` (or the same one with a new secret), and its secret in clear, once."""
        if provider not in PROVIDERS:
            raise InvalidArgument("provider", "must be github or gitlab")
        repository = text(repository.strip().strip("/"), "repository", max_length=300, required=True)
        if self._box is None:
            raise InvalidArgument(
                "provider", "git webhooks need RUNPLANE_SECRET_KEYS on the API (secrets are encrypted)"
            )
        secret = secrets.token_hex(32)
        async with self._store.transaction() as conn:
            live = await self._store.live_job_ids(conn, account_id, job_ids) if job_ids else set()
            for job_id in job_ids:
                if job_id not in live:
                    raise InvalidArgument("job_ids", f"job {job_id} not found")
            row = await fetch_one(
                conn,
                Q["insert_git_webhook"],
                {
                    "account_id": account_id,
                    "provider": provider,
                    "repository": repository,
                    "secret": self._box.encrypt(secret),
                    "job_ids": sorted(set(job_ids)),
                },
                GitWebhook,
            )
        assert row is not None
        return row, secret

    async def receive(self, provider: str, hook_id: int, headers: dict[str, str], body: bytes) -> list[int]:
        """Check the request, then queue the runs the event asks for; the new (or replayed) run ids."""
        hook = await self._hook(provider, hook_id)
        secret = self._box.decrypt(hook.secret) if self._box else ""
        if not secret or not _authentic(provider, secret, headers, body):
            raise Unauthenticated("the webhook's signature or token does not match")
        try:
            payload = json.loads(body)
            parse = github_event if provider == "github" else gitlab_event
            event = parse(headers.get("x-github-event" if provider == "github" else "x-gitlab-event", ""), payload)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument("body", f"not a {provider} pull/merge request event: {exc}") from None
        if not event.kind or event.repository.lower() != hook.repository.lower():
            log.info("git event ignored", extra={"account_id": hook.account_id, "action": event.action})
            return []
        account_id = AccountId(hook.account_id)
        run_ids: list[int] = []
        if event.kind in ("close", "merge"):  # merged is closed too: the pull request's schemas go
            ci_jobs = await self._jobs_of_repository("ci_jobs_for_closed_pull_request", account_id, hook, event)
            if ci_jobs:  # none of this repository: nothing of another's is dropped
                why = f"{provider} {REQUEST_NAMES[provider]} #{event.number} {event.action}"
                drops = await close_pull_request(
                    self._store,
                    self._pickups,
                    account_id,
                    event.number,
                    job_ids=ci_jobs,
                    why=why,
                    require_jobs=False,
                )
                run_ids += [row.id for row in drops]
            if event.kind == "close":
                return run_ids
        job_ids = await self._jobs_of_repository("jobs_for_git_event", account_id, hook, event)
        for job_id in job_ids:
            overrides = checked_overrides(
                RunOverridesSpec(
                    git_sha=event.sha,
                    git_branch=event.branch,
                    pull_request_number=event.number,
                    pull_request_provider=provider,
                ),
                lambda name: f"{provider} event {name}",
            )
            spec = TriggerSpec(
                JobId(job_id),
                Trigger.CI if event.kind == "ci" else Trigger.MERGE,
                f"{provider} {REQUEST_NAMES[provider]} #{event.number} {event.action}",
                f"git:{hook.id}:{event.number}:{event.sha}:{job_id}",
                overrides,
                same_request_on_retry=False,
            )
            row, _ = await trigger_run(self._store, self._pickups, account_id, spec)
            run_ids.append(row.id)
        return run_ids

    async def _jobs_of_repository(
        self, query: str, account_id: AccountId, hook: GitWebhook, event: GitEvent
    ) -> list[int]:
        """The hook's jobs that ``query`` finds whose project is the event's repository, and its jobs of
        plain commands (they have no project)."""
        async with self._store.connection() as conn:
            params = {"account_id": account_id, "kind": event.kind, "job_ids": hook.job_ids}
            rows = await fetch_all(conn, Q[query], params, RepositoryJob)
        return [r.id for r in rows if r.repository_url is None or is_repository(r.repository_url, event.repository)]

    async def _hook(self, provider: str, hook_id: int) -> GitWebhook:
        if provider not in PROVIDERS:
            raise NotFound(f"no {provider[:20]} webhooks")
        async with self._store.connection() as conn:
            row = await fetch_one(conn, Q["get_git_webhook"], {"id": hook_id, "provider": provider}, GitWebhook)
        if row is None:
            raise Unauthenticated("the webhook's signature or token does not match")  # unknown hooks look alike
        return row


def repository_path(url: str) -> str:
    """A git URL as the ``owner/name`` path the providers name repositories by, lower case.

    ``https://github.com/Owner/Name.git``, ``git@github.com:Owner/Name.git`` and
    ``ssh://git@github.com/Owner/Name`` are all ``owner/name``; GitLab's subgroups stay in the path.
    """
    url = url.strip()
    if "://" in url:
        path = urlsplit(url).path
    elif ":" in url.split("/", 1)[0]:  # scp-like: git@host:owner/name.git
        path = url.split(":", 1)[1]
    else:
        path = url
    path = path.strip("/")
    return path.removesuffix(".git").lower()


def is_repository(url: str, name: str) -> bool:
    """Whether the git ``url`` is the provider's repository ``name`` (``owner/name``).

    A hosted URL names it exactly; a local repository (``file://`` or a path: a mirror or a clone on
    this machine) does when its path ends with it, as ``/srv/git/owner/name.git`` does.
    """
    path, wanted = repository_path(url), name.strip("/").lower()
    if url.startswith(("file://", "/")):
        return path == wanted or path.endswith("/" + wanted)
    return path == wanted


def _authentic(provider: str, secret: str, headers: dict[str, str], body: bytes) -> bool:
    # Compared as bytes: compare_digest refuses a str with non-ASCII characters (a header may hold any).
    if provider == "github":
        expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected.encode(), headers.get("x-hub-signature-256", "").encode())
    return hmac.compare_digest(secret.encode(), headers.get("x-gitlab-token", "").encode())
