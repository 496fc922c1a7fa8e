"""A browser of the web pages in-process: an account, its token, and an HTTP client that keeps cookies;
and a real one, Debian's chromium driven by Playwright."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from api.admin import create_account
from api.rest.server import RestServer
from api.web.session import COOKIE, csrf_for
from runplane.basics.settings import Settings

if TYPE_CHECKING:  # imported by the fixture that starts the browser: collecting does not load Playwright
    from playwright.async_api import Browser as Chromium
    from playwright.async_api import Page

CHROMIUM = Path("/usr/bin/chromium")
AXE = Path(__file__).resolve().parents[2] / "system" / "axe" / "node_modules" / "axe-core" / "axe.min.js"


@dataclass
class Browser:
    http: httpx.AsyncClient
    account_id: int
    token: str

    @property
    def session_id(self) -> str:
        """The id in the session cookie (empty before a login)."""
        return self.http.cookies.get(COOKIE) or ""

    @property
    def csrf(self) -> str:
        """The CSRF value of the current session's forms."""
        return csrf_for(self.session_id)

    async def login(self, token: str | None = None, next: str = "/ui/runs") -> httpx.Response:
        """Log in as a browser does: the form first (its CSRF value, in it and in a cookie), then the post."""
        form = await self.http.get("/ui/login")
        found = re.findall(r'name="csrf_token" value="([^"]+)"', form.text)
        assert len(found) == 1, (form.status_code, form.text)
        value = found[0]
        return await self.http.post("/ui/login", data={"token": token or self.token, "next": next, "csrf_token": value})

    async def post(self, path: str, **form: str) -> httpx.Response:
        return await self.http.post(path, data={"csrf_token": self.csrf, **form})


@pytest.fixture
async def browser(rest_server: RestServer, settings: Settings) -> AsyncIterator[Browser]:
    account_id, token = await create_account(settings, name="acme", run_slots=2, memory_mb=1024)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rest_server.port}") as http:
        yield Browser(http, account_id, token)


@pytest.fixture
def installed() -> None:
    if not CHROMIUM.is_file() or not AXE.is_file():
        pytest.fail(f"{CHROMIUM} or {AXE} is missing: `make test-packages` installs both")


@pytest.fixture
async def chromium(installed: None) -> AsyncIterator[Chromium]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()


async def log_in(page: Page, base: str, token: str) -> None:
    """Log in through the login form, as a person does."""
    await page.goto(f"{base}/ui/login")
    await page.fill("#token", token)
    await page.click("#login")
    await page.wait_for_url(f"{base}/ui/runs")
