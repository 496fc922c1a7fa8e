"""Every page in a real browser (Debian's chromium through Playwright) against the in-process API, on
an account as full as a real one (hundreds of runs, failed and skipped steps, an environment of every
adapter): axe-core finds no violation on a 1,280 px screen nor on a phone's 390 px one, neither shows
sideways scroll, and the keyboard reaches the log box."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from api.rest.server import RestServer
from runplane.basics.types import RunStatus
from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import AXE, Browser, log_in
from tests.support.realistic_account import Realistic, seed_realistic_account
from tests.support.web_rows import RUN_RESULTS, insert_job, insert_runs, insert_steps

if TYPE_CHECKING:  # imported by the fixture that starts the browser: collecting this file does not load Playwright
    from playwright.async_api import Browser as Chromium
    from playwright.async_api import Page

pytestmark = pytest.mark.slow

WAITING = "waiting for this job's running run (serial execution)"


async def _seed(browser: Browser, adb: AsyncDb) -> dict[str, int]:
    """A project with an environment, a dbt job with a failed run (steps, models, log, artifacts), and
    another job with a run still waiting."""
    project = await scalar(
        adb,
        "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'analytics', 'https://x.test/a.git')"
        " RETURNING id",
        browser.account_id,
    )
    environment = await scalar(
        adb,
        "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
        " connection, schema_name) VALUES (%s, %s, 'production', 'deployment', '1.10', 'postgres',"
        ' \'{"host": "db", "user": "dbt", "dbname": "w"}\', \'analytics\') RETURNING id',
        browser.account_id,
        project,
    )
    job = await insert_job(adb, browser.account_id, "nightly build", steps=["dbt seed", "dbt build"], cron="0 6 * * *")
    await adb.execute("UPDATE jobs SET environment_id = %s WHERE id = %s", (environment, job))
    ids = await insert_runs(adb, browser.account_id, job, 4)
    (failed,) = await insert_runs(adb, browser.account_id, job, 1, status=int(RunStatus.ERROR))
    await insert_steps(adb, failed, ("dbt seed", 10, True), ("dbt build", 20, True))
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/run_results.json', 1, %s)",
        (failed, json.dumps(RUN_RESULTS).encode()),
    )
    await adb.execute(
        "INSERT INTO run_log_chunks (run_id, seq, step_index, text) SELECT %s, g, g %% 2, 'line ' || g || E'\\n'"
        " FROM generate_series(1, 200) g",
        (failed,),
    )
    serial = await insert_job(adb, browser.account_id, "hourly refresh of every finance model")
    (waiting,) = await insert_runs(adb, browser.account_id, serial, 1, status=int(RunStatus.QUEUED))
    await adb.execute("UPDATE runs SET waiting_reason = 'job_already_running' WHERE id = %s", (waiting,))
    return {"project": project, "environment": environment, "job": job, "run": ids[-1], "failed": failed}


def _pages(seeded: dict[str, int], full: Realistic) -> list[str]:
    return [
        "/ui/settings",
        f"/ui/runs/{full.failed_run}",
        f"/ui/runs/{full.running_run}",
        f"/ui/runs?environment={full.environments[0]}&status=error",
        f"/ui/jobs/{full.jobs[5]}",
        *(f"/ui/environments/{environment}/edit" for environment in full.environments),
        "/ui/runs",
        f"/ui/runs/{seeded['failed']}",
        f"/ui/runs/{seeded['run']}",
        f"/ui/runs/{seeded['failed']}/artifacts/2/target/run_results.json?view=1",
        "/ui/jobs",
        f"/ui/jobs/{seeded['job']}",
        "/ui/jobs/new",
        f"/ui/jobs/{seeded['job']}/edit",
        f"/ui/jobs/{seeded['job']}/delete",
        f"/ui/environments/{seeded['environment']}/delete",
        "/ui/projects",
        "/ui/projects/new",
        f"/ui/projects/{seeded['project']}/edit",
        f"/ui/projects/{seeded['project']}/environments/new",
        f"/ui/environments/{seeded['environment']}/edit",
        "/ui/on-time?window=1h",
        "/ui/search?q=nightly",
        "/ui/runs/999999",
    ]


async def _violations(page: Page) -> list[dict[str, Any]]:
    await page.add_script_tag(path=str(AXE))
    found: list[dict[str, Any]] = await page.evaluate(
        """async () => (await axe.run(document)).violations.map(v => ({
               id: v.id, impact: v.impact, help: v.help,
               nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ') + ': ' + n.failureSummary)}))"""
    )
    return found


async def _overflow(page: Page) -> list[str]:
    """What sticks out of the screen sideways (nothing: the page fits it), the outermost elements first."""
    found: list[str] = await page.evaluate(
        """() => {
          const width = document.documentElement.clientWidth;
          if (document.documentElement.scrollWidth <= width) { return []; }
          const out = [...document.querySelectorAll("body *")]
            .filter(e => e.getBoundingClientRect().right > width + 1 && !e.closest(".table-wrap *"))
            .slice(0, 5)
            .map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.className}: ends at ${e.getBoundingClientRect().right}`);
          return out.length ? out : [`the page is ${document.documentElement.scrollWidth} px wide`];
        }"""
    )
    return found


# axe-core checks each of some thirty pages of a full account: seconds of CPU a page on a busy machine.
@pytest.mark.timeout(420)
@pytest.mark.parametrize("screen", [(1280, 800), (390, 844)], ids=["desktop", "phone"])
async def test_every_page_passes_axe_and_fits_a_phone(
    browser: Browser, adb: AsyncDb, rest_server: RestServer, chromium: Chromium, screen: tuple[int, int]
) -> None:
    width, height = screen
    seeded = await _seed(browser, adb)
    full = await seed_realistic_account(adb, browser.account_id)
    base = f"http://127.0.0.1:{rest_server.port}"
    problems: dict[str, Any] = {}
    # axe is injected as an inline script, which the pages' Content-Security-Policy refuses (as it
    # would an attacker's): this context alone lets it in.
    context = await chromium.new_context(
        viewport={"width": width, "height": height}, timezone_id="Europe/Paris", bypass_csp=True
    )
    page = await context.new_page()
    try:
        await page.goto(f"{base}/ui/login")
        problems[f"/ui/login at {width} px"] = await _violations(page)
        await log_in(page, base, browser.token)
        for path in _pages(seeded, full):
            await page.goto(base + path)
            await page.wait_for_load_state("load")
            problems[f"{path} at {width} px"] = await _violations(page)
            problems[f"{path} at {width} px: sticks out sideways"] = await _overflow(page)
    finally:
        await context.close()
    failing = {k: v for k, v in problems.items() if v}
    assert not failing, json.dumps(failing, indent=1)


async def test_the_log_box_is_reached_by_keyboard_and_times_follow_the_browser(
    browser: Browser, adb: AsyncDb, rest_server: RestServer, chromium: Chromium
) -> None:
    seeded = await _seed(browser, adb)
    base = f"http://127.0.0.1:{rest_server.port}"
    # Playwright evaluates wait_for_function's text with eval, which the pages' policy refuses.
    context = await chromium.new_context(
        viewport={"width": 1280, "height": 800}, timezone_id="Asia/Tokyo", bypass_csp=True
    )
    page = await context.new_page()
    try:
        await log_in(page, base, browser.token)
        await page.goto(f"{base}/ui/runs/{seeded['failed']}")
        await page.wait_for_function("document.querySelector('#log-1').textContent.includes('line 199')")
        assert "times in Asia/Tokyo" in await page.inner_text("#zone")
        assert "JST" in await page.inner_text("main time")
        for _ in range(60):  # Tab through the page until the log box holds the focus
            await page.keyboard.press("Tab")
            if await page.evaluate("document.activeElement.id") == "log-0":
                break
        else:
            raise AssertionError("the keyboard never reached the log box")
        await page.keyboard.press("End")  # and scrolls it
        assert await page.evaluate("document.getElementById('log-0').scrollTop") > 0
    finally:
        await context.close()
