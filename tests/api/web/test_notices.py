"""The job page's notifications: added from its form by the same rules as the APIs', a test message
queued on the outbox, and each message's status, attempts and the receiver's answer shown; a receiver
switched off says so and why."""

from __future__ import annotations

from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser
from tests.support.web_rows import insert_job


async def test_a_job_page_adds_a_notification_sends_a_test_and_shows_its_log(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    job = await insert_job(adb, browser.account_id, "nightly")
    assert "No one is told of this job" in (await browser.http.get(f"/ui/jobs/{job}")).text

    added = await browser.post(
        f"/ui/jobs/{job}/notifications", type="4", external_email="oncall@example.test", outcome="failure"
    )
    assert added.status_code == 303, added.text
    notification = await scalar(
        adb, "SELECT id FROM notifications WHERE account_id = %s AND %s = ANY (on_failure)", browser.account_id, job
    )
    refused = await browser.post(f"/ui/jobs/{job}/notifications", type="6", url="http://127.0.0.1/x", outcome="failure")
    assert refused.status_code == 400 and "public addresses" in refused.text

    tested = await browser.post(f"/ui/jobs/{job}/notifications/{notification}/test")
    assert tested.status_code == 303
    # What a sender records, as the outbox's deliverer does: one failed attempt with the server's answer.
    outbox = await scalar(adb, "SELECT id FROM webhook_outbox WHERE notification_id = %s", notification)
    await adb.execute(
        "INSERT INTO webhook_attempts (outbox_id, status_code, latency_ms, error, response_body)"
        " VALUES (%s, 550, 3, 'the mail server refused oncall@example.test: 550 no such user', '550')",
        (outbox,),
    )
    await adb.execute("UPDATE webhook_outbox SET attempts = 1 WHERE id = %s", (outbox,))
    page = (await browser.http.get(f"/ui/jobs/{job}")).text
    assert 'id="notifications"' in page and "oncall@example.test" in page and "failure" in page
    assert '<td class="delivery-status">pending</td>' in page
    assert "550 the mail server refused oncall@example.test: 550 no such user" in page
    assert "1 attempt<" in page

    await adb.execute(
        "UPDATE notifications SET disabled_at = now(), disabled_reason = 'switched off after 5 failed attempts' "
        "WHERE id = %s",
        (notification,),
    )
    page = (await browser.http.get(f"/ui/jobs/{job}")).text
    assert "switched off</span>" in page and "switched off after 5 failed attempts" in page
