"""Repositories made on their own in a project, as dbt Cloud's v3 API makes them, and a project
attached to one by ``repository_id``: its runs then clone from that repository's URL with its
credential, exactly as from one given inline."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from api.runner.run_spec import decrypter, load_dbt_context
from runplane.basics.secrets import box_from_settings
from runplane.basics.settings import Settings
from tests.api.conftest import AsyncDb, Rest
from tests.api.rest.test_dbt_cloud import _environment, _project

TOKEN = "ghp_not-a-real-token-0123456789"


def _repositories(rest: Rest, project_id: int) -> str:
    return f"/api/v3/accounts/{rest.account_id}/projects/{project_id}/repositories/"


async def _repository(rest: Rest, project_id: int, **body: Any) -> dict[str, Any]:
    answer = await rest.http.post(_repositories(rest, project_id), json=body)
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["data"])


async def test_a_repository_is_created_listed_read_and_deleted_its_credential_never_returned(rest: Rest) -> None:
    project = await _project(rest)
    base = _repositories(rest, project["id"])
    made = await _repository(
        rest,
        project["id"],
        remote_url="https://git.example.com/acme/lake.git",
        git_clone_strategy="deploy_token",
        git_credential=TOKEN,
    )
    assert made["remote_url"] == "https://git.example.com/acme/lake.git"
    assert made["git_clone_strategy"] == "deploy_token" and made["git_credential_set"] is True
    assert made["project_id"] == project["id"]
    listed = await rest.http.get(base)
    assert [r["id"] for r in listed.json()["data"]] == [made["id"]]
    assert listed.json()["extra"]["pagination"] == {"count": 1, "total_count": 1}
    none = await rest.http.get(base, params={"remote_url": "https://git.example.com/acme/other.git"})
    assert none.json()["data"] == []
    got = await rest.http.get(f"{base}{made['id']}/")
    assert got.status_code == 200 and got.json()["data"]["id"] == made["id"]
    for answer in (listed, got):
        assert TOKEN not in answer.text
    deleted = await rest.http.delete(f"{base}{made['id']}/")
    assert deleted.status_code == 200 and deleted.json()["data"]["state"] == 2 and TOKEN not in deleted.text
    assert (await rest.http.get(f"{base}{made['id']}/")).status_code == 404
    assert (await rest.http.get(base)).json()["data"] == []


async def test_a_repository_url_is_refused_for_the_reason_an_inline_one_is(rest: Rest) -> None:
    project = await _project(rest)
    for url in ("--upload-pack=x", "file:///etc", "http://127.0.0.1/a.git"):
        inline = await rest.http.post(
            f"/api/v3/accounts/{rest.account_id}/projects/", json={"name": "x", "repository": {"remote_url": url}}
        )
        alone = await rest.http.post(_repositories(rest, project["id"]), json={"remote_url": url})
        assert inline.status_code == alone.status_code, url
        if inline.status_code == 400:
            reason = inline.json()["status"]["user_message"]
            assert alone.json()["status"]["user_message"] == reason.replace("repository.remote_url", "remote_url")
    refused = await rest.http.post(_repositories(rest, project["id"]), json={"remote_url": "--upload-pack=x"})
    assert refused.status_code == 400 and "remote_url" in refused.json()["status"]["user_message"]


async def test_another_accounts_repositories_are_not_found(rest: Rest, other_rest: Rest) -> None:
    project = await _project(rest)
    made = await _repository(rest, project["id"], remote_url="https://git.example.com/acme/lake.git")
    theirs = f"/api/v3/accounts/{other_rest.account_id}/projects/{project['id']}/repositories/"
    assert (await other_rest.http.get(theirs)).status_code == 404
    assert (await other_rest.http.get(f"{theirs}{made['id']}/")).status_code == 404
    assert (await other_rest.http.delete(f"{theirs}{made['id']}/")).status_code == 404
    made_there = await other_rest.http.post(theirs, json={"remote_url": "https://git.example.com/g/x.git"})
    assert made_there.status_code == 404
    own = await _project(other_rest, "globex")
    attach = await other_rest.http.post(
        f"/api/v3/accounts/{other_rest.account_id}/projects/{own['id']}/", json={"repository_id": made["id"]}
    )
    assert attach.status_code == 400 and "repository_id" in attach.json()["status"]["user_message"]
    assert (await rest.http.get(f"{_repositories(rest, project['id'])}{made['id']}/")).status_code == 200


async def test_a_project_attached_by_repository_id_runs_clone_from_it_as_from_an_inline_one(
    rest: Rest, adb: AsyncDb, settings: Settings, database_url: str
) -> None:
    v3 = f"/api/v3/accounts/{rest.account_id}"
    url = "https://git.example.com/acme/lake.git"
    inline = await _project(
        rest,
        "inline",
        repository={"remote_url": url, "git_clone_strategy": "deploy_token", "git_credential": TOKEN},
    )
    attached = await _project(rest, "attached")
    repository = await _repository(
        rest, attached["id"], remote_url=url, git_clone_strategy="deploy_token", git_credential=TOKEN
    )
    answer = await rest.http.post(f"{v3}/projects/{attached['id']}/", json={"repository_id": repository["id"]})
    assert answer.status_code == 200, answer.text
    project = answer.json()["data"]
    assert project["repository_id"] == repository["id"] and project["repository"]["id"] == repository["id"]
    assert project["repository"]["remote_url"] == url and TOKEN not in answer.text
    assert (await rest.http.get(f"{v3}/projects/{attached['id']}/")).json()["data"]["repository_id"] == repository["id"]
    contexts = []
    for made in (inline, attached):
        environment = await _environment(rest, made["id"])
        job = await rest.create_job(adb, environment_id=environment["id"], steps=["dbt build"])
        run = (await rest.http.post(f"{rest.base}/jobs/{job}/run/", json={})).json()["data"]
        async with await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row) as conn:
            context = await load_dbt_context(conn, run["id"], decrypter(box_from_settings(settings)))
        assert context is not None
        contexts.append(context)
    assert contexts[1].repository_url == url and contexts[1].git_credential == TOKEN
    assert (contexts[1].repository_url, contexts[1].git_credential_kind, contexts[1].git_credential) == (
        contexts[0].repository_url,
        contexts[0].git_credential_kind,
        contexts[0].git_credential,
    )
    both = await rest.http.post(
        f"{v3}/projects/{attached['id']}/", json={"repository_id": repository["id"], "repository": {"remote_url": url}}
    )
    assert both.status_code == 400
    inline_again = await rest.http.post(
        f"{v3}/projects/{attached['id']}/", json={"repository": {"remote_url": "https://git.example.com/acme/x.git"}}
    )
    assert inline_again.json()["data"]["repository_id"] == attached["id"]
