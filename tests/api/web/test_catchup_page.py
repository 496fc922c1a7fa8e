"""The job form and page: the catch-up window set and shown."""

from __future__ import annotations

import re

from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser


async def test_the_form_sets_the_catchup_window_and_the_page_shows_it(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    new = (await browser.http.get("/ui/jobs/new")).text
    assert 'name="catchup_window_seconds"' in new and 'name="catchup_all"' in new
    key = re.search(r'name="create_key" value="(\w+)"', new)
    assert key is not None
    form = {
        "name": "hourly",
        "job_type": "deploy",
        "steps": "echo hello",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "overlap_policy": "serial",
        "catchup_window_seconds": "7200",
        "catchup_all": "on",
        "create_key": key.group(1),
    }
    response = await browser.post("/ui/jobs/new", **form)
    assert response.status_code == 303, response.text
    job_id = int(response.headers["location"].rsplit("/", 1)[1])
    stored = "SELECT catchup_window_seconds || ':' || catchup_all FROM jobs WHERE id = %s"
    assert await scalar(adb, stored, job_id) == "7200:true"
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert re.search(r'id="catchup">2 ?h[^<]*every missed fire', page), page
    edit = (await browser.http.get(f"/ui/jobs/{job_id}/edit")).text
    assert 'value="7200"' in edit
    # Saved again without the box ticked and with the window emptied: none.
    version = re.search(r'name="version" value="(\d+)"', edit)
    assert version is not None
    again = {k: v for k, v in form.items() if k not in {"catchup_all", "create_key"}}
    saved = await browser.post(
        f"/ui/jobs/{job_id}/edit", **{**again, "catchup_window_seconds": "", "version": version.group(1)}
    )
    assert saved.status_code == 303, saved.text
    assert await scalar(adb, stored, job_id) == "0:false"
    assert 'id="catchup">none<' in (await browser.http.get(f"/ui/jobs/{job_id}")).text
