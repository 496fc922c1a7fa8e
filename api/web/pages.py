"""The pages under ``/ui/``: login, runs, a run (live log, artifacts, cancel, rerun), jobs, on time.

Every read and change goes through the APIs' own rules: ``lookup`` (another account's ids are 404
like missing ones), ``triggering``, ``cancelling`` and the token scopes of ``session``.
"""

from __future__ import annotations

import asyncio
import json
import mimetypes
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Form, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse

from api.cancelling import cancel_run
from api.lookup import existing_job, existing_run, run_artifact
from api.pausing import set_paused
from api.rerunning import rerun_from_failure
from api.triggering import rerun_spec, trigger_run
from api.validation import (
    MAX_CAUSE,
    RunOverridesSpec,
    TriggerSpec,
    checked_idempotency_key,
    checked_overrides,
    later_time,
    text,
)
from api.web import notices, views
from api.web.form_fields import FormErrors, lines, number
from api.web.layout import dbt_versions_of, page, see_other, store_of
from api.web.session import (
    COOKIE,
    CSRF_FIELD,
    LOGIN_CSRF_COOKIE,
    Changing,
    Looking,
    Posting,
    Viewer,
    login_csrf,
    login_csrf_matches,
    sessions_of,
    viewer,
)
from runplane.basics.errors import InvalidArgument, Problems, RunplaneError
from runplane.basics.overlap import OVERLAP_WORDS
from runplane.basics.supervise import sleep_or_stop
from runplane.basics.types import JobId, RunId, RunStatus, Trigger, WaitingReason

router = APIRouter(prefix="/ui", include_in_schema=False)
PAGE_SIZE = 50
LOG_BATCH = 500
WINDOWS = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(days=1), "7d": timedelta(days=7)}
PING_SECONDS = 15.0
SESSION_CHECK_SECONDS = 15.0  # a followed log stops this long at most after its session ended
RUN_RESULTS = "target/run_results.json"
DOCS_SITE = "target/index.html"  # a run that kept it made a docs site (api.web.docs)
MAX_SHOWN_BYTES = 5 * 1024 * 1024  # larger artifacts are downloaded, not drawn on a page
VIEWABLE = frozenset({"json", "log", "txt", "sql", "yml", "yaml", "md", "csv"})
REFRESH_SECONDS = 30
CHART_RUNS = 50
RUN_NOW_FIELDS = {
    "cause", "steps", "git_branch", "git_sha", "schema", "target_name", "threads", "timeout_seconds",
    "pull_request_number", "run_at", "generate_docs", "dbt_version",
}  # fmt: skip
GENERATE_DOCS = {"on": True, "off": False}  # the Run now choice; empty: the job's setting


@dataclass(frozen=True)
class WebConfig:
    """How the pages follow a log: the API's poll interval, and the event that ends followers on drain."""

    log_poll_interval: float
    draining: asyncio.Event


def _safe_next(value: str) -> str:
    """Only a path of these pages: a login link must not send the browser elsewhere."""
    return value if value.startswith("/ui/") and not value.startswith("//") and "\\" not in value else "/ui/runs"


# -- login ----------------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
async def home() -> RedirectResponse:
    return see_other("/ui/runs")


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, next: str = "/ui/runs") -> HTMLResponse:
    return await _login_page(request, next, "", 200)


async def _login_page(request: Request, next: str, error: str, status: int) -> HTMLResponse:
    """The login form, with a fresh CSRF value in it and in a cookie only this path sees."""
    value = login_csrf()
    answer = await page(request, "login.html", None, next=_safe_next(next), error=error, login_csrf=value)
    answer.status_code = status
    secure = request.url.scheme == "https"
    answer.set_cookie(LOGIN_CSRF_COOKIE, value, httponly=True, samesite="strict", secure=secure, path="/ui/login")
    return answer


