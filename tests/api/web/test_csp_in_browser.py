"""The pages work under their own Content-Security-Policy, in a real browser that enforces it (no
``bypass_csp``): the on-time page's window select and the error page's "Go back" link, with no
violation reported on the console."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

from api.rest.server import RestServer
from tests.api.web.conftest import Browser, log_in

if TYPE_CHECKING:
    from playwright.async_api import Browser as Chromium
    from playwright.async_api import ConsoleMessage, Page

pytestmark = pytest.mark.slow


@pytest.fixture
async def watched_tab(chromium: Chromium) -> AsyncIterator[tuple[Page, list[str]]]:
    """A page whose console's CSP reports are collected."""
    context = await chromium.new_context(viewport={"width": 1280, "height": 800})
    reports: list[str] = []

    def heard(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            reports.append(message.text)

    try:
        opened = await context.new_page()
        opened.on("console", heard)
        yield opened, reports
    finally:
        await context.close()


async def test_the_window_select_and_the_go_back_link_work_under_the_pages_csp(
    browser: Browser, rest_server: RestServer, watched_tab: tuple[Page, list[str]]
) -> None:
    tab, reports = watched_tab
    base = f"http://127.0.0.1:{rest_server.port}"
    await log_in(tab, base, browser.token)

    await tab.goto(f"{base}/ui/on-time?window=24h")
    await tab.select_option("#window", "1h")  # no button pressed: choosing is enough
    await tab.wait_for_url(f"{base}/ui/on-time?window=1h", timeout=10_000)
    assert await tab.input_value("#window") == "1h"

    await tab.goto(f"{base}/ui/jobs")
    await tab.goto(f"{base}/ui/runs/999999999", referer=f"{base}/ui/jobs")  # a link followed from the jobs page
    assert "Not found" in await tab.inner_text("h1")
    await tab.click("#go-back")
    await tab.wait_for_url(f"{base}/ui/jobs", timeout=10_000)

    assert reports == []
