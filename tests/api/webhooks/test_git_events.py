"""Git webhooks in, on GitHub's and GitLab's documented sample payloads with real signatures.

The payloads keep the fields runplane reads, with the values of the providers' samples (GitHub's
``pull_request`` opened/closed examples for Codertocat/Hello-World, GitLab's merge request event
for gitlabhq/gitlab-test).
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from api.admin import create_account
from api.process import RunningApi
from api.webhooks.git_events import is_repository, repository_path
from runplane.basics.secrets import generate_key
from runplane.basics.settings import Settings
from tests.api.conftest import AsyncDb, scalar
from tests.support.api import serving_api

HEAD_SHA = "ec26c3e57ca3a959ca5aad62de7213c562f8c821"
GITHUB_OPENED: dict[str, Any] = {
    "action": "opened",
    "number": 2,
    "pull_request": {
        "number": 2,
        "state": "open",
        "merged": False,
        "merge_commit_sha": None,
        "head": {"ref": "changes", "sha": HEAD_SHA, "repo": {"full_name": "Codertocat/Hello-World"}},
        "base": {"ref": "master", "sha": "f95f852bd8fca8fcc58a9a2d6c842781e32a215e"},
    },
    "repository": {"full_name": "Codertocat/Hello-World", "clone_url": "https://github.com/Codertocat/Hello-World.git"},
    "sender": {"login": "Codertocat"},
}
GITLAB_OPENED: dict[str, Any] = {
    "object_kind": "merge_request",
    "event_type": "merge_request",
    "project": {
        "path_with_namespace": "gitlabhq/gitlab-test",
        "git_http_url": "http://example.com/gitlabhq/gitlab-test.git",
    },
    "object_attributes": {
        "iid": 1,
        "action": "open",
        "state": "opened",
        "source_branch": "ms-viewport",
        "target_branch": "master",
        "merge_commit_sha": None,
        "last_commit": {"id": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7"},
    },
}


@pytest.fixture
async def keyed_api(settings: Settings, _cleanup_bus: None) -> AsyncIterator[RunningApi]:
    keyed = settings.model_copy(update={"secret_keys": SecretStr(generate_key())})
    async with serving_api(keyed, deliveries=False) as running:
        yield running


@pytest.fixture
async def http(keyed_api: RunningApi) -> AsyncIterator[httpx.AsyncClient]:
    assert keyed_api.rest is not None
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{keyed_api.rest.port}") as client:
        yield client


async def _job(adb: AsyncDb, account_id: int, name: str, job_type: str, **flags: bool) -> int:
    columns = ", ".join(["account_id", "name", "job_type", "steps", *flags])
    marks = ", ".join(["%s"] * (4 + len(flags)))
    return int(
        await scalar(
            adb, f"INSERT INTO jobs ({columns}) VALUES ({marks}) RETURNING id", account_id, name, job_type,
            ["dbt build"], *flags.values(),
        )
    )  # fmt: skip


def _github(secret: str, payload: dict[str, Any], *, event: str = "pull_request") -> dict[str, Any]:
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"content": body, "headers": {"X-GitHub-Event": event, "X-Hub-Signature-256": signature}}


async def test_github_pull_requests_start_ci_and_merge_runs(
    http: httpx.AsyncClient, settings: Settings, adb: AsyncDb
) -> None:
    account_id, token = await create_account(settings, name="acme", run_slots=2, memory_mb=512)
    ci = await _job(adb, account_id, "pr", "ci", on_pull_request=True)
    merge = await _job(adb, account_id, "on-merge", "merge", on_merge=True)
    await _job(adb, account_id, "nightly", "deploy")
    hook = (
        await http.post(
            f"/api/v3/accounts/{account_id}/git-webhooks/",
            json={"provider": "github", "repository": "Codertocat/Hello-World"},
            headers={"Authorization": f"Token {token}"},
        )
    ).json()["data"]
    url, secret = hook["url_path"], hook["secret"]

    opened = await http.post(url, **_github(secret, GITHUB_OPENED))
    assert opened.status_code == 200, opened.text
    (run_id,) = opened.json()["data"]["run_ids"]
    cur = await adb.execute(
        "SELECT job_id, trigger, pull_request_number, schema_name, overrides FROM runs WHERE id = %s", (run_id,)
    )
    row = await cur.fetchone()
    assert row is not None
    assert row[:4] == (ci, "ci", 2, f"dbt_cloud_pr_{ci}_2")
    assert row[4]["git_sha"] == HEAD_SHA and row[4]["git_branch"] == "changes"
    # GitHub redelivers: the same run, nothing new
    again = await http.post(url, **_github(secret, GITHUB_OPENED))
    assert again.json()["data"]["run_ids"] == [run_id]

    tampered = _github(secret, GITHUB_OPENED)
    tampered["content"] = tampered["content"].replace(b'"number": 2', b'"number": 3')
    for bad in (tampered, _github("not the secret", GITHUB_OPENED), {"content": b"{}", "headers": {}}):
        response = await http.post(url, **bad)
        assert response.status_code == 401 and response.json()["status"]["is_success"] is False
    assert (await http.post("/webhooks/github/99999/", **_github(secret, GITHUB_OPENED))).status_code == 401
    assert await scalar(adb, "SELECT count(*) FROM runs") == 1

    pushed = copy.deepcopy(GITHUB_OPENED)
    pushed["action"] = "synchronize"
    pushed["pull_request"]["head"]["sha"] = "1234567890abcdef1234567890abcdef12345678"
    assert len((await http.post(url, **_github(secret, pushed))).json()["data"]["run_ids"]) == 1

    closed = copy.deepcopy(GITHUB_OPENED)
    closed["action"] = "closed"
    assert (await http.post(url, **_github(secret, closed))).json()["data"]["run_ids"] == []
    merged = copy.deepcopy(closed)
    merged["pull_request"].update(merged=True, merge_commit_sha="0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c")
    (merge_run,) = (await http.post(url, **_github(secret, merged))).json()["data"]["run_ids"]
    assert await scalar(adb, "SELECT job_id FROM runs WHERE id = %s", merge_run) == merge
    assert await scalar(adb, "SELECT overrides->>'git_sha' FROM runs WHERE id = %s", merge_run) == (
        "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"
    )
    ping = await http.post(url, **_github(secret, {"zen": "Keep it logically awesome."}, event="ping"))
    assert ping.status_code == 200 and ping.json()["data"]["run_ids"] == []
    assert await scalar(adb, "SELECT count(*) FROM runs") == 3


@pytest.mark.parametrize(("provider", "header"), [("github", "X-Hub-Signature-256"), ("gitlab", "X-Gitlab-Token")])
async def test_a_signature_or_token_that_is_not_ascii_is_refused_as_any_wrong_one(
    http: httpx.AsyncClient, settings: Settings, provider: str, header: str
) -> None:
    account_id, token = await create_account(settings, name="acme", run_slots=2, memory_mb=512)
    hook = (
        await http.post(
            f"/api/v3/accounts/{account_id}/git-webhooks/",
            json={"provider": provider, "repository": "Codertocat/Hello-World"},
            headers={"Authorization": f"Token {token}"},
        )
    ).json()["data"]
    headers = {header.encode(): "sha256=\u00e9\u00e9".encode(), b"X-GitHub-Event": b"pull_request"}
    response = await http.post(hook["url_path"], content=json.dumps(GITHUB_OPENED).encode(), headers=headers)
    assert response.status_code == 401, response.text


async def test_gitlab_merge_requests_with_the_secret_token(
    http: httpx.AsyncClient, settings: Settings, adb: AsyncDb
) -> None:
    account_id, token = await create_account(settings, name="acme", run_slots=2, memory_mb=512)
    ci = await _job(adb, account_id, "mr", "ci", on_pull_request=True)
    merge = await _job(adb, account_id, "on-merge", "merge", on_merge=True)
    hook = (
        await http.post(
            f"/api/v3/accounts/{account_id}/git-webhooks/",
            json={"provider": "gitlab", "repository": "gitlabhq/gitlab-test", "job_ids": [ci, merge]},
            headers={"Authorization": f"Token {token}"},
        )
    ).json()["data"]
    body = json.dumps(GITLAB_OPENED).encode()
    headers = {"X-Gitlab-Event": "Merge Request Hook", "X-Gitlab-Token": hook["secret"]}
    wrong = await http.post(hook["url_path"], content=body, headers={**headers, "X-Gitlab-Token": "guess"})
    assert wrong.status_code == 401
    assert await scalar(adb, "SELECT count(*) FROM runs") == 0
    (run_id,) = (await http.post(hook["url_path"], content=body, headers=headers)).json()["data"]["run_ids"]
    assert await scalar(adb, "SELECT job_id FROM runs WHERE id = %s", run_id) == ci
    assert await scalar(adb, "SELECT pull_request_number FROM runs WHERE id = %s", run_id) == 1
    merged = copy.deepcopy(GITLAB_OPENED)
    merged["object_attributes"].update(action="merge", state="merged")
    (merge_run,) = (await http.post(hook["url_path"], content=json.dumps(merged).encode(), headers=headers)).json()[
        "data"
    ]["run_ids"]
    assert await scalar(adb, "SELECT job_id FROM runs WHERE id = %s", merge_run) == merge
    other_repo = copy.deepcopy(GITLAB_OPENED)
    other_repo["project"]["path_with_namespace"] = "someone/else"
    ignored = await http.post(hook["url_path"], content=json.dumps(other_repo).encode(), headers=headers)
    assert ignored.json()["data"]["run_ids"] == []


async def _project_job(adb: AsyncDb, account_id: int, name: str, repository_url: str) -> int:
    project = await scalar(
        adb,
        "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, %s, %s) RETURNING id",
        account_id, name, repository_url,
    )  # fmt: skip
    environment = await scalar(
        adb,
        "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
        " schema_name) VALUES (%s, %s, 'ci', 'deployment', '1.10', 'postgres', 'analytics') RETURNING id",
        account_id, project,
    )  # fmt: skip
    job = await _job(adb, account_id, name, "ci", on_pull_request=True)
    await adb.execute("UPDATE jobs SET environment_id = %s WHERE id = %s", (environment, job))
    return job


async def test_a_pull_request_starts_the_jobs_whose_project_is_its_repository(
    http: httpx.AsyncClient, settings: Settings, adb: AsyncDb
) -> None:
    account_id, token = await create_account(settings, name="acme", run_slots=2, memory_mb=512)
    https = await _project_job(adb, account_id, "hello", "https://github.com/Codertocat/Hello-World.git")
    ssh = await _project_job(adb, account_id, "hello-ssh", "git@github.com:codertocat/hello-world.git")
    await _project_job(adb, account_id, "other", "https://github.com/Codertocat/Other.git")
    await _project_job(adb, account_id, "fork", "https://github.com/someone/Hello-World.git")
    hook = (
        await http.post(
            f"/api/v3/accounts/{account_id}/git-webhooks/",
            json={"provider": "github", "repository": "Codertocat/Hello-World"},
            headers={"Authorization": f"Token {token}"},
        )
    ).json()["data"]
    opened = await http.post(hook["url_path"], **_github(hook["secret"], GITHUB_OPENED))
    run_ids = opened.json()["data"]["run_ids"]
    started = {await scalar(adb, "SELECT job_id FROM runs WHERE id = %s", run_id) for run_id in run_ids}
    assert started == {https, ssh}


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("https://github.com/Owner/Name.git", "owner/name"),
        ("https://github.com/owner/name/", "owner/name"),
        ("git@github.com:Owner/Name.git", "owner/name"),
        ("ssh://git@gitlab.com/group/sub/name.git", "group/sub/name"),
        ("https://oauth2:token@gitlab.example.com/group/name", "group/name"),
    ],
)
def test_repository_paths(url: str, path: str) -> None:
    assert repository_path(url) == path


def test_a_local_repository_is_the_one_its_path_ends_with() -> None:
    assert is_repository("file:///srv/git/Codertocat/Hello-World.git", "Codertocat/Hello-World")
    assert is_repository("/srv/git/codertocat/hello-world", "Codertocat/Hello-World")
    assert not is_repository("/srv/git/someone/Hello-World", "Codertocat/Hello-World")
    assert not is_repository("/srv/git/xCodertocat/Hello-World", "Codertocat/Hello-World")
    assert not is_repository("https://github.com/mirror/Codertocat/Hello-World.git", "Codertocat/Hello-World")
