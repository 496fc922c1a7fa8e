"""Every answer carries the usual security headers; the pages' own scripts run by this answer's nonce."""

from __future__ import annotations

import re

import httpx
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

from api.rest.security_headers import SecurityHeaders
from tests.api.web.conftest import Browser


async def test_pages_and_api_answers_carry_the_security_headers_and_scripts_their_nonce(browser: Browser) -> None:
    login = await browser.http.get("/ui/login")
    policy = login.headers["content-security-policy"]
    assert (
        "frame-ancestors 'none'" in policy
        and "object-src 'none'" in policy
        and "'unsafe-inline'" not in (policy.split("script-src", 1)[1].split(";", 1)[0])
    )
    [nonce] = re.findall(r"'nonce-([^']+)'", policy)
    scripts = re.findall(r"<script([^>]*)>", login.text)
    assert scripts and all(f'nonce="{nonce}"' in attributes for attributes in scripts)
    assert (await browser.http.get("/ui/login")).headers["content-security-policy"] != policy  # one per answer
    await browser.login()
    for path in ("/ui/login", "/ui/runs", f"/api/v2/accounts/{browser.account_id}/runs/"):
        answer = await browser.http.get(path, headers={"Authorization": f"Token {browser.token}"})
        assert answer.headers["x-frame-options"] == "DENY", path
        assert answer.headers["x-content-type-options"] == "nosniff", path
        assert answer.headers["referrer-policy"] == "same-origin", path
        assert "strict-transport-security" not in answer.headers, path  # plain HTTP: HSTS means nothing


async def test_hsts_is_sent_over_https_only() -> None:
    async def hello(scope: Scope, receive: Receive, send: Send) -> None:
        await PlainTextResponse("hello")(scope, receive, send)

    transport = httpx.ASGITransport(app=SecurityHeaders(hello))
    async with httpx.AsyncClient(transport=transport, base_url="https://runplane.example") as https:
        assert (await https.get("/")).headers["strict-transport-security"].startswith("max-age=")
    async with httpx.AsyncClient(transport=transport, base_url="http://runplane.example") as http:
        assert "strict-transport-security" not in (await http.get("/")).headers
