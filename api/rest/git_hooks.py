"""Git webhooks: registering a repository (with a token), and the URL GitHub or GitLab posts to (signed)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from api.rest.auth import Account
from api.rest.envelope import ERROR_RESPONSES, Envelope, success
from api.webhooks.git_events import GitHooks

router = APIRouter(responses=ERROR_RESPONSES)


class GitHookBody(BaseModel):
    provider: Literal["github", "gitlab"]
    repository: str = Field(min_length=1, max_length=300, description="owner/name, or GitLab's path_with_namespace")
    job_ids: list[Annotated[int, Field(ge=1, le=2**63 - 1)]] = Field(default_factory=list, max_length=1000)


class GitHook(BaseModel):
    id: int
    provider: str
    repository: str
    job_ids: list[int]
    url_path: str = Field(description="Where the provider posts its events (on this server).")
    secret: str = Field(description="GitHub's webhook secret, or GitLab's secret token; shown once.")


class Received(BaseModel):
    run_ids: list[int]


def _hooks(request: Request) -> GitHooks:
    hooks: GitHooks = request.app.state.git_hooks
    return hooks


@router.post("/api/v3/accounts/{account_id}/git-webhooks/", summary="Register a repository's pull request events")
async def register(request: Request, account_id: Account, body: GitHookBody) -> Envelope[GitHook]:
    row, secret = await _hooks(request).register(account_id, body.provider, body.repository, body.job_ids)
    return Envelope[GitHook](
        status=success(),
        data=GitHook(
            id=row.id,
            provider=row.provider,
            repository=row.repository,
            job_ids=list(row.job_ids),
            url_path=f"/webhooks/{row.provider}/{row.id}/",
            secret=secret,
        ),
    )


@router.post("/webhooks/{provider}/{hook_id}/", summary="A GitHub or GitLab event (signed; no token)")
async def receive(
    request: Request,
    provider: Annotated[str, Path(max_length=20)],
    hook_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
) -> Envelope[Received]:
    body = await request.body()  # at most 25 MB: api.rest.body_limit refuses more while it is read
    headers = {k.lower(): v for k, v in request.headers.items()}
    run_ids = await _hooks(request).receive(provider, hook_id, headers, body)
    return Envelope[Received](status=success(), data=Received(run_ids=run_ids))
