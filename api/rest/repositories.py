"""Repositories made on their own in a project, as dbt Cloud's v3 API makes them: create, list, get and
delete. A project is then attached to one by ``repository_id`` (a project update): its URL and
credential become the project's, which runs clone from.

The repository URL is checked by the same rule as a project's inline repository, refused with the
same reasons. The credential (a deploy key or token) is write-only: encrypted as a project's, never
returned; an answer says whether one is set.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Request

from api import project_definitions as use
from api.lookup import existing_project
from api.rest import params, shapes
from api.rest.auth import Account
from api.rest.envelope import ERROR_RESPONSES, Envelope, Extra, ListEnvelope, Pagination, success
from api.rest.projects import (
    CLONE_STRATEGIES,
    MAX_LIMIT,
    PROJECT_NAMES,
    Limit,
    Offset,
    ProjectPath,
    RepositoryBody,
    _keys,
    _repositories,
    _store,
)
from api.rows import Repository
from api.store import Store
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.types import AccountId
from runplane.v1 import projects_pb2

router = APIRouter(responses=ERROR_RESPONSES)
RepositoryPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="Numeric id of the repository")]
Repositories = "/api/v3/accounts/{account_id}/projects/{project_id}/repositories/"
# The document's own field names for the repository's, in the errors of the shared checks.
REPOSITORY_NAMES = {ours: theirs.removeprefix("repository.") for ours, theirs in PROJECT_NAMES.items()}


class NewRepository(RepositoryBody):
    account_id: int | None = None
    project_id: int | None = None


async def _repository(store: Store, account_id: AccountId, project_id: int, repository_id: int) -> Repository:
    """The repository, when it is in the project; else 404 like a missing one."""
    async with store.connection() as conn:
        await existing_project(store, conn, account_id, project_id)
        row = await store.get_repository(conn, account_id, repository_id)
    if row is None or row.project_id != project_id:
        raise NotFound(f"repository {repository_id} not found in project {project_id}")
    return row


@router.post(Repositories, summary="Create a repository")
async def create_repository(
    request: Request, account_id: Account, project_id: ProjectPath, body: Annotated[NewRepository, Body()]
) -> Envelope[shapes.Repository]:
    params.same_account(body.account_id, account_id)
    if body.project_id is not None and body.project_id != project_id:
        raise InvalidArgument("project_id", f"names project {body.project_id}; the URL names project {project_id}")
    if body.git_clone_strategy not in CLONE_STRATEGIES:
        raise InvalidArgument("git_clone_strategy", "must be deploy_key, deploy_token or null")
    store = _store(request)
    async with store.connection() as conn:
        project = await existing_project(store, conn, account_id, project_id)
    request_pb = projects_pb2.CreateProjectRequest(
        name=project.name,
        repository_url=body.remote_url,
        git_credential_kind=CLONE_STRATEGIES[body.git_clone_strategy],
        git_credential=body.git_credential or "",
    )
    with params.named_as(REPOSITORY_NAMES):
        row = await use.create_repository(
            store, _keys(request), _repositories(request), account_id, request_pb, project_id=project_id
        )
    return Envelope[shapes.Repository](status=success(), data=shapes.repository(row))


@router.get(Repositories, summary="List repositories")
async def list_repositories(
    request: Request,
    account_id: Account,
    project_id: ProjectPath,
    *,
    remote_url: Annotated[str | None, Query(max_length=2048, description="The whole URL.")] = None,
    offset: Offset = 0,
    limit: Limit = MAX_LIMIT,
) -> ListEnvelope[shapes.Repository]:
    params.only_known(request.query_params, frozenset({"remote_url", "offset", "limit"}))
    store = _store(request)
    async with store.connection() as conn:
        await existing_project(store, conn, account_id, project_id)
        rows = await store.list_repositories(conn, account_id, project_id)
    kept = [r for r in rows if remote_url is None or r.remote_url == remote_url]
    page = kept[offset : offset + limit]
    filters = {"remote_url": remote_url} if remote_url is not None else {}
    extra = Extra(
        filters={**filters, "limit": limit, "offset": offset},
        order_by="id",
        pagination=Pagination(count=len(page), total_count=len(kept)),
    )
    return ListEnvelope[shapes.Repository](status=success(), data=[shapes.repository(r) for r in page], extra=extra)


@router.get(f"{Repositories}{{repository_id}}/", summary="Get a repository")
async def get_repository(
    request: Request, account_id: Account, project_id: ProjectPath, repository_id: RepositoryPath
) -> Envelope[shapes.Repository]:
    row = await _repository(_store(request), account_id, project_id, repository_id)
    return Envelope[shapes.Repository](status=success(), data=shapes.repository(row))


@router.delete(f"{Repositories}{{repository_id}}/", summary="Delete a repository")
async def delete_repository(
    request: Request, account_id: Account, project_id: ProjectPath, repository_id: RepositoryPath
) -> Envelope[shapes.Repository]:
    """200 with the deleted repository (state 2), as a project's delete answers. A project attached to
    it keeps the URL and credential it took."""
    store = _store(request)
    row = await _repository(store, account_id, project_id, repository_id)
    await use.delete_repository(store, account_id, repository_id)
    deleted = shapes.repository(row).model_copy(update={"state": shapes.DELETED})
    return Envelope[shapes.Repository](status=success(), data=deleted)
