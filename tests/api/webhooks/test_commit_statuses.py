"""Pull requests' CI runs post their state to the Git provider, through the outbox, at least once.

A local HTTP server speaks GitHub's and GitLab's commit status APIs as documented (path, token
header, JSON body) and answers as they do; the API's delivery task posts to it."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from api.process import RunningApi
from api.rest.server import RestServer
from runplane.basics.settings import Settings
from tests.api.conftest import AsyncDb, Rest, scalar
from tests.support.api import serving_api
from tests.support.polling import eventually

TOKEN = "ghp_test-token-0123456789"
SHA_PASS = "a" * 40
SHA_FAIL = "b" * 40


@dataclass
class Provider:
    """A GitHub (``/repos/{owner}/{repo}/statuses/{sha}``, ``Authorization: Bearer``) and GitLab
    (``/projects/{id}/statuses/{sha}``, ``PRIVATE-TOKEN``) commit status endpoint."""

    port: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    fail_next: int = 0  # answers 502 this many times first, as a provider having a bad moment
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                return 502, {"message": "Bad Gateway"}
        parts = path.removeprefix("/api/v4").strip("/").split("/")
        if parts[:2] == ["repos", "acme"] and len(parts) == 5 and parts[3] == "statuses":
            provider, repository, sha, states = "github", f"{parts[1]}/{parts[2]}", parts[4], GITHUB_STATES
            if headers.get("authorization") != f"Bearer {TOKEN}":
                self.refused.append(path)
                return 401, {"message": "Bad credentials"}
        elif parts[:1] == ["projects"] and len(parts) == 4 and parts[2] == "statuses":
            provider, repository, sha, states = "gitlab", parts[1], parts[3], GITLAB_STATES
            if headers.get("private-token") != TOKEN:
                self.refused.append(path)
                return 401, {"message": "401 Unauthorized"}
        else:
            self.refused.append(path)
            return 404, {"message": "Not Found"}
        status = json.loads(body)
        if status.get("state") not in states or not isinstance(status.get("context"), str):
            self.refused.append(path)
            return 422, {"message": "Validation Failed"}
        with self.lock:
            self.received.append({"provider": provider, "repository": repository, "sha": sha, **status})
        return 201, {"id": len(self.received), **status}

    def states(self, sha: str) -> list[str]:
        with self.lock:
            return [r["state"] for r in self.received if r["sha"] == sha]


GITHUB_STATES = {"pending", "success", "failure", "error"}
GITLAB_STATES = {"pending", "running", "success", "failed", "canceled"}


@pytest.fixture
def provider() -> Iterator[Provider]:
    state = Provider()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            code, answer = state.handle(self.path, headers, body)
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="provider", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
async def api(settings: Settings, _cleanup_bus: None) -> AsyncIterator[RunningApi]:
    """The API with its deliveries, allowed to reach the provider on loopback, retrying quickly."""
    webhooks = settings.webhooks.model_copy(
        update={"allowed_networks": ["127.0.0.0/8"], "poll_interval": 0.05, "backoff_base": 0.05, "backoff_cap": 0.2}
    )
    api_settings = settings.model_copy(
        update={"webhooks": webhooks, "api": settings.api.model_copy(update={"public_url": "https://runplane.test"})}
    )
    async with serving_api(api_settings, rest=True, deliveries=True) as running:
        yield running


async def ci_job(rest: Rest, adb: AsyncDb) -> tuple[int, int]:
    project_id = await scalar(
        adb,
        "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'shop',"
        " 'https://github.com/acme/shop.git') RETURNING id",
        rest.account_id,
    )
    environment_id = await scalar(
        adb,
        "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
        " schema_name) VALUES (%s, %s, 'ci', 'deployment', '1.10', 'postgres', 'analytics') RETURNING id",
        rest.account_id,
        project_id,
    )
    job_id = await rest.create_job(adb, name="pr checks", job_type="ci", environment_id=environment_id)
    return project_id, job_id


async def trigger(rest: Rest, job_id: int, sha: str, number: int, *, provider: str = "github") -> int:
    key = "github_pull_request_id" if provider == "github" else "gitlab_merge_request_id"
    answer = await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={"cause": "pr", "git_sha": sha, key: number})
    assert answer.status_code == 200, answer.text
    return int(answer.json()["data"]["id"])


async def start_and_end(adb: AsyncDb, run_id: int, status: int, message: str = "") -> None:
    """The statuses a runner writes: running, then its outcome."""
    await adb.execute("UPDATE runs SET status = 3, started_at = now() WHERE id = %s", (run_id,))
    await adb.execute(
        "UPDATE runs SET status = %s, status_message = %s, finished_at = now() WHERE id = %s",
        (status, message, run_id),
    )


async def test_a_passing_and_a_failing_ci_run_post_their_states_to_github(
    rest_server: RestServer, rest: Rest, other_rest: Rest, adb: AsyncDb, provider: Provider
) -> None:
    project_id, job_id = await ci_job(rest, adb)
    target = f"/api/v3/accounts/{rest.account_id}/projects/{project_id}/commit-statuses/"
    body = {"provider": "github", "repository": "acme/shop", "api_url": f"http://127.0.0.1:{provider.port}"}
    assert (await rest.http.put(target, json=body)).status_code == 400  # a first save needs the token
    saved = await rest.http.put(target, json={**body, "token": TOKEN})
    assert saved.status_code == 200, saved.text
    assert saved.json()["data"]["token_set"] is True
    assert TOKEN not in saved.text and TOKEN not in (await rest.http.get(target)).text
    assert await scalar(adb, "SELECT token FROM project_commit_statuses WHERE project_id = %s", project_id) != TOKEN
    other_target = f"/api/v3/accounts/{other_rest.account_id}/projects/{project_id}/commit-statuses/"
    assert (await other_rest.http.put(other_target, json={**body, "token": "x"})).status_code == 404

    provider.fail_next = 1  # the first post meets a 502: it is retried, not lost
    passing = await trigger(rest, job_id, SHA_PASS, 7)
    failing = await trigger(rest, job_id, SHA_FAIL, 8)
    await eventually(lambda: [provider.states(SHA_PASS), provider.states(SHA_FAIL)], 30, until=all, what="pending")
    await start_and_end(adb, passing, 10)
    await start_and_end(adb, failing, 20, "Database Error in model orders")
    await eventually(
        lambda: [provider.states(SHA_PASS)[-1:], provider.states(SHA_FAIL)[-1:]],
        30,
        until=lambda last: last == [["success"], ["failure"]],
        what="the outcomes",
    )

    assert provider.refused == []
    for sha, run_id, last in ((SHA_PASS, passing, "success"), (SHA_FAIL, failing, "failure")):
        states = provider.states(sha)
        # Running may be skipped when the outcome came before it was sent; never out of order.
        assert states in (["pending", "pending", last], ["pending", last]), states
        posted = [r for r in provider.received if r["sha"] == sha]
        for status in posted:
            assert status["repository"] == "acme/shop"
            assert status["context"] == "runplane/pr checks"
            assert status["target_url"] == f"https://runplane.test/ui/runs/{run_id}/"
            assert status["description"].startswith(f"Run #{run_id} ")
    assert "Database Error in model orders" in [r for r in provider.received if r["sha"] == SHA_FAIL][-1]["description"]
    logs = []
    for run_id in (passing, failing):
        answer = await rest.http.get(f"/api/v3/accounts/{rest.account_id}/runs/{run_id}/commit-statuses/")
        logs += answer.json()["data"]
    assert all(s["delivered_at"] or s["superseded_at"] for s in logs), logs
    assert [s["attempts"] for s in logs if s["delivered_at"]].count(2) == 1, logs  # the 502 was tried again
    assert TOKEN not in json.dumps(logs)


async def test_a_gitlab_merge_request_run_posts_gitlab_states_and_a_plain_run_posts_none(
    rest_server: RestServer, rest: Rest, adb: AsyncDb, provider: Provider
) -> None:
    project_id, job_id = await ci_job(rest, adb)
    target = f"/api/v3/accounts/{rest.account_id}/projects/{project_id}/commit-statuses/"
    body = {"provider": "gitlab", "repository": "acme/shop", "api_url": f"http://127.0.0.1:{provider.port}/api/v4"}
    assert (await rest.http.put(target, json={**body, "token": TOKEN})).status_code == 200
    run_id = await trigger(rest, job_id, SHA_FAIL, 3, provider="gitlab")
    await eventually(lambda: provider.states(SHA_FAIL) == ["pending"], 30, what="the provider's statuses")
    await start_and_end(adb, run_id, 30, "Cancelled by a person")
    await eventually(lambda: provider.states(SHA_FAIL)[-1:] == ["canceled"], 30, what="the provider's statuses")
    assert provider.refused == []
    assert {r["repository"] for r in provider.received} == {"acme%2Fshop"}
    assert all(r["name"] == r["context"] == "runplane/pr checks" for r in provider.received)

    # A GitHub pull request of the same job does not post to the project's GitLab.
    await trigger(rest, job_id, SHA_PASS, 4, provider="github")
    assert await scalar(adb, "SELECT count(*) FROM commit_status_outbox WHERE sha = %s", SHA_PASS) == 0
