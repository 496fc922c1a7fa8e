"""Hosted docs: a job's dbt docs site, from its latest successful run that generated it, as pages.

``/ui/jobs/{job}/docs/`` serves that run's ``index.html`` with its ``manifest.json`` and
``catalog.json`` inlined (what ``dbt docs generate --static`` does), so the site opens at once;
the two files are also served beside it. ``/ui/runs/{run}/docs/`` serves, the same way, the site a
given run made (what its run page links). Behind the account's login like every page; another
account's job or run is 404.

The site is the project's own HTML and JavaScript, so it is served sandboxed (a Content Security
Policy ``sandbox``): it runs in an origin of its own and can neither read the session cookie nor
call runplane's pages or API as the viewer.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from api.lookup import existing_job, existing_run
from api.store import Store
from api.web.layout import store_of
from api.web.session import Looking
from runplane.adapters.db import Connection
from runplane.basics.errors import NotFound
from runplane.basics.types import RunId

router = APIRouter(prefix="/ui", include_in_schema=False)
FILES = {
    "index.html": "text/html; charset=utf-8",
    "manifest.json": "application/json",
    "catalog.json": "application/json",
}
# dbt's docs page reads these placeholders, when replaced, instead of fetching the files.
INLINE = {"manifest.json": '"MANIFEST.JSON INLINE DATA"', "catalog.json": '"CATALOG.JSON INLINE DATA"'}
SANDBOX = "sandbox allow-scripts allow-popups allow-popups-to-escape-sandbox"


@router.get("/jobs/{job_id}/docs")
async def docs_root(job_id: int) -> RedirectResponse:
    return RedirectResponse(f"/ui/jobs/{job_id}/docs/", status_code=307)


@router.get("/jobs/{job_id}/docs/")
@router.get("/jobs/{job_id}/docs/{name}")
async def docs(request: Request, who: Looking, job_id: int, name: str = "index.html") -> Response:
    _known(name)
    store = store_of(request)
    async with store.connection() as conn:
        await existing_job(store, conn, who.account_id, job_id)
        run_id = await store.latest_docs_run(conn, who.account_id, job_id)
        if run_id is None:
            raise NotFound(f"job {job_id} has no successful run that generated docs yet")
        return await _site(store, conn, run_id, name)


@router.get("/runs/{run_id}/docs")
async def run_docs_root(run_id: int) -> RedirectResponse:
    return RedirectResponse(f"/ui/runs/{run_id}/docs/", status_code=307)


@router.get("/runs/{run_id}/docs/")
@router.get("/runs/{run_id}/docs/{name}")
async def run_docs(request: Request, who: Looking, run_id: int, name: str = "index.html") -> Response:
    """The docs site this run made (404 when it kept none)."""
    _known(name)
    store = store_of(request)
    async with store.connection() as conn:
        row = await existing_run(store, conn, who.account_id, run_id)
        return await _site(store, conn, RunId(row.id), name)


def _known(name: str) -> None:
    if name not in FILES:
        raise NotFound(f"the docs have no {name[:60]!r} (index.html, manifest.json, catalog.json)")


async def _site(store: Store, conn: Connection, run_id: RunId, name: str) -> Response:
    """One file of the site ``run_id`` kept, ``index.html`` with the others inlined, sandboxed."""
    files = {}
    for wanted in {name} | (set(INLINE) if name == "index.html" else set()):
        row = await store.get_artifact(conn, run_id, f"target/{wanted}", None)
        if row is not None:
            files[wanted] = bytes(row.content)
    if name not in files:
        raise NotFound(f"run {run_id} kept no {name}")
    content = files[name]
    if name == "index.html":
        for inlined, placeholder in INLINE.items():
            if inlined in files:  # "</" cannot end the page's script inside JSON's strings
                data = files[inlined].replace(b"</", b"<\\/")
                content = content.replace(placeholder.encode(), data, 1)
    headers = {"Content-Security-Policy": SANDBOX, "X-Content-Type-Options": "nosniff", "Cache-Control": "private"}
    return Response(content, media_type=FILES[name], headers=headers)