@router.post("/login", response_class=HTMLResponse)
async def login(
    request: Request,
    token: Annotated[str, Form(max_length=500)] = "",
    next: Annotated[str, Form()] = "/ui/runs",
    csrf_token: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    if not login_csrf_matches(request.cookies.get(LOGIN_CSRF_COOKIE, ""), csrf_token):
        error = "This login form was out of date or did not come from runplane's pages; log in again."
        return await _login_page(request, next, error, 403)
    sessions = sessions_of(request)
    started = await sessions.start(token)
    if started is None:
        return await _login_page(request, next, "Unknown, revoked or expired token.", 401)
    session_id, _ = started
    await sessions.end(request.cookies.get(COOKIE, ""))  # a session this browser had before is replaced
    response = see_other(_safe_next(next))
    response.set_cookie(
        COOKIE, session_id, httponly=True, samesite="lax", secure=request.url.scheme == "https", path="/ui"
    )
    response.delete_cookie(LOGIN_CSRF_COOKIE, path="/ui/login")
    return response


@router.get("/time-zone")
async def time_zone(zone: Annotated[str, Query(max_length=64)], next: str = "/ui/runs") -> RedirectResponse:
    """Show times in ``zone`` (an IANA name; UTC for one this machine does not know) from now on."""
    response = see_other(_safe_next(next))
    response.set_cookie(
        views.ZONE_COOKIE, str(views.viewer_zone(zone)), max_age=366 * 86400, samesite="lax", path="/ui"
    )
    return response


@router.post("/logout")
async def logout(request: Request, who: Posting) -> RedirectResponse:
    """The session ends on the server: its cookie, kept or copied, no longer opens a page."""
    await sessions_of(request).end(request.cookies.get(COOKIE, ""))
    response = see_other("/ui/login")
    response.delete_cookie(COOKIE, path="/ui")
    return response


# -- runs -----------------------------------------------------------------------------------------


def _cursor(value: str | None) -> RunId | None:
    """A page's position: the id of the last run of the page before.

    Links made when pages were ordered by queue time (``<queued_at>~<id>``) still work: the id is enough.
    """
    if not value:
        return None
    try:
        return RunId(int(value.rpartition("~")[2]))
    except ValueError:
        raise InvalidArgument("after", "is not a position in this list; start from the first page") from None


def _time(value: str | None, field: str, zone: tzinfo) -> datetime | None:
    """A filter's time as ``datetime-local`` sends it (in the viewer's zone), or an ISO time with a zone."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(field, f"{value[:40]!r} is not a time (YYYY-MM-DDTHH:MM)") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=zone)


def _id_filter(value: str | None, field: str, what: str) -> int | None:
    """A filter's id: empty for all (what the form's "all …" sends)."""
    if not value or not value.strip():
        return None
    if not value.strip().isdigit() or not 1 <= int(value) < 2**63:
        raise InvalidArgument(field, f"{value[:20]!r} is not one of this account's {what}")
    return int(value)


def _choice(value: str | None, allowed: dict[str, Any], field: str) -> Any:
    if not value:
        return None
    if value not in allowed:
        raise InvalidArgument(field, f"{value[:40]!r} is not one of {', '.join(allowed)}")
    return allowed[value]


STATUSES = {s.name.lower(): int(s) for s in RunStatus}
WAITING = {str(w.value): str(w.value) for w in WaitingReason if w.value}
TRIGGERS = {t.value: t.value for t in Trigger}


@router.get("/runs", response_class=HTMLResponse)
async def runs(
    request: Request,
    who: Looking,
    *,
    job: Annotated[str | None, Query(max_length=20)] = None,
    environment: Annotated[str | None, Query(max_length=20)] = None,
    project: Annotated[str | None, Query(max_length=20)] = None,
    status: str | None = None,
    cause: str | None = None,
    since: str | None = None,
    until: str | None = None,
    delay: str | None = None,
    waiting: str | None = None,
    after: Annotated[str | None, Query(max_length=80)] = None,
) -> HTMLResponse:
    zone = views.viewer_zone(request.cookies.get(views.ZONE_COOKIE))
    job_id = _id_filter(job, "job", "jobs")
    environment_id = _id_filter(environment, "environment", "environments")
    project_id = _id_filter(project, "project", "projects")
    filters = {
        "job_id": job_id,
        "environment_id": environment_id,
        "project_id": project_id,
        "status": _choice(status, STATUSES, "status"),
        "trigger": _choice(cause, TRIGGERS, "cause"),
        "since": _time(since, "since", zone),
        "until": _time(until, "until", zone),
        "delay": _choice(delay, {k: k for k in views.DELAY_WORDS}, "delay"),
        "waiting": _choice(waiting, WAITING, "waiting"),
    }
    store = store_of(request)
    async with store.connection() as conn:
        rows = await store.runs_page(conn, who.account_id, filters=filters, after=_cursor(after), limit=PAGE_SIZE + 1)
        jobs = await store.job_names(conn, who.account_id)
        projects = await store.list_projects(conn, who.account_id)
        environments = await store.list_environments(conn, who.account_id, None)
    more, rows = len(rows) > PAGE_SIZE, rows[:PAGE_SIZE]
    asked = {
        "job": job_id,
        "environment": environment_id,
        "project": project_id,
        "status": status,
        "cause": cause,
        "since": since,
        "until": until,
        "delay": delay,
    }
    query = {k: v for k, v in {**asked, "waiting": waiting}.items() if v}
    older = None
    if more:
        last = rows[-1]
        older = "/ui/runs?" + urlencode({**query, "after": str(last.id)})
    now = datetime.now(UTC)
    return await page(
        request,
        "runs.html",
        who,
        rows=[(row, views.RunTimes.of(row, now), views.waiting_words(row)) for row in rows],
        jobs=jobs,
        projects=projects,
        environments=[(e, next((p.name for p in projects if p.id == e.project_id), "")) for e in environments],
        schema_of=views.schema_of,
        sha_of=views.sha_of,
        statuses=list(STATUSES),
        triggers=list(TRIGGERS),
        query=query,
        shown_as=views.DELAY_WORDS.get(delay or "") or (views.WAITING_WORDS[WaitingReason(waiting)] if waiting else ""),
        first=("/ui/runs?" + urlencode(query)) if after else None,
        older=older,
    )


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run(request: Request, who: Looking, run_id: int) -> HTMLResponse:
    store = store_of(request)
    async with store.connection() as conn:
        row = await existing_run(store, conn, who.account_id, run_id)
        steps = (await store.run_steps(conn, [row.id]))[row.id]
        artifacts = await store.list_artifacts(conn, RunId(row.id))
        job = await store.get_job(conn, who.account_id, row.job_id)
        job_docs = await store.latest_docs_run(conn, who.account_id, row.job_id)
        models = {}
        for a in artifacts:
            if a.path == RUN_RESULTS and a.size_bytes <= MAX_SHOWN_BYTES:
                results = await store.get_artifact(conn, RunId(row.id), RUN_RESULTS, a.step_index)
                if results is not None:
                    models[a.step_index] = views.model_results(bytes(results.content))
    now = datetime.now(UTC)
    step_views = [(s, views.seconds(s.finished_at or (now if s.started_at else None), s.started_at)) for s in steps]
    return await page(
        request,
        "run.html",
        who,
        run=row,
        job=job,
        times=views.RunTimes.of(row, now),
        waiting=views.waiting_words(row),
        steps=step_views,
        artifacts=artifacts,
        models=models,
        summary=views.RunSummary.of(models),
        timing={step: views.model_timing(results) for step, results in models.items() if results},
        made_docs=any(a.path == DOCS_SITE for a in artifacts),
        job_docs=job_docs,
        commands={s.step_index: s.command for s in steps},
        viewable=lambda path: path.rsplit(".", 1)[-1] in VIEWABLE,
        terminal=RunStatus(row.status).is_terminal,
        failed=row.status == RunStatus.ERROR,
        quote=quote,
    )


@router.get("/runs/{run_id}/logs")
async def run_logs(request: Request, who: Looking, run_id: int) -> StreamingResponse:
    """The run's log as server-sent events (``log``: seq, step, text; ``status`` when it changes), followed
    until the run ends (``end``).

    A reconnecting browser sends ``Last-Event-ID`` (the last seq it got) and resumes after it. The
    stream stops when its session ends (logged out, expired, its token revoked): the browser's
    reconnection then gets a 401.
    """
    store = store_of(request)
    config: WebConfig = request.app.state.web
    sessions, session_id = sessions_of(request), request.cookies.get(COOKIE, "")
    after_seq = _last_event_id(request)
    async with store.connection() as conn:
        run_id = (await existing_run(store, conn, who.account_id, run_id)).id

    async def events() -> AsyncIterator[str]:
        seq, quiet_since, shown, checked = after_seq, time.monotonic(), None, time.monotonic()
        while True:
            if time.monotonic() - checked > SESSION_CHECK_SECONDS:
                if await sessions.resolve(session_id) is None:
                    return
                checked = time.monotonic()
            # Status first, chunks second (as RunService.StreamRunLogs): a terminal status read
            # before the chunks means no chunk can follow them.
            async with store.connection() as conn:
                status = await store.run_status(conn, run_id)
                chunks = await store.log_chunks(conn, run_id, after_seq=seq, limit=LOG_BATCH)
            if status is not shown and not status.is_terminal:
                yield _event("status", {"status": status.name.lower()})
                shown = status
            for chunk in chunks:
                seq = chunk.seq
                yield _event("log", {"seq": seq, "step": chunk.step_index, "text": chunk.text}, seq)
            if len(chunks) == LOG_BATCH:
                continue
            if status.is_terminal:
                yield _event("end", {"status": status.name.lower()})
                return
            if chunks:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > PING_SECONDS:
                yield ": ping\n\n"  # keeps proxies from closing an idle stream
                quiet_since = time.monotonic()
            if await sleep_or_stop(config.draining, config.log_poll_interval):
                return

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


def _event(name: str, data: dict[str, Any], event_id: int | None = None) -> str:
    """One server-sent event; JSON data is one line, so it needs no continuation lines."""
    head = f"event: {name}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return f"{head}data: {json.dumps(data)}\n\n"


def _last_event_id(request: Request) -> int:
    value = request.headers.get("last-event-id") or request.query_params.get("after_seq") or "0"
    if not value.isdigit() or len(value) > 19:
        raise InvalidArgument("Last-Event-ID", "must be the seq of a log chunk")
    return int(value)


@router.get("/runs/{run_id}/artifacts/{step}/{path:path}")
async def artifact(
    request: Request, who: Looking, run_id: int, step: int, path: str, *, view: bool = False
) -> Response:
    """One artifact of one step (1-based), as a download; with ``view``, a text file shown on a page
    (JSON pretty-printed)."""
    store = store_of(request)
    async with store.connection() as conn:
        row = await run_artifact(store, conn, who.account_id, run_id, path, step_index=step - 1)
    name = path.rsplit("/", 1)[-1]
    content = bytes(row.content)
    if view and name.rsplit(".", 1)[-1] in VIEWABLE:
        shown = views.readable_text(content, MAX_SHOWN_BYTES, pretty=name.endswith(".json"))
        return await page(
            request, "artifact.html", who, run_id=run_id, step=step, path=path, text=shown, size=len(content),
            download=f"/ui/runs/{run_id}/artifacts/{step}/{quote(path)}",
        )  # fmt: skip
    return Response(
        bytes(row.content),
        media_type=mimetypes.guess_type(name)[0] or "application/octet-stream",
        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(name)}"},
    )


@router.post("/runs/{run_id}/cancel")
async def cancel(request: Request, who: Changing, run_id: int) -> RedirectResponse:
    row = await cancel_run(store_of(request), who.account_id, run_id)
    return see_other(f"/ui/runs/{row.id}")


@router.post("/runs/{run_id}/rerun")
async def rerun(request: Request, who: Changing, run_id: int) -> RedirectResponse:
    """A new run of the job with this run's overrides; it records this run as the one it reruns."""
    store = store_of(request)
    async with store.connection() as conn:
        source = await existing_run(store, conn, who.account_id, run_id)
    spec = rerun_spec(source.job_id, source, Trigger.MANUAL)
    row, _ = await trigger_run(store, request.app.state.pickups, who.account_id, spec, parent_run_id=source.id)
    return see_other(f"/ui/runs/{row.id}")


