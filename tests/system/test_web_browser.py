"""The web pages in a real browser (Debian's chromium, driven by Playwright) against `runplane up --demo`:
log in, run the dbt build and watch its log arrive live, see its models, download its manifest.json,
cancel a run, see another account's run answer 404, make a project, an environment and a job from the
pages and run it, and keep a 1280×800 screenshot of every page."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from api.admin import create_account
from runplane.basics.settings import Settings
from runplane.commands.demo_warehouse import DemoWarehouse
from tests.support.ports import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.dbt]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
DBT_BIN = ROOT / ".venv-dbt" / "bin"
SCREENSHOTS = Path(os.environ.get("RUNPLANE_SCREENSHOTS", ROOT / "build" / "web-screenshots"))
SERVICES = 7  # api, orchestrator, 2 queuer workers, scheduler, 2 dispatchers: one metrics port each


@dataclass
class Demo:
    base: str
    token: str
    jobs: dict[str, int]
    log: Path


def _wait_for(condition: Callable[[], object], timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


@pytest.fixture
def demo(service_env: dict[str, str], settings: Settings, tmp_path: Path) -> Iterator[Demo]:
    if not (DBT_BIN / "dbt").is_file():
        pytest.fail(f"dbt is not installed in {DBT_BIN}: run `make .venv-dbt`")
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    env = dict(service_env)
    env["HOME"] = str(tmp_path)  # the demo's key file and git repository are this test's own
    env["RUNPLANE_METRICS_PORT"] = str(free_ports(SERVICES)[0])
    env["RUNPLANE_DRAIN_SECONDS"] = "5"
    env["RUNPLANE_RUNNER__DBT_VERSIONS"] = json.dumps({"1.10": str(DBT_BIN)})
    env["RUNPLANE_RUNNER__REPOSITORY_CACHE"] = str(tmp_path / "repository-cache")
    env["RUNPLANE_RUNNER__LOCAL_UID"] = "-1"  # the cache above is in root's private tmp: runs keep root
    log = tmp_path / "up.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runplane", "up", "--demo"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        _wait_for(lambda: "demo token:" in log.read_text(), 120, "the demo to be seeded", log)
        text = log.read_text()
        token = re.search(r"demo token: (\S+)", text)
        dbt_jobs = re.search(
            r"jaffle-build \(every 10 minutes\), jaffle-ci, jaffle-after-build = \[(\d+), (\d+), (\d+)\]", text
        )
        demo_jobs = re.search(r"demo account \d+, jobs \[(\d+), (\d+), (\d+)", text)
        assert token and dbt_jobs and demo_jobs, text
        base = f"http://127.0.0.1:{settings.api.rest_port}"
        _wait_for(lambda: _answers(base), 60, "the web pages", log)
        yield Demo(
            base,
            token.group(1),
            {"jaffle-build": int(dbt_jobs.group(1)), "run-now": int(demo_jobs.group(1))},
            log,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers(base: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{base}/ui/login", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _shot(page: Page, name: str) -> None:
    page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=False)


def _status(page: Page) -> str:
    return page.inner_text("#status").strip()


# Two dbt builds (the demo's and the job made on the pages) after the demo starts: about 70 s on an
# idle machine, over three minutes when the machine's two cores are shared with other test runs.
@pytest.mark.timeout(360)
def test_the_pages_in_a_browser(demo: Demo, settings: Settings, database_url: str) -> None:
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    print(f"\nscreenshots: {SCREENSHOTS}")
    other_run = _another_accounts_run(settings, database_url)
    demo_project = _demo_project(settings, database_url)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
        page = context.new_page()
        try:
            _walk_through(page, demo, other_run)
            _make_and_run_a_job(page, demo, demo_project)
        finally:
            context.close()
            browser.close()


def _walk_through(page: Page, demo: Demo, other_run: int) -> None:
    page.goto(f"{demo.base}/ui/runs")
    expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    _shot(page, "01-login")
    page.fill("#token", demo.token)
    page.click("#login")
    expect(page).to_have_url(re.compile(r"/ui/runs$"))

    # Run the dbt build now and watch its log arrive while it runs.
    page.goto(f"{demo.base}/ui/jobs")
    expect(page.locator("#jobs")).to_contain_text("jaffle-build")
    _shot(page, "02-jobs")
    page.goto(f"{demo.base}/ui/jobs/{demo.jobs['jaffle-build']}")
    expect(page.locator("#next-fires tr")).to_have_count(5)
    _shot(page, "03-job")
    page.click("#run-now-button")
    expect(page).to_have_url(re.compile(r"/ui/runs/\d+$"))
    # dbt's first lines show while the page still follows the running run (it reloads once the run ends):
    # the build is step 4, after the setup steps (its log is log-3, its models models-4).
    page.wait_for_function(
        """() => document.querySelector("#following") !== null
                 && document.querySelector("#status").textContent === "running"
                 && (document.querySelector("#log-3")?.textContent ?? "").includes("Running with dbt")""",
        polling="raf",
        timeout=120_000,
    )
    _shot(page, "04-run-live")
    expect(page.locator("#status")).to_have_text(re.compile("success|error"), timeout=240_000)
    assert _status(page) == "success", page.inner_text("main")
    expect(page.locator("#log-0")).to_contain_text("runplane: checked out")
    expect(page.locator("#log-3")).to_contain_text("Completed successfully")
    expect(page.locator("#models-4")).to_contain_text("model.jaffle_shop.")
    _shot(page, "05-run-done")

    with page.expect_download() as download_info:
        page.locator("#artifacts a", has_text=re.compile(r"^target/manifest\.json$")).first.click()
    download = download_info.value
    assert download.suggested_filename == "manifest.json"
    manifest = json.loads(Path(download.path()).read_text())
    assert any(key.startswith("model.jaffle_shop.") for key in manifest["nodes"])

    # Cancel a run that would sleep for a minute.
    page.goto(f"{demo.base}/ui/jobs/{demo.jobs['run-now']}")
    page.fill("textarea[name=steps]", "echo about to sleep\nsleep 120")
    page.click("#run-now-button")
    expect(page.locator("#log-0")).to_contain_text("about to sleep", timeout=60_000)
    page.click("#cancel")
    expect(page.locator("#status")).to_have_text("cancelled", timeout=60_000)
    _shot(page, "06-run-cancelled")

    page.goto(f"{demo.base}/ui/runs")
    expect(page.locator("#runs tbody tr")).not_to_have_count(0)
    _shot(page, "07-runs")
    page.goto(f"{demo.base}/ui/on-time?window=1h")
    expect(page.locator("#on-time-ratio")).to_be_visible()
    _shot(page, "08-on-time")

    response = page.goto(f"{demo.base}/ui/runs/{other_run}")
    assert response is not None and response.status == 404
    expect(page.locator("#problem")).to_contain_text(f"run {other_run} not found")
    _shot(page, "09-other-account-404")


def _make_and_run_a_job(page: Page, demo: Demo, source: dict[str, Any]) -> None:
    """A project, an environment and a job made on the pages (one refusal on the way), then run."""
    page.goto(f"{demo.base}/ui/projects")
    page.click("#new-project")
    page.fill("#f-name", "jaffle from the pages")
    page.fill("#f-repository_url", source["repository_url"])
    page.fill("#f-subdirectory", source["subdirectory"])
    _shot(page, "10-new-project")
    page.click("#save-project")
    expect(page).to_have_url(re.compile(r"/ui/projects#project-\d+$"))
    project_id = int(page.url.rsplit("-", 1)[1])

    page.click(f"#project-{project_id} .new-environment")
    page.fill("#f-name", "from the pages")
    page.fill("#f-dbt_version", source["dbt_version"])
    for field in ("host", "port", "user", "dbname"):
        page.fill(f"#f-conn_{field}", str(source["connection"].get(field, "")))
    page.fill("#f-conn_password", source["password"])  # write-only: stored encrypted, never shown
    page.fill("#f-schema", "from_the_pages")
    _shot(page, "11-new-environment")
    page.click("#save-environment")
    expect(page.locator(f"#project-{project_id}")).to_contain_text("from the pages")

    page.goto(f"{demo.base}/ui/jobs")
    page.click("#new-job")
    page.fill("#f-name", "build from the pages")
    page.select_option("#f-environment_id", label="from the pages")
    page.fill("#f-steps", "dbt build")
    page.fill("#f-threads", "999")
    page.click("#save-job")
    expect(page.locator("#e-threads")).to_contain_text("must be between 0 and 64")
    expect(page.locator("#f-name")).to_have_value("build from the pages")  # what was typed stays
    _shot(page, "12-job-refused")
    page.fill("#f-threads", "2")
    page.click("#save-job")
    expect(page).to_have_url(re.compile(r"/ui/jobs/\d+$"))
    page.click("#run-now-button")
    expect(page).to_have_url(re.compile(r"/ui/runs/\d+$"))
    expect(page.locator("#status")).to_have_text(re.compile("success|error"), timeout=240_000)
    assert _status(page) == "success", page.inner_text("main")
    expect(page.locator("#models-4")).to_contain_text("model.jaffle_shop.")
    _shot(page, "13-job-from-the-pages-ran")
    page.click("#logout")
    expect(page).to_have_url(re.compile(r"/ui/login$"))


def _demo_project(settings: Settings, database_url: str) -> dict[str, Any]:
    """Where the demo's dbt project and warehouse are, for the ones the test makes on the pages."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT p.repository_url, p.subdirectory, e.dbt_version, e.connection FROM environments e"
            " JOIN projects p ON p.id = e.project_id ORDER BY e.id LIMIT 1"
        ).fetchone()
    assert row is not None, "the demo has no environment"
    password = DemoWarehouse.for_install(settings).password_file.read_text().strip()
    return dict(zip(("repository_url", "subdirectory", "dbt_version", "connection"), row, strict=True)) | {
        "password": password
    }


def _another_accounts_run(settings: Settings, database_url: str) -> int:
    """A run of another account, in the same database the demo runs on."""
    account_id, _ = asyncio.run(create_account(settings, name="globex", run_slots=1, memory_mb=512))
    with psycopg.connect(database_url, autocommit=True) as conn:
        job = conn.execute(
            "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, 'theirs', 'deploy', '{echo}')"
            " RETURNING id",
            (account_id,),
        ).fetchone()
        assert job is not None
        run = conn.execute(
            "INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,"
            " scheduled_at, finished_at)"
            " VALUES (%s, %s, 'deploy', 10, 'api', 'theirs-1', true, now(), now()) RETURNING id",
            (account_id, job[0]),
        ).fetchone()
        assert run is not None
        return int(run[0])
