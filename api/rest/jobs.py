"""Jobs and accounts as dbt Cloud's v2 lists them (and v3, where dbt Cloud's clients call these)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from api.lookup import existing_job
from api.pausing import set_paused
from api.rest import params, shapes
from api.rest.auth import Account, Caller
from api.rest.envelope import ERROR_RESPONSES, Envelope, Extra, ListEnvelope, Pagination, success
from api.store import Row, Store
from runplane.basics.errors import NotFound

router = APIRouter(responses=ERROR_RESPONSES)
MAX_LIMIT = 100
JobPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="Numeric id of the job")]


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


@router.get("/api/v2/accounts/{account_id}/jobs/", summary="List jobs")
async def list_jobs(
    request: Request,
    account_id: Account,
    *,
    order_by: Annotated[
        str | None, Query(max_length=40, description="id, name, created_at, updated_at; -x descending.")
    ] = None,
    project_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    environment_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    state: Annotated[int | None, Query(ge=1, le=2, description="1 active, 2 deleted")] = None,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = MAX_LIMIT,
) -> ListEnvelope[shapes.Job]:
    store = _store(request)
    order = params.order_by(order_by, params.JOB_ORDERS)
    async with store.connection() as conn:
        if project_id is not None or environment_id is not None or state == shapes.DELETED:
            rows, total = list[Row](), 0  # no projects or environments yet; deleted jobs are not listed
        else:
            rows, total = await store.jobs_by_offset(conn, account_id, order_by=order, offset=offset, limit=limit)
    return ListEnvelope[shapes.Job](
        status=success(),
        data=[shapes.job(r) for r in rows],
        extra=Extra(filters={}, order_by=order, pagination=Pagination(count=len(rows), total_count=total)),
    )


@router.get("/api/v2/accounts/{account_id}/jobs/{job_id}/", summary="Get a job")
async def get_job(request: Request, account_id: Account, job_id: JobPath) -> Envelope[shapes.Job]:
    store = _store(request)
    async with store.connection() as conn:
        row = await existing_job(store, conn, account_id, job_id)
    return Envelope[shapes.Job](status=success(), data=shapes.job(row))


@router.post("/api/v2/accounts/{account_id}/jobs/{job_id}/pause/", summary="Pause a job")
async def pause_job(request: Request, account_id: Account, job_id: JobPath) -> Envelope[shapes.Job]:
    """Nothing automatic queues a paused job (schedule, completion, Git events, retries); run now still does."""
    row = await set_paused(_store(request), account_id, job_id, paused=True)
    return Envelope[shapes.Job](status=success(), data=shapes.job(row))


@router.post("/api/v2/accounts/{account_id}/jobs/{job_id}/unpause/", summary="Unpause a job")
async def unpause_job(request: Request, account_id: Account, job_id: JobPath) -> Envelope[shapes.Job]:
    row = await set_paused(_store(request), account_id, job_id, paused=False)
    return Envelope[shapes.Job](status=success(), data=shapes.job(row))


@router.get("/api/v2/accounts/", summary="List the accounts this token can use")
async def list_accounts(request: Request, caller: Caller) -> Envelope[list[shapes.Account]]:
    async with _store(request).connection() as conn:
        row = await _store(request).get_account(conn, caller)
    return Envelope[list[shapes.Account]](status=success(), data=[] if row is None else [shapes.account(row)])


@router.get("/api/v2/accounts/{account_id}/", summary="Get an account")
async def get_account(request: Request, account_id: Account) -> Envelope[shapes.Account]:
    async with _store(request).connection() as conn:
        row = await _store(request).get_account(conn, account_id)
    if row is None:
        raise NotFound(f"account {account_id} not found")
    return Envelope[shapes.Account](status=success(), data=shapes.account(row))
