"""The pages' sessions are the server's: the cookie holds a random id (never the token), only its hash is
stored, and logging out, the session's expiry, or its token revoked or expired ends it at once."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import trustme

from api.admin import create_account, create_token, revoke_token
from api.process import RunningApi
from api.web import pages
from api.web.session import COOKIE
from runplane.basics.settings import Settings
from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser
from tests.support.api import serving_api
from tests.support.web_rows import insert_job, insert_runs


@asynccontextmanager
async def _another_browser(api: RunningApi, session_id: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """Another browser, with no cookie or a copy of a session's."""
    assert api.rest is not None
    cookies = {COOKIE: session_id} if session_id is not None else None
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api.rest.port}", cookies=cookies) as http:
        yield http


async def _token_id(adb: AsyncDb, token: str) -> int:
    return int(
        await scalar(adb, "SELECT id FROM api_tokens WHERE token_hash = %s", hashlib.sha256(token.encode()).digest())
    )


async def test_the_cookie_holds_a_random_session_id_and_the_server_only_its_hash(
    browser: Browser, settings: Settings, adb: AsyncDb
) -> None:
    response = await browser.login()
    assert response.status_code == 303
    cookies = response.headers.get_list("set-cookie")
    assert cookies and not any(browser.token in c for c in cookies)
    session_id = browser.session_id
    assert len(session_id) == 43 and session_id != browser.token
    cookie = next(c.lower() for c in cookies if c.startswith(f"{COOKIE}="))
    assert "httponly" in cookie and "samesite=lax" in cookie and "path=/ui" in cookie and "secure" not in cookie

    cur = await adb.execute(
        "SELECT id_hash, account_id, token_id, expires_at - created_at, t::text FROM web_sessions t"
    )
    rows = await cur.fetchall()
    assert len(rows) == 1
    id_hash, account_id, token_id, lifetime, whole_row = rows[0]
    assert bytes(id_hash) == hashlib.sha256(session_id.encode()).digest()
    assert (account_id, token_id) == (browser.account_id, await _token_id(adb, browser.token))
    assert lifetime == timedelta(hours=settings.api.web_session_hours)
    assert session_id not in whole_row and browser.token not in whole_row

    assert (await browser.http.get("/ui/runs")).status_code == 200
    await browser.login()  # a second login replaces this browser's session with a new one
    assert browser.session_id != session_id
    assert await scalar(adb, "SELECT count(*) FROM web_sessions") == 1


async def test_logging_out_ends_the_session_on_the_server(browser: Browser, api: RunningApi, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id)
    (run_id,) = await insert_runs(adb, browser.account_id, job_id, 1, status=3)
    await browser.login()
    kept = browser.session_id
    async with _another_browser(api, kept) as copy:
        assert (await copy.get("/ui/runs")).status_code == 200  # the copy works while the session lasts
        out = await browser.post("/ui/logout")
        assert out.status_code == 303
        assert await scalar(adb, "SELECT count(*) FROM web_sessions") == 0
        refused = await copy.get("/ui/runs")
        assert refused.status_code == 303 and refused.headers["location"].startswith("/ui/login")
        assert (await copy.get(f"/ui/runs/{run_id}/logs")).status_code == 401


async def test_revoking_the_token_ends_every_session_made_from_it(
    browser: Browser, api: RunningApi, settings: Settings, adb: AsyncDb
) -> None:
    token = await create_token(settings, account_id=browser.account_id, scopes=("job_admin",))
    async with _another_browser(api) as second_http, _another_browser(api) as third_http:
        second = Browser(second_http, browser.account_id, token)
        third = Browser(third_http, browser.account_id, browser.token)  # the account's other token
        for each in (browser, second):
            assert (await each.login(token)).status_code == 303
        assert (await third.login()).status_code == 303
        assert [(await b.http.get("/ui/jobs")).status_code for b in (browser, second, third)] == [200, 200, 200]
        await revoke_token(settings, token_id=await _token_id(adb, token))
        assert [(await b.http.get("/ui/jobs")).status_code for b in (browser, second, third)] == [303, 303, 200]
        assert (await browser.login(token)).status_code == 401
        assert (await second.login(browser.token)).status_code == 303  # a login clears ended sessions away
    assert await scalar(adb, "SELECT count(*) FROM web_sessions WHERE token_id = %s", await _token_id(adb, token)) == 0


async def test_an_expired_session_is_refused(browser: Browser, api: RunningApi, adb: AsyncDb) -> None:
    await browser.login()
    assert (await browser.http.get("/ui/runs")).status_code == 200
    await adb.execute("UPDATE web_sessions SET expires_at = now() - interval '1 second'")
    assert (await browser.http.get("/ui/runs")).status_code == 303

    await browser.login()  # the token's own expiry ends its sessions too
    assert (await browser.http.get("/ui/runs")).status_code == 200
    await adb.execute(
        "UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE account_id = %s", (browser.account_id,)
    )
    assert (await browser.http.get("/ui/runs")).status_code == 303


async def test_each_page_marks_its_session_seen(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    await adb.execute("UPDATE web_sessions SET last_seen_at = now() - interval '1 hour'")
    assert (await browser.http.get("/ui/jobs")).status_code == 200
    assert await scalar(adb, "SELECT now() - last_seen_at < interval '1 minute' FROM web_sessions")


async def test_a_followed_log_stops_when_its_session_ends(
    browser: Browser, api: RunningApi, adb: AsyncDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "SESSION_CHECK_SECONDS", 0.2)
    job_id = await insert_job(adb, browser.account_id)
    (run_id,) = await insert_runs(adb, browser.account_id, job_id, 1, status=3)  # running: followed until it ends
    await browser.login()
    async with (
        _another_browser(api, browser.session_id) as follower,
        follower.stream("GET", f"/ui/runs/{run_id}/logs") as stream,
    ):
        lines = stream.aiter_lines()
        assert await anext(lines) == "event: status"
        assert (await browser.post("/ui/logout")).status_code == 303
        async with asyncio.timeout(10):  # the stream ends, without an end event: the run still runs
            rest = [line async for line in lines]
        assert "event: end" not in rest


async def test_over_https_the_cookies_are_secure(
    api_settings: Settings, settings: Settings, tmp_path: Path, _cleanup_bus: None
) -> None:
    ca = trustme.CA()
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    issued = ca.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(str(cert_file))
    issued.private_key_pem.write_to_path(str(key_file))
    tls = api_settings.api.model_copy(update={"tls_certfile": str(cert_file), "tls_keyfile": str(key_file)})
    account_id, token = await create_account(settings, name="acme", run_slots=1, memory_mb=512)
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    async with serving_api(api_settings.model_copy(update={"api": tls})) as running:
        assert running.rest is not None
        async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{running.rest.port}", verify=trusted) as http:
            browser = Browser(http, account_id, token)
            form = await http.get("/ui/login")
            assert "secure" in form.headers["set-cookie"].lower()
            response = await browser.login()
            assert response.status_code == 303
            session = next(c for c in response.headers.get_list("set-cookie") if c.startswith(f"{COOKIE}="))
            assert "secure" in session.lower() and "httponly" in session.lower()
            assert (await http.get("/ui/runs")).status_code == 200
