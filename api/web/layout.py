"""What every page shares: the templates, the layout's context (the account's name, the viewer's time
zone, the CSRF field), the store, and the redirect after a form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from api.store import Store
from api.web import views
from api.web.session import CSRF_FIELD, Viewer
from runplane.dbt.versions import InstalledDbtVersions
from runplane.dbt.warehouse_files import WarehouseFiles

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
templates.env.globals.update(
    duration=views.duration, when=views.when, status_name=views.status_name, step_status=views.step_status
)


def store_of(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def warehouses_of(request: Request) -> WarehouseFiles:
    """Where runs keep warehouse files (``runplane.dbt.warehouse_files``), as the app was made with."""
    rule: WarehouseFiles = request.app.state.warehouses
    return rule


def dbt_versions_of(request: Request) -> InstalledDbtVersions:
    """The dbt versions runs may name (``runplane.dbt.versions``), as the app was made with."""
    versions: InstalledDbtVersions = request.app.state.dbt_versions
    return versions


async def page(request: Request, name: str, who: Viewer | None, **context: Any) -> HTMLResponse:
    """A page in the layout: the account's name in the header, times in the viewer's zone."""
    account_name = ""
    if who is not None:
        store = store_of(request)
        async with store.connection() as conn:
            account = await store.get_account(conn, who.account_id)
        account_name = str(account.name) if account else ""
    zone = views.viewer_zone(request.cookies.get(views.ZONE_COOKIE))
    return templates.TemplateResponse(
        request,
        name,
        {
            "who": who,
            "account_name": account_name,
            "zone": zone,
            "zone_name": str(zone),
            "csrf_field": CSRF_FIELD,
            "path": request.url.path,
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            "csp_nonce": getattr(request.state, "csp_nonce", ""),  # api.rest.security_headers
            **context,
        },
    )


def see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)
