"""Deleting jobs, projects and environments from the pages: a page that asks first, then a post (with
the forms' CSRF value and a ``job_admin`` token) to the same use cases as gRPC's and REST's deletes
(``api.job_definitions.delete_job``, ``api.project_definitions.delete_project``/``delete_environment``).
A refusal (a project or an environment still used by a job) is shown on the asking page."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from api.job_definitions import delete_job
from api.lookup import existing_environment, existing_job, existing_project
from api.project_definitions import delete_environment, delete_project
from api.web.layout import page, see_other, store_of
from api.web.session import Changing, Looking, Viewer
from runplane.basics.errors import FailedPrecondition

router = APIRouter(prefix="/ui", include_in_schema=False)


@dataclass(frozen=True)
class Deletion:
    """What the asking page says: the object, what goes with it, and where Cancel leads."""

    kind: str
    name: str
    object_id: int
    consequences: str
    cancel: str

    @property
    def action(self) -> str:
        return f"/ui/{self.kind}s/{self.object_id}/delete"


async def _asking(request: Request, who: Viewer, deletion: Deletion, refusal: str = "") -> HTMLResponse:
    answer = await page(request, "delete.html", who, deletion=deletion, refusal=refusal)
    answer.status_code = 409 if refusal else 200
    answer.headers["Cache-Control"] = "no-store"
    return answer


async def _job(request: Request, who: Viewer, job_id: int) -> Deletion:
    store = store_of(request)
    async with store.connection() as conn:
        row = await existing_job(store, conn, who.account_id, job_id)
    return Deletion(
        "job", row.name, row.id,
        "Its schedule and triggers stop, its queued runs are cancelled, and other jobs that run on its completion"
        " no longer do. Its past runs stay readable.",
        f"/ui/jobs/{row.id}",
    )  # fmt: skip


async def _project(request: Request, who: Viewer, project_id: int) -> Deletion:
    store = store_of(request)
    async with store.connection() as conn:
        row = await existing_project(store, conn, who.account_id, project_id)
    return Deletion(
        "project", row.name, row.id,
        "Its environments go with it and its stored credentials are forgotten. It cannot be deleted while a job"
        " uses one of its environments.",
        f"/ui/projects#project-{row.id}",
    )  # fmt: skip


async def _environment(request: Request, who: Viewer, environment_id: int) -> Deletion:
    store = store_of(request)
    async with store.connection() as conn:
        row = await existing_environment(store, conn, who.account_id, environment_id)
    return Deletion(
        "environment", row.name, row.id,
        "Its stored secrets are forgotten. It cannot be deleted while a job uses it.",
        f"/ui/projects#project-{row.project_id}",
    )  # fmt: skip


@router.get("/jobs/{job_id}/delete", response_class=HTMLResponse)
async def ask_job(request: Request, who: Looking, job_id: int) -> HTMLResponse:
    return await _asking(request, who, await _job(request, who, job_id))


@router.post("/jobs/{job_id}/delete", response_model=None)
async def job_deleted(request: Request, who: Changing, job_id: int) -> Response:
    await delete_job(store_of(request), who.account_id, job_id)
    return see_other("/ui/jobs")


@router.get("/projects/{project_id}/delete", response_class=HTMLResponse)
async def ask_project(request: Request, who: Looking, project_id: int) -> HTMLResponse:
    return await _asking(request, who, await _project(request, who, project_id))


@router.post("/projects/{project_id}/delete", response_model=None)
async def project_deleted(request: Request, who: Changing, project_id: int) -> Response:
    deletion = await _project(request, who, project_id)
    try:
        await delete_project(store_of(request), who.account_id, project_id)
    except FailedPrecondition as exc:
        return await _asking(request, who, deletion, str(exc))
    return see_other("/ui/projects")


@router.get("/environments/{environment_id}/delete", response_class=HTMLResponse)
async def ask_environment(request: Request, who: Looking, environment_id: int) -> HTMLResponse:
    return await _asking(request, who, await _environment(request, who, environment_id))


@router.post("/environments/{environment_id}/delete", response_model=None)
async def environment_deleted(request: Request, who: Changing, environment_id: int) -> Response:
    deletion = await _environment(request, who, environment_id)
    try:
        await delete_environment(store_of(request), who.account_id, environment_id)
    except FailedPrecondition as exc:
        return await _asking(request, who, deletion, str(exc))
    return see_other(deletion.cancel.split("#", 1)[0])