@router.post("/runs/{run_id}/rerun-from-failure")
async def rerun_failed(request: Request, who: Changing, run_id: int) -> RedirectResponse:
    """dbt Cloud's "Rerun from failure": the failed step and the ones after it (``api.rerunning``)."""
    row = await rerun_from_failure(store_of(request), request.app.state.pickups, who.account_id, run_id)
    return see_other(f"/ui/runs/{row.id}")


# -- jobs -----------------------------------------------------------------------------------------


@router.get("/jobs", response_class=HTMLResponse)
async def jobs(request: Request, who: Looking, after: Annotated[int | None, Query(ge=1)] = None) -> HTMLResponse:
    store = store_of(request)
    async with store.connection() as conn:
        rows = await store.list_jobs(conn, who.account_id, after_id=after, limit=PAGE_SIZE + 1)
        more, rows = len(rows) > PAGE_SIZE, rows[:PAGE_SIZE]
        latest = {r.id: await store.latest_run_of_job(conn, who.account_id, r.id) for r in rows}
    now = time.time()
    return await page(
        request,
        "jobs.html",
        who,
        jobs=[(r, views.schedule(r.cron, r.timezone, now, count=1), latest[r.id]) for r in rows],
        more=f"/ui/jobs?after={rows[-1].id}" if more else None,
    )


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job(request: Request, who: Looking, job_id: int) -> HTMLResponse:
    return await _job_page(request, who, job_id, {"cause": "Run now from the web page"}, FormErrors())


