"""Notifications of a run's end, sent from the webhooks' outbox to real receivers: an SMTP server
(STARTTLS, TLS, AUTH), Slack (incoming webhook; bot token with chat.postMessage) and Teams Workflows,
each checking the documented payload; the models' owners from a manifest dbt wrote; one message per
outcome and receiver; and a receiver switched off after failing five times in a row.

``data/jaffle_groups_manifest.json.gz`` is ``dbt parse`` of ``examples/jaffle_shop`` with
``data/jaffle_groups.yml`` added and ``+group`` set: staging in ``marketing``, marts in ``finance``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from api.notification_definitions import Notifications, notification_spec
from api.store import Store
from api.webhooks import messages
from api.webhooks.deliveries import WebhookDeliverer
from runplane.adapters.db import Connection, close_pool, open_pool
from runplane.basics.addresses import AddressPolicy
from runplane.basics.errors import InvalidArgument
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import NotificationSettings, Settings
from runplane.basics.types import AccountId
from tests.support.notification_receivers import HttpReceiver, SmtpReceiver, slack_problem, teams_problem
from tests.support.records import create_account, create_job

pytestmark = pytest.mark.timeout(120)
Db = psycopg.Connection[tuple[Any, ...]]
DATA = Path(__file__).parent / "data"
LOCAL = ["127.0.0.0/8", "::1/128"]
MANIFEST = gzip.decompress((DATA / "jaffle_groups_manifest.json.gz").read_bytes())


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[AsyncConnectionPool[Connection]]:
    pool = await open_pool(database_url, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        await close_pool(pool)


@pytest.fixture
def box(settings: Settings) -> SecretBox:
    return SecretBox.from_keys(settings.secret_keys.get_secret_value())


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as receiver:
        yield receiver


def _notifications(pool: AsyncConnectionPool[Connection], box: SecretBox) -> Notifications:
    return Notifications(Store(pool, box), box)


def _deliverer(
    pool: AsyncConnectionPool[Connection], box: SecretBox, settings: Settings, **notification: Any
) -> WebhookDeliverer:
    webhooks = settings.webhooks.model_copy(
        update={"allowed_networks": LOCAL, "backoff_base": 0.0, "backoff_cap": 0.0, "timeout": 5.0}
    )
    values = {"slack_api_url": "", **notification}
    return WebhookDeliverer(pool, box, webhooks, NotificationSettings(**values), "https://runplane.example")


async def _deliver_until(deliverer: WebhookDeliverer, done: Callable[[], bool], rounds: int = 40) -> None:
    """Claim and send until ``done`` (each round sends what is due; backoff is 0 here)."""
    async with httpx.AsyncClient(timeout=5, follow_redirects=False) as http:
        for _ in range(rounds):
            await deliverer.deliver_due(http)
            if done():
                return
    raise AssertionError("the outbox did not deliver what was expected")


def _finished_run(
    db: Db,
    account_id: int,
    job_id: int,
    status: int,
    *,
    results: list[dict[str, Any]] | None = None,
    failing_log: str = "",
    manifest: bytes | None = None,
) -> int:
    """A run of the job that ran a `dbt build` step and ended with ``status``; its artifacts and log."""
    row = db.execute(
        """INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
                             scheduled_at, started_at)
           VALUES (%s, %s, 'deploy', 3, 'api', gen_random_uuid()::text, true, now(), now() - interval '83 seconds')
           RETURNING id""",
        (account_id, job_id),
    ).fetchone()
    assert row is not None
    run_id = int(row[0])
    step_status = 20 if failing_log else 10
    db.execute(
        "INSERT INTO run_steps (run_id, step_index, command, status, exit_code) VALUES (%s, 0, 'dbt build', %s, %s)",
        (run_id, step_status, 1 if failing_log else 0),
    )
    if failing_log:
        db.execute(
            "INSERT INTO run_log_chunks (run_id, seq, step_index, text) VALUES (%s, 1, 0, %s)", (run_id, failing_log)
        )
    if results is not None:
        content = json.dumps({"results": results}).encode()
        db.execute(
            "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/run_results.json', 0, %s)",
            (run_id, content),
        )
    if manifest is not None:
        db.execute(
            "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/manifest.json', 0, %s)",
            (run_id, manifest),
        )
    db.execute(
        "UPDATE runs SET status = %s, finished_at = now(), status_message = %s WHERE id = %s",
        (status, "Step 1 (dbt build) failed" if status == 20 else "", run_id),
    )
    return run_id


FAILED_LOG = (
    "\x1b[0m12:00:01  Running with dbt=1.10.0\n"
    "12:00:03  1 of 5 START sql view model analytics.stg_orders ........ [RUN]\n"
    "12:00:04  Database Error in model stg_orders (models/staging/stg_orders.sql)\n"
    '12:00:04    relation "raw_orders" does not exist\n'
    "12:00:05  Done. PASS=3 WARN=0 ERROR=1 SKIP=1 TOTAL=5\n"
)


def _result(unique_id: str, status: str) -> dict[str, Any]:
    return {"unique_id": unique_id, "status": status, "execution_time": 0.5, "message": status}


def _outbox(db: Db, run_id: int) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT notification_id, recipient, delivered_at IS NOT NULL, abandoned_at IS NOT NULL, outcome "
        "FROM webhook_outbox WHERE run_id = %s ORDER BY id",
        (run_id,),
    ).fetchall()


MAIL_SERVERS = {"starttls": ("starttls", ("ops", "s3cret")), "tls": ("tls", None), "plain": ("none", None)}


@pytest.fixture(params=sorted(MAIL_SERVERS))
def mail_server(request: pytest.FixtureRequest) -> tuple[str, tuple[str, str] | None]:
    security, login = MAIL_SERVERS[request.param]
    return security, login


async def test_a_failed_run_is_emailed_once_with_its_step_errors_and_models(
    db: Db,
    settings: Settings,
    pool: AsyncConnectionPool[Connection],
    tmp_path: Path,
    mail_server: tuple[str, tuple[str, str] | None],
) -> None:
    security, login = mail_server
    box = SecretBox.from_keys(settings.secret_keys.get_secret_value())
    account_id = AccountId(create_account(db))
    job_id = create_job(db, account_id, name="nightly build")
    with SmtpReceiver(tmp_path, security=security, login=login) as smtp:
        await _notifications(pool, box).create(
            account_id, notification_spec(type=4, external_email="oncall@example.test", on_failure=[job_id])
        )
        results = [_result("model.jaffle_shop.stg_orders", "error"), _result("model.jaffle_shop.orders", "skipped")]
        run_id = _finished_run(db, account_id, job_id, 20, results=results, failing_log=FAILED_LOG)
        await _deliver_until(_deliverer(pool, box, settings, **smtp.settings()), lambda: len(smtp.messages) == 1)
        # Nothing more is due: the one message is the only one.
        await _deliver_until(_deliverer(pool, box, settings, **smtp.settings()), lambda: True)
    [(rcpt, message)] = smtp.messages
    assert rcpt == ["oncall@example.test"]
    assert smtp.tls == [security != "none"]
    assert smtp.logins == ([login[0]] if login else [])
    assert message["Subject"] == f"nightly build: run #{run_id} failed"
    assert message["From"] == "runplane@example.test"
    [event_id] = [r[0] for r in db.execute("SELECT event_id FROM webhook_outbox WHERE run_id = %s", (run_id,))]
    assert message["Message-ID"] == f"<{event_id}@example.test>"
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None and html is not None
    body, markup = text.get_content(), html.get_content()
    assert "Failing step: 1. dbt build" in body
    assert "Database Error in model stg_orders (models/staging/stg_orders.sql)" in body
    assert "Running with dbt" not in body  # the error lines, not the whole log
    assert "  - model.jaffle_shop.stg_orders" in body
    assert "Duration: 1m 23s" in body
    assert f"https://runplane.example/ui/runs/{run_id}/" in body
    assert "<h3>Failed models</h3>" in markup and "model.jaffle_shop.stg_orders" in markup
    assert "relation &#34;raw_orders&#34; does not exist" in markup  # escaped in HTML
    assert f'href="https://runplane.example/ui/runs/{run_id}/"' in markup
    assert [r[1:] for r in _outbox(db, run_id)] == [("", True, False, "")]


async def test_a_success_with_a_test_warning_is_a_warning_and_goes_where_warnings_go(
    db: Db, settings: Settings, pool: AsyncConnectionPool[Connection], box: SecretBox, http_receiver: HttpReceiver
) -> None:
    account_id = AccountId(create_account(db))
    job_id = create_job(db, account_id, name="hourly")
    notifications = _notifications(pool, box)
    await notifications.create(
        account_id,
        notification_spec(
            type=2,
            slack_webhook_url=http_receiver.url("/slack/webhook"),
            on_warning=[job_id],
            allowed_networks=AddressPolicy(LOCAL),
        ),
    )
    await notifications.create(
        account_id,
        notification_spec(
            type=6,
            teams_webhook_url=http_receiver.url("/teams"),
            on_success=[job_id],
            allowed_networks=AddressPolicy(LOCAL),
        ),
    )
    warned = [_result("test.jaffle_shop.unique_orders_order_id.fed79b3a6e", "warn"), _result("model.a.b", "success")]
    run_id = _finished_run(db, account_id, job_id, 10, results=warned)
    deliverer = _deliverer(pool, box, settings)
    await _deliver_until(deliverer, lambda: len(_done(db, run_id)) == 2)
    # The Slack hook asked for warnings and got one; Teams asked for successes only, and a warning is not one.
    [slack] = http_receiver.slack_webhook
    assert http_receiver.teams == []
    assert slack_problem(slack) is None
    assert slack["text"] == f"hourly: run #{run_id} warned"
    sections = " ".join(json.dumps(b) for b in slack["blocks"])
    assert "*Warned models*" in sections and "unique_orders_order_id" in sections
    assert any(b["type"] == "actions" and b["elements"][0]["url"].endswith(f"/runs/{run_id}/") for b in slack["blocks"])
    outcomes = sorted(r[4] for r in _outbox(db, run_id))
    assert outcomes == ["", "skipped: warned is not asked for"]


def _done(db: Db, run_id: int) -> list[tuple[Any, ...]]:
    return [r for r in _outbox(db, run_id) if r[2] or r[3]]


async def test_teams_gets_an_adaptive_card_and_a_slack_bot_posts_blocks_with_its_token(
    db: Db, settings: Settings, pool: AsyncConnectionPool[Connection], box: SecretBox, http_receiver: HttpReceiver
) -> None:
    account_id = AccountId(create_account(db))
    job_id = create_job(db, account_id, name="daily")
    notifications = _notifications(pool, box)
    local = AddressPolicy(LOCAL)
    await notifications.create(
        account_id,
        notification_spec(
            type=6, teams_webhook_url=http_receiver.url("/teams"), on_cancel=[job_id], allowed_networks=local
        ),
    )
    bot = await notifications.create(
        account_id,
        notification_spec(type=2, slack_bot_token="xoxb-test", slack_channel_id="C0123", on_cancel=[job_id]),
    )
    assert bot.secret != "xoxb-test" and box.decrypt(bot.secret) == "xoxb-test"  # stored encrypted
    run_id = _finished_run(db, account_id, job_id, 30)
    deliverer = _deliverer(pool, box, settings, slack_api_url=http_receiver.url("/api"))
    await _deliver_until(deliverer, lambda: len(_done(db, run_id)) == 2)
    [teams] = http_receiver.teams
    assert teams_problem(teams) is None
    card = teams["attachments"][0]["content"]
    facts = {f["title"]: f["value"] for f in card["body"][1]["facts"]}
    assert facts["Job"] == "daily" and facts["Outcome"] == "cancelled" and facts["Duration"] == "1m 23s"
    assert card["actions"][0]["url"] == f"https://runplane.example/ui/runs/{run_id}/"
    [post] = http_receiver.slack_posts
    assert post["channel"] == "C0123"
    assert post["metadata"]["event_payload"]["run_id"] == run_id
    assert all(r[2] for r in _outbox(db, run_id))


async def test_the_owners_of_failed_and_warned_models_each_get_one_email_about_their_own(
    db: Db, settings: Settings, pool: AsyncConnectionPool[Connection], box: SecretBox, tmp_path: Path
) -> None:
    account_id = AccountId(create_account(db))
    job_id = create_job(db, account_id, name="jaffle")
    results = [
        _result("model.jaffle_shop.stg_orders", "error"),  # marketing
        _result("test.jaffle_shop.unique_orders_order_id.fed79b3a6e", "warn"),  # finance (tests orders)
        _result("model.jaffle_shop.customers", "success"),
        _result("seed.jaffle_shop.raw_orders", "error"),  # no group: no owner
    ]
    with SmtpReceiver(tmp_path, security="none") as smtp:
        await _notifications(pool, box).create(account_id, notification_spec(type=7, on_failure=[job_id]))
        run_id = _finished_run(db, account_id, job_id, 20, results=results, failing_log=FAILED_LOG, manifest=MANIFEST)
        deliverer = _deliverer(pool, box, settings, **smtp.settings())
        await _deliver_until(deliverer, lambda: len(smtp.messages) == 2 and len(_done(db, run_id)) == 3)
        await _deliver_until(deliverer, lambda: True)  # nothing more is due
    by_owner = {rcpt[0]: message for rcpt, message in smtp.messages}
    assert sorted(by_owner) == ["finance-owner@example.test", "marketing-owner@example.test"]
    marketing = by_owner["marketing-owner@example.test"].get_body(("plain",))
    finance = by_owner["finance-owner@example.test"].get_body(("plain",))
    assert marketing is not None and finance is not None
    assert "model.jaffle_shop.stg_orders" in marketing.get_content()
    assert "unique_orders_order_id" not in marketing.get_content()
    assert "test.jaffle_shop.unique_orders_order_id.fed79b3a6e" in finance.get_content()
    assert "stg_orders" not in finance.get_content().split("Failing step")[0]
    recipients = sorted(r[1] for r in _outbox(db, run_id))
    assert recipients == ["", "finance-owner@example.test", "marketing-owner@example.test"]


async def test_a_receiver_failing_five_times_in_a_row_is_switched_off_and_says_so(
    db: Db, settings: Settings, pool: AsyncConnectionPool[Connection], box: SecretBox, http_receiver: HttpReceiver
) -> None:
    account_id = AccountId(create_account(db))
    job_id = create_job(db, account_id, name="flaky")
    notifications = _notifications(pool, box)
    teams = await notifications.create(
        account_id,
        notification_spec(
            type=6,
            teams_webhook_url=http_receiver.url("/teams"),
            on_failure=[job_id],
            allowed_networks=AddressPolicy(LOCAL),
        ),
    )
    db.execute(
        "INSERT INTO webhook_subscriptions (id, account_id, name, client_url, event_types, hmac_secret)"
        " VALUES ('wsu_flaky', %s, 'ops', %s, '{job.run.errored}', %s)",
        (account_id, http_receiver.url("/hook"), box.encrypt("s")),
    )
    http_receiver.failing = True
    first = _finished_run(db, account_id, job_id, 20)
    deliverer = _deliverer(pool, box, settings)

    def switched_off() -> bool:
        rows = db.execute(
            "SELECT (SELECT disabled_at IS NOT NULL FROM notifications WHERE id = %s),"
            " (SELECT disabled_at IS NOT NULL AND NOT active FROM webhook_subscriptions WHERE id = 'wsu_flaky')",
            (teams.id,),
        ).fetchone()
        return rows == (True, True)

    await _deliver_until(deliverer, switched_off)
    attempts = db.execute(
        "SELECT count(*) FROM webhook_attempts a JOIN webhook_outbox o ON o.id = a.outbox_id WHERE o.run_id = %s",
        (first,),
    ).fetchone()
    assert attempts == (10,)  # five each, no sixth
    shown = await notifications.get(account_id, teams.id)
    assert shown.disabled_reason.startswith("switched off after 5 failed attempts in a row; the last: HTTP 500")
    assert all(r[3] for r in _outbox(db, first))  # its undelivered event is closed with it
    # Switched off, it hears of nothing: a later failure queues nothing for it.
    http_receiver.failing = False
    second = _finished_run(db, account_id, job_id, 20)
    assert _outbox(db, second) == []
    # Saving it switches it on again.
    spec = notification_spec(type=6, on_failure=[job_id], creating=False)
    again = await notifications.update(account_id, teams.id, spec)
    assert again.disabled_at is None and again.consecutive_failures == 0
    third = _finished_run(db, account_id, job_id, 20)
    await _deliver_until(deliverer, lambda: len(http_receiver.teams) == 1)
    assert _done(db, third)


async def test_a_test_message_goes_through_the_outbox_and_is_in_the_log(
    db: Db, settings: Settings, pool: AsyncConnectionPool[Connection], box: SecretBox, http_receiver: HttpReceiver
) -> None:
    account_id = AccountId(create_account(db))
    notifications = _notifications(pool, box)
    slack = await notifications.create(
        account_id,
        notification_spec(
            type=2, slack_webhook_url=http_receiver.url("/slack/webhook"), allowed_networks=AddressPolicy(LOCAL)
        ),
    )
    event_id = await notifications.send_test(account_id, slack.id)
    await _deliver_until(_deliverer(pool, box, settings), lambda: len(http_receiver.slack_webhook) == 1)
    assert http_receiver.slack_webhook[0]["text"].startswith("[test] Test notification")
    [delivery] = await notifications.deliveries(account_id, slack.id)
    assert delivery.event_id == event_id and delivery.delivered_at is not None
    [attempt] = delivery.attempt_log
    assert attempt["status_code"] == 200 and attempt["response_body"] == "ok"


def test_a_notification_is_refused_without_what_its_receiver_needs() -> None:
    with pytest.raises(InvalidArgument, match="external_email"):
        notification_spec(type=4, external_email="not an address")
    with pytest.raises(InvalidArgument, match="slack_channel_id"):
        notification_spec(type=2, slack_bot_token="xoxb-1")
    with pytest.raises(InvalidArgument, match="teams_webhook_url"):
        notification_spec(type=6)
    with pytest.raises(InvalidArgument, match="public addresses"):
        notification_spec(type=6, teams_webhook_url="http://127.0.0.1/hook")
    with pytest.raises(InvalidArgument, match="on_success"):
        notification_spec(type=7, on_success=[1])
    with pytest.raises(InvalidArgument, match="type"):
        notification_spec(type=3)


def test_a_source_freshness_warning_makes_a_success_a_warning_and_an_error_wins() -> None:
    freshness = json.dumps(
        {"results": [{"unique_id": "source.jaffle_shop.raw.orders", "status": "warn", "max_loaded_at": "x"}]}
    ).encode()
    built = json.dumps(
        {"results": [_result("model.a.b", "success"), _result("source.jaffle_shop.raw.orders", "error")]}
    )
    nodes = messages.node_results([freshness])
    assert nodes.warned == ["source.jaffle_shop.raw.orders"]
    assert messages.outcome_of(10, nodes) is messages.Outcome.WARNED
    assert messages.outcome_of(10, messages.node_results([b"not json"])) is messages.Outcome.SUCCEEDED
    both = messages.node_results([freshness, built.encode()])
    assert (both.failed, both.warned) == (["source.jaffle_shop.raw.orders"], [])
    assert messages.outcome_of(30, both) is messages.Outcome.CANCELLED
