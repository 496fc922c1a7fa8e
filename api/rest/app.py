"""The FastAPI application: routes, the error envelope, and the paths dbt Cloud's clients also use.

Clients differ in small ways that dbt Cloud accepts: a trailing slash or not (``dbt-cloud-cli``
and ``dbtc`` leave it off), and ``/api/v3/`` for listing accounts and jobs (``dbtc``,
``dbt-cloud-cli``). A middleware maps those onto the documented ``/api/v2/.../`` paths, which are
the only ones in the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import timedelta

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from api.environment_variables import EnvironmentVariables
from api.notification_definitions import Notifications
from api.pickup_publisher import PickupPublisher
from api.rest import (
    commit_statuses,
    environment_variables,
    git_hooks,
    jobs,
    notifications,
    projects,
    runs,
    warehouse,
    webhooks,
)
from api.rest import repositories as repository_routes
from api.rest.body_limit import BodyLimit
from api.rest.envelope import error_response, http_code
from api.rest.security_headers import SecurityHeaders
from api.store import Store
from api.web import deleting, docs, errors, forms, notices, pages
from api.web.sessions import WebSessions
from api.webhooks.commit_statuses import CommitStatusTargets
from api.webhooks.git_events import GitHooks
from api.webhooks.subscriptions import Subscriptions
from api.webhooks.targets import TargetPolicy
from runplane.basics.errors import RunplaneError
from runplane.basics.repository_urls import RepositoryRule
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import RepositorySettings, Settings
from runplane.dbt.versions import InstalledDbtVersions
from runplane.dbt.warehouse_files import WarehouseFiles

log = logging.getLogger(__name__)


def create_app(
    store: Store,
    pickups: PickupPublisher,
    box: SecretBox | None = None,
    *,
    targets: TargetPolicy | None = None,
    repositories: RepositorySettings | None = None,
    log_poll_interval: float = 0.5,
    draining: asyncio.Event | None = None,
    max_body_bytes: int = 1024 * 1024,
    web_session_lifetime: timedelta = timedelta(hours=12),
    dbt_versions: InstalledDbtVersions | None = None,
    warehouses: WarehouseFiles | None = None,
) -> FastAPI:
    """The REST app over ``store``, with the web pages under ``/ui/``; ``box`` encrypts webhook secrets
    (no webhooks without one), ``targets`` says where webhooks may go (public addresses only by
    default), ``repositories`` which repositories projects may name (the strict rule by default).
    Followed logs poll every ``log_poll_interval`` and end when ``draining`` is set. No
    request body may pass ``max_body_bytes`` (``api.rest.body_limit``). A login to the web pages lasts
    ``web_session_lifetime`` at most. ``dbt_versions`` are the ones environments, jobs and runs may name
    (any, by default); ``warehouses`` where their warehouse files may be (the default root by default).
    """
    app = FastAPI(
        title="runplane REST API (dbt Cloud v2 compatible)",
        version="2",
        description="dbt Cloud's administrative API v2 for runs, jobs and accounts, served by runplane.",
        redirect_slashes=False,
    )
    app.state.store = store
    app.state.dbt_versions = dbt_versions or InstalledDbtVersions()
    app.state.warehouses = warehouses or WarehouseFiles.of(Settings())
    app.state.pickups = pickups
    app.state.box = box  # the web forms encrypt secrets with it
    app.state.repositories = RepositoryRule(repositories or RepositorySettings())
    app.state.subscriptions = Subscriptions(store, box, targets or TargetPolicy())
    app.state.notifications = Notifications(store, box)
    app.state.notification_networks = targets or TargetPolicy()
    app.state.git_hooks = GitHooks(store, pickups, box)
    app.state.commit_status_targets = CommitStatusTargets(store, box, targets or TargetPolicy())
    app.state.environment_variables = EnvironmentVariables(store, box)
    app.state.web = pages.WebConfig(log_poll_interval, draining or asyncio.Event())
    app.state.web_sessions = WebSessions(store, web_session_lifetime)
    rest = (
        runs.router,
        jobs.router,
        projects.router,
        repository_routes.router,
        warehouse.router,
        webhooks.router,
        notifications.router,
        git_hooks.router,
        commit_statuses.router,
        environment_variables.router,
    )
    for router in (*rest, forms.router, deleting.router, docs.router, notices.router, pages.router):
        app.include_router(router)
    app.add_middleware(_ClientPaths)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # added last: outside every route and its auth

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse(errors.PREFIX, status_code=307)  # a browser at the bare address gets the pages

    @app.exception_handler(RunplaneError)
    async def runplane_error(request: Request, exc: RunplaneError) -> Response:
        code = http_code(exc)
        if code == 503:
            log.warning("%s %s: %s", request.method, request.url.path, exc)
        if errors.is_page(request):
            return await errors.page(request, code, str(exc), exc)
        return error_response(code, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        problems = _problems(exc)
        if errors.is_page(request):
            return await errors.page(request, 400, errors.in_words(exc.errors()))
        return error_response(400, problems or "invalid request")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if errors.is_page(request):
            return await errors.page(request, exc.status_code, str(exc.detail))
        # 405 keeps its Allow header (the methods the path takes), as HTTP asks.
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return error_response(500, "internal error")

    return app


def _problems(exc: RequestValidationError) -> str:
    """What is wrong with a request, by field; a body that is not JSON says so, and where."""
    out = []
    for e in exc.errors()[:5]:
        if e["type"] == "json_invalid":
            position = e["loc"][-1] if len(e["loc"]) > 1 else "?"
            reason = (e.get("ctx") or {}).get("error", "invalid JSON")
            return f"the request body is not valid JSON: {reason} at character {position}"
        out.append(f"{'.'.join(str(p) for p in e['loc'][1:]) or e['loc'][0]}: {e['msg']}")
    return "; ".join(out)


_ARTIFACT_FILE = re.compile(r"^/api/v2/accounts/[^/]+/(?:runs|jobs)/[^/]+/artifacts/[^/].*")
_V3_READS = re.compile(r"^/api/v3/accounts(?:/[^/]+(?:/jobs(?:/[^/]+)?)?)?/?$")


class _ClientPaths:
    """Rewrites the paths dbt Cloud's clients send into the documented ones, before routing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if _V3_READS.match(path):
                path = "/api/v2/" + path.removeprefix("/api/v3/")
            if path.startswith(("/api/v2/", "/api/v3/")) and not path.endswith("/") and not _ARTIFACT_FILE.match(path):
                path += "/"
            if path != scope["path"]:
                scope = {**scope, "path": path, "raw_path": path.encode()}
        await self.app(scope, receive, send)