async def _job_page(
    request: Request, who: Viewer, job_id: int, values: dict[str, str], errors: FormErrors
) -> HTMLResponse:
    """The job's page; ``values`` and ``errors`` are its Run now form's.

    The form carries a key of its own, so that sending it twice (a double click, a resent post) makes
    one run; the page is not kept by the browser, so going back to it gives a new key, a new run."""
    values = {"run_key": uuid.uuid4().hex, **values}
    store = store_of(request)
    async with store.connection() as conn:
        row = await existing_job(store, conn, who.account_id, job_id)
        completion = (await store.completion_triggers(conn, [job_id])).get(job_id, [])
        recent = await store.runs_page(conn, who.account_id, filters=_job_filter(job_id), after=None, limit=CHART_RUNS)
        docs_run = await store.latest_docs_run(conn, who.account_id, job_id)
        skipped = await store.skipped_occurrences(conn, who.account_id, JobId(job_id), limit=10)
        environment = (
            await store.get_environment(conn, who.account_id, row.environment_id) if row.environment_id else None
        )
        names = {j.id: j.name for j in await store.job_names(conn, who.account_id)}
    chart = views.duration_chart(recent)
    recent = recent[:10]
    now = datetime.now(UTC)
    job_notices = await notices.job_notices(request, who.account_id, job_id)
    answer = await page(
        request,
        "job.html",
        who,
        job=row,
        completion=[(t, names.get(t.upstream_job_id)) for t in completion],
        settings=views.job_settings(row, environment),
        environment=environment,
        schedule=views.schedule(row.cron, row.timezone, time.time()),
        recent=[(r, views.RunTimes.of(r, now)) for r in recent],
        chart=chart,
        docs_run=docs_run,
        overlap_words=OVERLAP_WORDS,
        skipped=skipped,
        values=values,
        errors=errors,
        notices=job_notices,
    )
    answer.headers["Cache-Control"] = "no-store"
    return answer


