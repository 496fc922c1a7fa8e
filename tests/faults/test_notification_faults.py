"""The API process killed mid-delivery of notifications: every run outcome reaches every receiver exactly once.

Three runs end (succeeded, failed, cancelled) with four receivers each hearing of all outcomes: email
(STARTTLS and AUTH), a Slack incoming webhook, a Slack bot (chat.postMessage) and a Teams Workflows
webhook. Every receiver is slow: it holds its answer once it has a whole message. The API process,
which sends four messages at a time, is SIGKILLed while those four are held, then started again. Each
receiver must end with exactly one message per run and outcome: the held ones are in doubt and are
not sent again (the Slack bot's channel is asked instead), the others are sent after the restart.
"""

from __future__ import annotations

import re
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runplane.basics.secrets import SecretBox
from runplane.basics.settings import Settings
from tests.support.notification_receivers import HttpReceiver, SmtpReceiver
from tests.support.polling import wait_for
from tests.support.processes import Services
from tests.support.records import create_account, create_job
from tests.support.reports import failed

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(300)]
Db = psycopg.Connection[tuple[Any, ...]]
OUTCOMES = {10: "succeeded", 20: "failed", 30: "cancelled"}
IN_FLIGHT = 4


@pytest.fixture
def services(
    request: pytest.FixtureRequest, service_env: dict[str, str], tmp_path: Path, database_url: str
) -> Iterator[Services]:
    running = Services(service_env, tmp_path, database_url)
    try:
        yield running
    finally:
        running.stop_all()
        if failed(request):
            for name, _ in running.processes:
                print(f"---- {name}.log ----", *running.log_text(name).splitlines()[-80:], sep="\n")


def _notification(db: Db, account_id: int, job_id: int, **columns: object) -> None:
    names = ", ".join(columns)
    marks = ", ".join(["%s"] * len(columns))
    db.execute(
        f"INSERT INTO notifications (account_id, on_success, on_failure, on_cancel, {names})"
        f" VALUES (%s, %s, %s, %s, {marks})",
        (account_id, [job_id], [job_id], [job_id], *columns.values()),
    )


def _finish(db: Db, account_id: int, job_id: int, status: int) -> int:
    row = db.execute(
        """INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
                             scheduled_at, started_at)
           VALUES (%s, %s, 'deploy', 3, 'api', gen_random_uuid()::text, true, now(), now()) RETURNING id""",
        (account_id, job_id),
    ).fetchone()
    assert row is not None
    db.execute("UPDATE runs SET status = %s, finished_at = now() WHERE id = %s", (status, row[0]))
    return int(row[0])


def test_a_sender_killed_mid_delivery_sends_each_outcome_to_each_receiver_once(
    db: Db, settings: Settings, services: Services, tmp_path: Path
) -> None:
    box = SecretBox.from_keys(settings.secret_keys.get_secret_value())
    account_id = create_account(db)
    job_id = create_job(db, account_id, name="kill me")
    with SmtpReceiver(tmp_path, security="starttls", login=("ops", "pw")) as smtp, HttpReceiver() as http:
        _notification(db, account_id, job_id, type=4, external_email="oncall@example.test")
        _notification(
            db,
            account_id,
            job_id,
            type=2,
            secret=box.encrypt(http.url("/slack/webhook")),
            secret_kind="slack_webhook_url",
        )
        _notification(
            db,
            account_id,
            job_id,
            type=2,
            secret=box.encrypt("xoxb-test"),
            secret_kind="slack_bot_token",
            slack_channel_id="C1",
        )
        _notification(
            db, account_id, job_id, type=6, secret=box.encrypt(http.url("/teams")), secret_kind="teams_webhook_url"
        )
        smtp.hold.hold()
        http.hold.hold()
        runs = {_finish(db, account_id, job_id, status): outcome for status, outcome in OUTCOMES.items()}
        mail = {f"RUNPLANE_NOTIFICATIONS__{k.upper()}": str(v) for k, v in smtp.settings().items()}
        env = {
            **mail,
            "RUNPLANE_NOTIFICATIONS__SLACK_API_URL": http.url("/api"),
            "RUNPLANE_WEBHOOKS__ALLOWED_NETWORKS": '["127.0.0.0/8"]',
            "RUNPLANE_WEBHOOKS__POLL_INTERVAL": "0.1",
            "RUNPLANE_WEBHOOKS__BATCH_SIZE": str(IN_FLIGHT),
            "RUNPLANE_WEBHOOKS__LEASE_SECONDS": "2",
            "RUNPLANE_WEBHOOKS__TIMEOUT": "30",
            "RUNPLANE_WEBHOOKS__BACKOFF_BASE": "0.2",
        }
        api = services.start("api", "api-1", **env)
        # Four messages have left and are held by slow receivers: the sender dies now.
        wait_for(
            lambda: smtp.hold.arrived + http.hold.arrived,
            120,
            until=lambda n: n >= IN_FLIGHT,
            what="the first messages at the receivers",
        )
        api.send_signal(signal.SIGKILL)
        api.wait()
        held = smtp.hold.arrived + http.hold.arrived
        smtp.hold.release()
        http.hold.release()
        services.start("api", "api-2", **env)
        wait_for(lambda: _open_events(db, account_id), 120, until=lambda n: n == 0, what="every event closed")

        emails = Counter(_text_key(m["Subject"]) for _, m in smtp.messages)
        slack_hook = Counter(_text_key(p["text"]) for p in http.slack_webhook)
        slack_bot = Counter(
            (p["metadata"]["event_payload"]["run_id"], p["metadata"]["event_payload"]["outcome"])
            for p in http.slack_posts
        )
        teams = Counter(_text_key(p["attachments"][0]["content"]["body"][0]["text"]) for p in http.teams)
    expected = Counter(runs.items())
    assert held == IN_FLIGHT  # nothing more left while the receivers held
    assert emails == expected
    assert slack_hook == expected
    assert slack_bot == expected
    assert teams == expected
    closed: dict[str, int] = dict(
        db.execute(
            "SELECT outcome, count(*) FROM webhook_outbox WHERE account_id = %s GROUP BY outcome", (account_id,)
        ).fetchall()
    )
    # The four cut off were in doubt: the Slack bot's found in its channel, the others closed unsent.
    assert sum(closed.values()) == 12
    assert closed.get("in doubt", 0) + closed.get("found in the channel after a cut-off send", 0) == IN_FLIGHT, closed


def _open_events(db: Db, account_id: int) -> int:
    row = db.execute(
        "SELECT count(*) FROM webhook_outbox WHERE account_id = %s AND delivered_at IS NULL AND abandoned_at IS NULL",
        (account_id,),
    ).fetchone()
    assert row is not None
    return int(row[0])


TITLE = re.compile(r"run #(\d+) (\w+)$")


def _text_key(text: str) -> tuple[int, str]:
    match = TITLE.search(text)
    assert match is not None, text
    return int(match.group(1)), match.group(2)
