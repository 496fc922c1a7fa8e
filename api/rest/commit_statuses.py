"""A project's commit statuses: where its pull requests' CI runs report their state, and what they sent.

runplane's own calls (dbt Cloud keeps this in its Git integration): ``PUT`` sets the provider, the
repository, the API's base URL and the token (write-only: answers say ``token_set``; a ``PUT``
without one keeps the stored token), ``GET`` reads it, ``DELETE`` stops the statuses. A run's
statuses, each with its attempts and last error, are at ``.../runs/{id}/commit-statuses/``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from api.rest.auth import Account
from api.rest.envelope import ERROR_RESPONSES, Envelope, success
from api.rest.shapes import stamp
from api.webhooks.commit_statuses import CommitStatusTarget, CommitStatusTargets

router = APIRouter(responses=ERROR_RESPONSES)
BASE = "/api/v3/accounts/{account_id}"
Id = Annotated[int, Path(ge=1, le=2**63 - 1)]


class TargetBody(BaseModel):
    provider: str = Field(description="github or gitlab")
    repository: str = Field(max_length=300, description="GitHub's owner/name, or GitLab's project id or path")
    api_url: str = Field("", max_length=2048, description="The provider's API; empty: github.com's or gitlab.com's")
    token: str = Field("", max_length=1000, description="Write-only; empty keeps the stored one")


class Target(BaseModel):
    project_id: int
    provider: str
    repository: str
    api_url: str
    token_set: bool
    created_at: str | None
    updated_at: str | None


class SentStatus(BaseModel):
    id: int
    run_id: int
    sha: str
    state: str
    description: str
    context: str
    attempts: int
    last_status_code: int | None
    last_error: str
    delivered_at: str | None
    abandoned_at: str | None
    superseded_at: str | None


class Deleted(BaseModel):
    project_id: int


def _targets(request: Request) -> CommitStatusTargets:
    targets: CommitStatusTargets = request.app.state.commit_status_targets
    return targets


def _view(row: CommitStatusTarget) -> Target:
    return Target(
        project_id=row.project_id,
        provider=row.provider,
        repository=row.repository,
        api_url=row.api_url,
        token_set=row.token_set,
        created_at=stamp(row.created_at),
        updated_at=stamp(row.updated_at),
    )


@router.put(f"{BASE}/projects/{{project_id}}/commit-statuses/", summary="Set where a project posts commit statuses")
async def put(request: Request, account_id: Account, project_id: Id, body: TargetBody) -> Envelope[Target]:
    row = await _targets(request).put(
        account_id,
        project_id,
        provider=body.provider,
        repository=body.repository,
        api_url=body.api_url,
        token=body.token,
    )
    return Envelope[Target](status=success(), data=_view(row))


@router.get(f"{BASE}/projects/{{project_id}}/commit-statuses/", summary="Where a project posts commit statuses")
async def get(request: Request, account_id: Account, project_id: Id) -> Envelope[Target]:
    return Envelope[Target](status=success(), data=_view(await _targets(request).get(account_id, project_id)))


@router.delete(f"{BASE}/projects/{{project_id}}/commit-statuses/", summary="Stop a project's commit statuses")
async def delete(request: Request, account_id: Account, project_id: Id) -> Envelope[Deleted]:
    await _targets(request).delete(account_id, project_id)
    return Envelope[Deleted](status=success(), data=Deleted(project_id=project_id))


@router.get(f"{BASE}/runs/{{run_id}}/commit-statuses/", summary="The commit statuses a run posted")
async def of_run(request: Request, account_id: Account, run_id: Id) -> Envelope[list[SentStatus]]:
    rows = await _targets(request).of_run(account_id, run_id)
    return Envelope[list[SentStatus]](
        status=success(),
        data=[
            SentStatus(
                id=r.id,
                run_id=r.run_id,
                sha=r.sha,
                state=r.state,
                description=r.description,
                context=r.context,
                attempts=r.attempts,
                last_status_code=r.last_status_code,
                last_error=r.last_error,
                delivered_at=stamp(r.delivered_at),
                abandoned_at=stamp(r.abandoned_at),
                superseded_at=stamp(r.superseded_at),
            )
            for r in rows
        ],
    )