def _job_filter(job_id: int) -> dict[str, Any]:
    return {"job_id": job_id, "status": None, "trigger": None, "since": None, "until": None}


@router.post("/jobs/{job_id}/run")
async def run_now(
    request: Request,
    who: Changing,
    job_id: int,
    *,
    cause: Annotated[str, Form()] = "Run now from the web page",
    steps: Annotated[str, Form()] = "",
    git_branch: Annotated[str, Form()] = "",
    git_sha: Annotated[str, Form()] = "",
    schema_name: Annotated[str, Form(alias="schema")] = "",
    target_name: Annotated[str, Form()] = "",
    threads: Annotated[str, Form()] = "",
    timeout_seconds: Annotated[str, Form()] = "",
    pull_request_number: Annotated[str, Form()] = "",
    generate_docs: Annotated[str, Form()] = "",
    dbt_version: Annotated[str, Form()] = "",
    run_at: Annotated[str, Form()] = "",
    run_key: Annotated[str, Form()] = "",
) -> Response:
    """Run now (a manual trigger: it also reactivates a deactivated job), with the overrides given;
    a CI job's run names its pull request. ``run_at`` (in the viewer's time zone) queues the run for a
    later time instead. A refused override comes back at its field."""
    problems = Problems()  # every refused field named at once
    try:
        zone = views.viewer_zone(request.cookies.get(views.ZONE_COOKIE))
        later = problems.check(lambda: _time(run_at.strip(), "run_at", zone), None)
        raw = RunOverridesSpec(
            steps=lines(steps),
            git_branch=git_branch.strip() or None,
            git_sha=git_sha.strip() or None,
            schema=schema_name.strip() or None,
            target_name=target_name.strip() or None,
            threads=problems.check(lambda: number(threads, "threads"), None),
            timeout_seconds=problems.check(lambda: number(timeout_seconds, "timeout_seconds"), None),
            pull_request_number=problems.check(lambda: number(pull_request_number, "pull_request_number"), None),
            generate_docs=problems.check(lambda: _choice(generate_docs, GENERATE_DOCS, "generate_docs"), None),
            dbt_version=dbt_version.strip() or None,
        )
        overrides = problems.check(lambda: checked_overrides(raw, lambda name: name), raw)
        if all(found.field != "dbt_version" for found in problems.found):  # a malformed one is refused once
            problems.check(lambda: dbt_versions_of(request).check(raw.dbt_version, "dbt_version"), None)
        cause = problems.check(lambda: text(cause, "cause", max_length=MAX_CAUSE), cause)
        at = problems.check(lambda: later_time(later, "run_at") if later is not None else None, None)
        key = problems.check(lambda: checked_idempotency_key(run_key, "run_key"), None)
        problems.raise_any()
        spec = TriggerSpec(JobId(job_id), Trigger.MANUAL, cause, key and f"web:{key}", overrides, run_at=at)
        row, _ = await trigger_run(store_of(request), request.app.state.pickups, who.account_id, spec)
    except InvalidArgument as exc:
        form = await request.form()
        values = {k: str(v) for k, v in form.items() if k != CSRF_FIELD}
        answer = await _job_page(request, who, job_id, values, FormErrors.of(exc, RUN_NOW_FIELDS))
        answer.status_code = 400
        return answer
    return see_other(f"/ui/runs/{row.id}")


