"""A bound on every HTTP request body, enforced while it is read, before routing or authentication.

Neither uvicorn nor Starlette bounds a request body (uvicorn bounds only an incomplete request's
headers, ``h11_max_incomplete_event_size``); a route that reads ``await request.body()`` holds
whatever a client sends, and the Git webhook route, which takes no token, must read the body to
check its signature. This ASGI middleware sits outside everything else: a declared
``Content-Length`` over the limit is refused with 413 before a byte is read, and a body sent without
one (chunked) is counted as it arrives and refused the moment it passes the limit. Git webhooks
may be as large as GitHub sends (25 MB); every other route takes ``api.max_body_bytes``.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.rest.envelope import error_response

WEBHOOK_PREFIX = "/webhooks/"
WEBHOOK_MAX_BYTES = 25 * 1024 * 1024  # GitHub caps a webhook's payload at 25 MB


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def limit_for(self, path: str) -> int:
        return max(self.max_bytes, WEBHOOK_MAX_BYTES) if path.startswith(WEBHOOK_PREFIX) else self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _refuse(scope, receive, send, limit)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # the app's own handlers answer it (a page or the JSON envelope)
                    raise HTTPException(413, _too_large(limit), headers={"Connection": "close"})
            return message

        await self.app(scope, counting_receive, send)


def _too_large(limit: int) -> str:
    return f"the request body is larger than {limit} bytes"


async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    """413 in the REST API's envelope; the connection is closed (the rest of the body is not read)."""
    response = error_response(413, _too_large(limit), headers={"Connection": "close"})
    await response(scope, receive, send)
