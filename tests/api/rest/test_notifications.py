"""Notifications over REST in dbt Cloud's v2 shape, their test message and delivery log; and the
webhooks' test, events and receipts as dbt Cloud's v3 documents them. The sending is the outbox's
(the deliverer runs here against the same database, with a real SMTP server and HTTP receiver)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool

from api.webhooks.deliveries import WebhookDeliverer
from runplane.adapters.db import Connection, close_pool, open_pool
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import NotificationSettings, Settings
from tests.api.conftest import AsyncDb, Rest
from tests.support.notification_receivers import HttpReceiver, SmtpReceiver

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[AsyncConnectionPool[Connection]]:
    pool = await open_pool(database_url, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await close_pool(pool)


async def _deliver_until(deliverer: WebhookDeliverer, done: Callable[[], bool]) -> None:
    async with httpx.AsyncClient(timeout=5) as http:
        for _ in range(40):
            await deliverer.deliver_due(http)
            if done():
                return
    raise AssertionError("the outbox did not deliver what was expected")


def _deliverer(pool: AsyncConnectionPool[Connection], settings: Settings, **notification: object) -> WebhookDeliverer:
    box = SecretBox.from_keys(settings.secret_keys.get_secret_value())
    webhooks = settings.webhooks.model_copy(update={"allowed_networks": ["127.0.0.0/8"], "backoff_base": 0.0})
    return WebhookDeliverer(pool, box, webhooks, NotificationSettings.model_validate(notification))


async def test_notifications_are_made_read_and_deleted_in_dbt_clouds_shape_and_never_show_a_secret(
    rest: Rest, other_rest: Rest, adb: AsyncDb
) -> None:
    job_id = await rest.create_job(adb)
    url = f"{rest.base}/notifications/"
    body = {
        "account_id": rest.account_id,
        "user_id": 1,
        "type": 2,
        "slack_channel_id": "C042",
        "slack_channel_name": "#data",
        "slack_bot_token": "xoxb-very-secret",
        "on_success": [],
        "on_failure": [job_id],
        "on_cancel": [job_id],
        "on_warning": [],
        "state": 1,
    }
    created = await rest.http.post(url, json=body)
    assert created.status_code == 200, created.text
    data = created.json()["data"]
    assert "xoxb-very-secret" not in created.text
    assert data["secret_set"] == "slack_bot_token"
    assert (data["type"], data["on_failure"], data["on_cancel"], data["state"]) == (2, [job_id], [job_id], 1)
    one = f"{url}{data['id']}/"
    listed = (await rest.http.get(url)).json()
    assert [n["id"] for n in listed["data"]] == [data["id"]]
    assert listed["extra"]["filters"] == {"limit": 100, "offset": 0, "state": 1}
    assert "xoxb-very-secret" not in (await rest.http.get(one)).text
    # Another account sees nothing of it.
    assert (await other_rest.http.get(f"{other_rest.base}/notifications/{data['id']}/")).status_code == 404
    # An update keeps the stored token when it is not typed again.
    updated = await rest.http.post(one, json={**body, "slack_bot_token": "", "on_warning": [job_id]})
    assert updated.status_code == 200, updated.text
    assert updated.json()["data"]["on_warning"] == [job_id]
    assert updated.json()["data"]["secret_set"] == "slack_bot_token"
    refused = await rest.http.post(url, json={**body, "type": 4, "external_email": "two@a.test, three@a.test"})
    assert refused.status_code == 400 and "external_email" in refused.text
    refused = await rest.http.post(url, json={**body, "on_failure": [10**12]})
    assert refused.status_code == 400 and f"job {10**12} not found" in refused.text
    refused = await rest.http.post(url, json={**body, "type": 6, "teams_webhook_url": "http://127.0.0.1:9/x"})
    assert refused.status_code == 400 and "public addresses" in refused.text
    deleted = await rest.http.delete(one)
    assert deleted.json()["data"]["state"] == 2
    assert (await rest.http.get(url)).json()["data"] == []


async def test_send_a_test_email_and_read_its_delivery_log(
    rest: Rest, settings: Settings, pool: AsyncConnectionPool[Connection], tmp_path: Path
) -> None:
    created = await rest.http.post(
        f"{rest.base}/notifications/",
        json={"type": 4, "external_email": "team@example.test", "on_failure": [], "state": 1},
    )
    notification_id = created.json()["data"]["id"]
    sent = await rest.http.post(f"{rest.base}/notifications/{notification_id}/test/")
    assert sent.status_code == 200, sent.text
    event_id = sent.json()["data"]["event_id"]
    with SmtpReceiver(tmp_path, security="none") as smtp:
        await _deliver_until(_deliverer(pool, settings, **smtp.settings()), lambda: len(smtp.messages) == 1)
    [(rcpt, message)] = smtp.messages
    assert rcpt == ["team@example.test"] and message["Subject"].startswith("[test] Test notification")
    log = (await rest.http.get(f"{rest.base}/notifications/{notification_id}/deliveries/")).json()["data"]
    [delivery] = log
    assert (delivery["event_id"], delivery["status"], delivery["attempts"]) == (event_id, "delivered", 1)
    assert delivery["attempt_log"][0]["response_body"].startswith("250 ")


async def test_a_webhooks_test_event_its_events_and_receipts(
    rest: Rest, settings: Settings, pool: AsyncConnectionPool[Connection], adb: AsyncDb
) -> None:
    v3 = f"/api/v3/accounts/{rest.account_id}/webhooks"
    with HttpReceiver() as receiver:
        created = await rest.http.post(
            f"{v3}/subscriptions/",
            json={"name": "ops", "client_url": "https://hooks.example.test/x", "event_types": ["job.run.completed"]},
        )
        assert created.status_code == 200, created.text
        webhook_id = created.json()["data"]["id"]
        # The receiver is local: point the stored subscription at it (the API refuses a local URL).
        await adb.execute(
            "UPDATE webhook_subscriptions SET client_url = %s WHERE id = %s",
            (receiver.url("/slack/webhook"), webhook_id),
        )
        tested = await rest.http.get(f"{v3}/subscription/{webhook_id}/test")
        assert tested.status_code == 200, tested.text
        event_id = tested.json()["data"]["event_id"]
        # The slack path refuses a webhook body (no text, no blocks): the receipt keeps its answer.
        await _deliver_until(_deliverer(pool, settings), lambda: True)
    events = (await rest.http.get(f"{v3}/subscription/{webhook_id}/events")).json()
    [event] = events["data"]
    assert (event["id"], event["trigger_event_type"], event["http_status_code"]) == (event_id, "test", "400")
    receipts = (await rest.http.get(f"{v3}/subscription/{webhook_id}/event/{event_id}/receipt")).json()["data"]
    [receipt] = receipts
    assert receipt["http_status_code"] == "400" and receipt["error_info"] == "HTTP 400"
    assert receipt["response_body"].startswith("invalid_blocks")
    assert f'"eventId":"{event_id}"' in receipt["request_body"]