@router.post("/jobs/{job_id}/pause")
async def pause(request: Request, who: Changing, job_id: int, note: Annotated[str, Form()] = "") -> RedirectResponse:
    """Pause the job: neither its schedule nor a trigger queues it; run now still does. The note says why."""
    await set_paused(store_of(request), who.account_id, job_id, paused=True, who=who.grant.who, note=note)
    return see_other(f"/ui/jobs/{job_id}")


@router.post("/jobs/{job_id}/unpause")
async def unpause(request: Request, who: Changing, job_id: int) -> RedirectResponse:
    await set_paused(store_of(request), who.account_id, job_id, paused=False)
    return see_other(f"/ui/jobs/{job_id}")


# -- search ---------------------------------------------------------------------------------------


@router.get("/search", response_class=HTMLResponse)
async def search(request: Request, who: Looking, q: Annotated[str, Query(max_length=200)] = "") -> HTMLResponse:
    """Jobs and runs by id (``42`` or ``#42``) or by words of a job's name or a run's cause."""
    words = text(q, "q", max_length=200).strip()
    by_id = words.startswith("#")  # "#42" is an id; "42" also finds names holding it
    words = words.lstrip("#").strip()
    jobs: list[Any] = []
    found: list[Any] = []
    if words:
        store = store_of(request)
        async with store.connection() as conn:
            jobs, found = await store.search(conn, who.account_id, words, by_id=by_id, limit=PAGE_SIZE)
    now = datetime.now(UTC)
    return await page(
        request, "search.html", who, q=words, jobs=jobs, rows=[(r, views.RunTimes.of(r, now)) for r in found]
    )


