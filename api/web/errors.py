"""A page's errors as pages: the same status codes as the REST API, in words, never a JSON envelope."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import Request, Response
from fastapi.responses import RedirectResponse

from api.web import pages
from api.web.session import LoginRequired

PREFIX = "/ui/"
TITLES = {400: "That did not work", 401: "Log in", 403: "Not allowed", 404: "Not found", 409: "Not now"}


def is_page(request: Request) -> bool:
    return request.url.path.startswith(PREFIX) or request.url.path == PREFIX.rstrip("/")


async def page(request: Request, code: int, message: str, exc: Exception | None = None) -> Response:
    """The error page; without a working session, the login form (coming back here after a GET)."""
    if isinstance(exc, LoginRequired) or code == 401:
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        target = back if request.method == "GET" and back.startswith(PREFIX) else "/ui/runs"
        if request.url.path.endswith("/logs"):  # an event stream cannot follow a redirect to a form
            return Response(message, status_code=401, media_type="text/plain")
        return RedirectResponse("/ui/login?" + urlencode({"next": target}), status_code=303)
    response = await pages.error_page(request, code, TITLES.get(code, "Something went wrong"), message)
    response.status_code = code
    return response
