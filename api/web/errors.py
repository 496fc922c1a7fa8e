"""A page's errors as pages: the same status codes as the REST API, in words, never a JSON envelope."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from fastapi import Request, Response
from fastapi.responses import RedirectResponse

from api.web import pages
from api.web.session import LoginRequired

PREFIX = "/ui/"
TITLES = {
    400: "That did not work",
    401: "Log in",
    403: "Not allowed",
    404: "Not found",
    409: "Not now",
    503: "Try again in a moment",
}
WHAT_NOW = {
    400: "runplane could not use what was sent, and changed nothing.",
    403: "Your token does not allow this. Log in with a token that has the job_admin scope to change jobs and runs.",
    404: "It is not in this account: it may have been deleted, or the address may be mistyped.",
    409: "It cannot be done in the state it is in now. Reload its page to see where it stands.",
    503: "A service runplane needs did not answer in time. Nothing was changed; try again.",
}
# What FastAPI's checks of an address or form say, in words (pydantic's error types).
_REQUEST_WORDS = {
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "greater_than_equal": "must be at least {ge}",
    "less_than_equal": "must be at most {le}",
    "string_too_long": "is too long (at most {max_length} characters)",
    "missing": "is missing",
}


def is_page(request: Request) -> bool:
    return request.url.path.startswith(PREFIX) or request.url.path == PREFIX.rstrip("/")


def in_words(errors: Sequence[Any]) -> str:
    """FastAPI's request errors as sentences: ``The run id in the address must be a whole number.``"""
    sentences = []
    for error in list(errors)[:3]:
        where = {"path": "in the address", "query": "in the address", "body": "in the form"}.get(error["loc"][0], "")
        name = str(error["loc"][-1]).replace("_", " ")
        words = _REQUEST_WORDS.get(error["type"], str(error["msg"]).lower()).format(**error.get("ctx", {}))
        sentences.append(f"The {name} {where} {words}.".replace("  ", " "))
    return " ".join(sentences) or "The request could not be read."


def readable(message: str) -> str:
    """An API error (``settings.threads: must be …``) with its field named as a person would."""
    field, sep, rest = message.partition(": ")
    if not sep or " " in field:
        return message
    name = field.rsplit(".", 1)[-1].replace("_", " ")
    return f"{name[:1].upper()}{name[1:]}: {rest}"


async def page(request: Request, code: int, message: str, exc: Exception | None = None) -> Response:
    """The error page; without a working session, the login form (coming back here after a GET)."""
    if isinstance(exc, LoginRequired) or code == 401:
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        target = back if request.method == "GET" and back.startswith(PREFIX) else "/ui/runs"
        if request.url.path.endswith("/logs"):  # an event stream cannot follow a redirect to a form
            return Response(message, status_code=401, media_type="text/plain")
        return RedirectResponse("/ui/login?" + urlencode({"next": target}), status_code=303)
    title = TITLES.get(code, "Something went wrong")
    response = await pages.error_page(request, code, title, readable(message), WHAT_NOW.get(code, ""))
    response.status_code = code
    return response