# -- settings -------------------------------------------------------------------------------------


@router.get("/settings", response_class=HTMLResponse)
async def settings(request: Request, who: Looking) -> HTMLResponse:
    """The account: its run slots in use, its tokens (names, scopes, last use; never a secret), its webhooks."""
    store = store_of(request)
    async with store.connection() as conn:
        account = await store.get_account(conn, who.account_id)
        in_use = await store.run_slots_in_use(conn, who.account_id)
        tokens = await store.account_tokens(conn, who.account_id)
        webhooks = await store.account_webhooks(conn, who.account_id)
    return await page(request, "settings.html", who, account=account, in_use=in_use, tokens=tokens, webhooks=webhooks)


# -- on time --------------------------------------------------------------------------------------


@router.get("/on-time", response_class=HTMLResponse)
async def on_time(request: Request, who: Looking, window: str = "24h") -> HTMLResponse:
    """The on-time split of the window, each bucket and reason linked to its runs; it reloads itself."""
    span = _choice(window, WINDOWS, "window")
    store = store_of(request)
    since = (datetime.now(UTC) - span).replace(microsecond=0)
    async with store.connection() as conn:
        split = await store.on_time_split(conn, who.account_id, since)
        waiting = await store.waiting_now(conn, who.account_id)
    started = int(split.started)
    counts = {
        "within_25s": split.within_25s,
        "within_60s": split.within_60s,
        "late": split.late,
        "late_own": split.late_own,
        "late_platform": split.late_platform,
    }
    shares = {name: (count, 100.0 * count / started if started else 0.0) for name, count in counts.items()}
    return await page(
        request,
        "on_time.html",
        who,
        window=window,
        windows=list(WINDOWS),
        split=split,
        started=started,
        shares=shares,
        on_time_ratio=(shares["within_25s"][0] + shares["within_60s"][0]) / started if started else None,
        waiting=[(w, views.reason_words(w.waiting_reason)) for w in waiting],
        runs_of=lambda **asked: "/ui/runs?" + urlencode(asked),
        since=since.isoformat(),
        delay_words=views.DELAY_WORDS,
        own_waits=views.OWN_WAITS,
        refresh_seconds=REFRESH_SECONDS,
    )


async def error_page(request: Request, code: int, title: str, message: str, what_now: str) -> HTMLResponse:
    """The error page, inside the layout with its menu when the session works."""
    try:
        who: Viewer | None = await viewer(request)
    except RunplaneError:
        who = None
    return await page(
        request, "error.html", who, code=code, title=title, message=message, what_now=what_now, back=_back(request)
    )


def _back(request: Request) -> str | None:
    """The page this one was reached from, as a plain link (the pages' CSP runs no ``javascript:`` URL):
    a page of this site under ``/ui/`` (the ``Referrer-Policy`` sends the path only within the site),
    not this one. None when there is none."""
    referer = urlsplit(request.headers.get("referer", ""))
    if referer.netloc != request.url.netloc or not referer.path.startswith("/ui/"):
        return None
    back = referer.path + (f"?{referer.query}" if referer.query else "")
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return _safe_next(back) if back != here or request.method != "GET" else None
