"""The job form and page: the overlap policy and jitter set and shown, a pause's note, the skipped
occurrences."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser


async def test_the_form_sets_the_overlap_policy_and_jitter_and_the_page_shows_them(
    browser: Browser, adb: AsyncDb
) -> None:
    await browser.login()
    new = (await browser.http.get("/ui/jobs/new")).text
    assert 'name="overlap_policy"' in new and '<option value="cancel_other"' in new
    key = re.search(r'name="create_key" value="(\w+)"', new)
    assert key is not None
    form = {
        "name": "hourly",
        "job_type": "deploy",
        "steps": "echo hello",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "overlap_policy": "buffer_one",
        "jitter_seconds": "40",
        "create_key": key.group(1),
    }
    response = await browser.post("/ui/jobs/new", **form)
    assert response.status_code == 303, response.text
    job_id = int(response.headers["location"].rsplit("/", 1)[1])
    assert await scalar(adb, "SELECT overlap_policy || ':' || jitter_seconds FROM jobs WHERE id = %s", job_id) == (
        "buffer_one:40"
    )
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert 'id="overlap-policy">buffer_one<' in page and "let one run wait" in page
    assert 'id="jitter">up to 40' in page
    edit = (await browser.http.get(f"/ui/jobs/{job_id}/edit")).text
    assert '<option value="buffer_one" selected>' in edit
    refused = await browser.post("/ui/jobs/new", **{**form, "overlap_policy": "sometimes", "create_key": "other"})
    assert refused.status_code == 400 and "choose one of serial" in refused.text


async def test_a_pause_from_the_page_keeps_its_note_and_skipped_occurrences_are_listed(
    browser: Browser, adb: AsyncDb
) -> None:
    await browser.login()
    row = await (
        await adb.execute(
            "INSERT INTO jobs (account_id, name, job_type, steps, cron, overlap_policy)"
            " VALUES (%s, 'hourly', 'deploy', ARRAY['true'], '0 * * * *', 'skip') RETURNING id",
            (browser.account_id,),
        )
    ).fetchone()
    assert row is not None
    job_id = row[0]
    await adb.execute(
        "INSERT INTO skipped_occurrences (account_id, job_id, occurrence_key, scheduled_at, reason, detail)"
        " VALUES (%s, %s, %s, %s, 'overlap', 'Skipped: overlap policy skip, and run 7')",
        (browser.account_id, job_id, f"sched:{job_id}:3600", datetime.fromtimestamp(3600, UTC)),
    )
    assert (await browser.post(f"/ui/jobs/{job_id}/pause", note="backfill running")).status_code == 303
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert 'id="pause-note">backfill running<' in page
    assert re.search(r'id="paused-by">token #\d+ \(web pages\)<', page)
    assert 'id="skipped-occurrences"' in page and "Skipped: overlap policy skip, and run 7" in page
