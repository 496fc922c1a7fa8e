"""The usual security headers on every HTTP answer, the web pages' scripts allowed by a nonce.

- ``Content-Security-Policy``: only this origin's resources; scripts only with this answer's nonce
  (the pages' own inline scripts carry it, an injected one cannot know it); no plugins, no
  ``<base>``, forms post only here, and no other site may frame the pages. An answer that sets its
  own policy (the dbt docs site, sandboxed) keeps it.
- ``X-Frame-Options: DENY`` (for browsers that ignore ``frame-ancestors``), ``X-Content-Type-Options:
  nosniff``, ``Referrer-Policy: same-origin``;
- ``Strict-Transport-Security`` when the API serves HTTPS (``api.tls_certfile``).

The nonce is made per request and put in the request's state (``csp_nonce``) for the templates.
"""

from __future__ import annotations

import secrets

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HSTS = "max-age=31536000"


def policy(nonce: str) -> str:
    return (
        f"default-src 'self'; script-src 'self' 'nonce-{nonce}'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nonce = secrets.token_urlsafe(16)
        scope.setdefault("state", {})["csp_nonce"] = nonce
        https = scope.get("scheme") == "https"

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("Content-Security-Policy", policy(nonce))
                headers.setdefault("X-Frame-Options", "DENY")
                headers.setdefault("X-Content-Type-Options", "nosniff")
                headers.setdefault("Referrer-Policy", "same-origin")
                if https:
                    headers.setdefault("Strict-Transport-Security", HSTS)
            await send(message)

        await self.app(scope, receive, with_headers)
