"""Outgoing webhooks end to end: real runs, a real receiver killed mid-stream and restarted.

Every event of every run reaches the receiver at least once with a valid signature; one that is
sent twice carries the same event id and body; every attempt is in the delivery log.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest

from api.admin import create_account
from runplane.basics.secrets import generate_key
from runplane.basics.settings import Settings
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.processes import Services

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
T = TypeVar("T")
Db = psycopg.Connection[tuple[Any, ...]]


class Receiver:
    def __init__(self, secret: str, log: Path) -> None:
        self.port = free_port()
        self.secret = secret
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.system.webhook_receiver", str(self.port), self.secret, str(self.log)]
        )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def lines(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


@pytest.fixture
def rest(services: Services, settings: Settings) -> Iterator[tuple[httpx.Client, int]]:
    port = free_port()
    # The API first, with its TLS or webhook settings: a dispatcher started first would bring its own.
    services.start(
        "api",
        "api",
        RUNPLANE_API__REST_PORT=str(port),
        RUNPLANE_SECRET_KEYS=generate_key(),
        RUNPLANE_WEBHOOKS__POLL_INTERVAL="0.1",
        RUNPLANE_WEBHOOKS__BACKOFF_BASE="0.3",
        RUNPLANE_WEBHOOKS__BACKOFF_CAP="1.5",
        RUNPLANE_WEBHOOKS__ALLOWED_NETWORKS='["127.0.0.0/8"]',
        # The receiver is down for longer than five quick attempts here: at-least-once across its crash
        # is what this test holds, not switching a failing receiver off (tests/api/webhooks/test_notifications.py).
        RUNPLANE_NOTIFICATIONS__SWITCH_OFF_AFTER="1000",
    )
    services.start("scheduler")
    services.start("dispatcher")
    account_id, token = asyncio.run(create_account(settings, name="acme", run_slots=4, memory_mb=512))
    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Token {token}"}, timeout=30
    ) as http:
        wait_for(lambda: _answers(http), 60, what="the REST API")
        yield http, account_id


def _answers(http: httpx.Client) -> bool:
    try:
        return http.get("/api/v2/accounts/").status_code == 200
    except httpx.TransportError:
        return False


def _job(db: Db, account_id: int, name: str, step: str) -> int:
    row = db.execute(
        "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, %s, 'deploy', %s) RETURNING id",
        (account_id, name, [step]),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_every_event_arrives_signed_across_a_receiver_crash(
    rest: tuple[httpx.Client, int], db: Db, tmp_path: Path
) -> None:
    http, account_id = rest
    base = f"/api/v3/accounts/{account_id}/webhooks"
    ok_job, bad_job = _job(db, account_id, "models", "echo ok"), _job(db, account_id, "broken", "exit 4")
    created = http.post(
        f"{base}/subscriptions",
        json={
            "name": "ops",
            "client_url": "http://127.0.0.1:1/placeholder",
            "event_types": ["job.run.started", "job.run.completed", "job.run.errored"],
        },
    ).json()["data"]
    receiver = Receiver(created["hmac_secret"], tmp_path / "received.jsonl")
    webhook = created["id"]
    body = {
        "name": "ops",
        "client_url": f"http://127.0.0.1:{receiver.port}/hook",
        "event_types": created["event_types"],
    }
    assert http.put(f"{base}/subscription/{webhook}/", json=body).status_code == 200
    receiver.start()
    try:
        runs = [
            http.post(f"/api/v2/accounts/{account_id}/jobs/{job}/run/", json={"cause": "hooks"}).json()["data"]["id"]
            for job in [ok_job] * 6 + [bad_job] * 3
        ]
        wait_for(receiver.lines, 90, until=lambda lines: len(lines) >= 4, what="the first deliveries")
        receiver.kill()  # mid-stream: runs keep changing status while nobody listens
        wait_for(  # a delivery found nobody there (and will be tried again)
            lambda: db.execute("SELECT count(*) FROM webhook_attempts WHERE status_code IS NULL").fetchone(),
            60,
            until=lambda row: row is not None and row[0] > 0,
            what="a delivery attempt to fail while the receiver is down",
        )
        receiver.start()
        wait_for(
            lambda: db.execute("SELECT count(*) FROM runs WHERE status IN (10, 20, 30)").fetchone(),
            120,
            until=lambda row: row is not None and row[0] == len(runs),
            what="every run to finish",
        )
        expected = 2 * len(runs) + 3  # started + completed for each, errored for the three broken ones
        wait_for(
            lambda: db.execute(
                "SELECT count(*) FILTER (WHERE delivered_at IS NULL), count(*) FROM webhook_outbox"
            ).fetchone(),
            120,
            until=lambda row: row == (0, expected),
            what="every event to be delivered",
        )
    finally:
        receiver.kill()
    lines = receiver.lines()
    assert all(line["valid"] for line in lines)
    outbox = {row[0]: row[1] for row in db.execute("SELECT event_id, event_type FROM webhook_outbox")}
    received = {line["event_id"]: line["event_type"] for line in lines}
    assert received == outbox  # none lost, none made up
    bodies: dict[str, set[str]] = collections.defaultdict(set)
    for line in lines:
        bodies[line["event_id"]].add(line["body"])
    assert all(len(b) == 1 for b in bodies.values())  # a duplicate is the same event, byte for byte
    by_type = collections.Counter(received.values())
    assert by_type == {"job.run.started": len(runs), "job.run.completed": len(runs), "job.run.errored": 3}
    errored = next(json.loads(line["body"]) for line in lines if line["event_type"] == "job.run.errored")
    assert errored["accountId"] == account_id and errored["webhooksID"] == webhook and errored["webhookName"] == "ops"
    assert errored["data"]["jobId"] == str(bad_job) and errored["data"]["runStatus"] == "Errored"
    assert errored["data"]["runStatusCode"] == 20 and errored["data"]["runReason"] == "hooks"
    assert {"runStartedAt", "runFinishedAt", "runErroredAt", "runId", "jobName"} <= set(errored["data"])
    log = http.get(f"{base}/subscription/{webhook}/deliveries").json()["data"]
    assert len(log) == expected and all(d["delivered_at"] for d in log)
    attempts = [a for d in log for a in d["attempt_log"]]
    assert any(a["status_code"] is None and a["error"] for a in attempts)  # tried while the receiver was down
    assert all(d["attempt_log"][-1]["status_code"] == 200 for d in log)
    assert all(a["latency_ms"] >= 0 for a in attempts)


def test_subscriptions_are_per_account_and_checked(rest: tuple[httpx.Client, int], db: Db, settings: Settings) -> None:
    http, account_id = rest
    base = f"/api/v3/accounts/{account_id}/webhooks"
    job = _job(db, account_id, "models", "echo ok")
    good = {"name": "n", "client_url": "https://example.com/h", "event_types": ["job.run.completed"], "job_ids": [job]}
    for bad in (
        {**good, "event_types": ["job.run.exploded"]},
        {**good, "client_url": "ftp://example.com"},
        {**good, "job_ids": [job + 100]},
        {**good, "event_types": []},
    ):
        response = http.post(f"{base}/subscriptions/", json=bad)
        assert response.status_code == 400, (bad, response.text)
    assert db.execute("SELECT count(*) FROM webhook_subscriptions").fetchone() == (0,)
    made = http.post(f"{base}/subscriptions/", json=good).json()["data"]
    assert made["job_ids"] == [str(job)] and len(made["hmac_secret"]) == 64
    stored = db.execute("SELECT hmac_secret FROM webhook_subscriptions").fetchone()
    assert stored is not None and made["hmac_secret"] not in stored[0]  # encrypted at rest
    got = http.get(f"{base}/subscription/{made['id']}/").json()["data"]
    assert got["hmac_secret"] is None and got["name"] == "n"
    assert [s["id"] for s in http.get(f"{base}/subscriptions").json()["data"]] == [made["id"]]
    token = http.headers["Authorization"].split()[1]
    cli = subprocess.run(
        [sys.executable, "-m", "client", "--json", "webhook-list", "--account", str(account_id)],
        env={**os.environ, "RUNPLANE_TOKEN": token, "RUNPLANE_REST_URL": str(http.base_url)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert cli.returncode == 0 and [s["id"] for s in json.loads(cli.stdout)] == [made["id"]], cli.stderr
    other_id, other_token = asyncio.run(create_account(settings, name="globex", run_slots=1, memory_mb=512))
    theirs = {"Authorization": f"Bearer {other_token}"}
    foreign = http.get(f"/api/v3/accounts/{other_id}/webhooks/subscription/{made['id']}/", headers=theirs)
    missing = http.get(f"/api/v3/accounts/{other_id}/webhooks/subscription/wsu_missing/", headers=theirs)
    assert foreign.status_code == missing.status_code == 404
    assert http.delete(f"{base}/subscription/{made['id']}/", headers=theirs).status_code == 404
    assert http.delete(f"{base}/subscription/{made['id']}/").status_code == 200
    assert http.get(f"{base}/subscription/{made['id']}/").status_code == 404
