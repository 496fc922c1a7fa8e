"""The REST API against dbt Cloud's documented admin API: lists and their ``extra``, filters,
projects and environments, job definitions, and the smaller rules of the HTTP door.

Written from dbt Cloud's API reference (v2 jobs and runs, v3 projects and environments): every list
echoes the ``limit`` and ``offset`` it applied, every documented filter is applied or refused with
a 400 naming it, and secret fields are write-only.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from psycopg.types.json import Jsonb

from tests.api.conftest import AsyncDb, Rest, scalar

POSTGRES = {"type": "postgres", "details": {"host": "db.internal", "user": "dbt", "dbname": "shop", "port": "5432"}}


async def _project(rest: Rest, name: str = "shop", **extra: Any) -> dict[str, Any]:
    body = {"name": name, "repository": {"remote_url": "https://git.example.com/acme/shop.git"}, **extra}
    response = await rest.http.post(f"/api/v3/accounts/{rest.account_id}/projects/", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json()["data"])


async def _environment(rest: Rest, project_id: int, name: str = "prod", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "type": "deployment",
        "dbt_version": "1.10",
        "connection": {**POSTGRES, "secrets": {"password": "s3cret-pw"}},
        "credentials": {"schema": "analytics", "threads": 6, "target_name": "prod"},
        **extra,
    }
    path = f"/api/v3/accounts/{rest.account_id}/projects/{project_id}/environments/"
    response = await rest.http.post(path, json=body)
    assert response.status_code == 200, response.text
    return dict(response.json()["data"])


async def _trigger(rest: Rest, job_id: int) -> int:
    return int((await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={})).json()["data"]["id"])


async def test_every_list_echoes_the_limit_and_offset_it_applied(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb)
    await _trigger(rest, job_id)
    project = await _project(rest)
    await _environment(rest, project["id"])
    v2, v3 = rest.base, f"/api/v3/accounts/{rest.account_id}"
    for path in (f"{v2}/jobs/", f"{v2}/runs/", f"{v3}/projects/", f"{v3}/environments/"):
        default = (await rest.http.get(path)).json()["extra"]
        assert default["filters"]["limit"] == 100 and default["filters"]["offset"] == 0, path
        assert default["pagination"] == {"count": 1, "total_count": 1}, path
        paged = (await rest.http.get(path, params={"limit": 5, "offset": 1})).json()
        assert paged["extra"]["filters"]["limit"] == 5 and paged["extra"]["filters"]["offset"] == 1, path
        assert paged["data"] == [] and paged["extra"]["pagination"] == {"count": 0, "total_count": 1}, path


async def test_runs_are_listed_newest_first_unless_ordered(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb)
    ids = [await _trigger(rest, job_id) for _ in range(3)]
    newest_first = (await rest.http.get(f"{rest.base}/runs/")).json()
    assert [r["id"] for r in newest_first["data"]] == ids[::-1]
    assert newest_first["extra"]["order_by"] == "-id"
    oldest_first = (await rest.http.get(f"{rest.base}/runs/", params={"order_by": "id"})).json()
    assert [r["id"] for r in oldest_first["data"]] == ids


async def test_unknown_filters_are_refused_with_a_400_that_names_them(rest: Rest) -> None:
    v3 = f"/api/v3/accounts/{rest.account_id}"
    for path, name in (
        (f"{rest.base}/runs/", "job_id__in"),
        (f"{rest.base}/jobs/", "frobnicate"),
        (f"{v3}/projects/", "environment_id"),
        (f"{v3}/environments/", "job_definition_id"),
    ):
        response = await rest.http.get(path, params={name: "1"})
        assert response.status_code == 400, (path, response.text)
        assert name in response.json()["status"]["user_message"], (path, response.text)


async def test_jobs_and_runs_filter_by_project_environment_and_name(rest: Rest, adb: AsyncDb) -> None:
    shop, web = await _project(rest, "shop"), await _project(rest, "web")
    prod, dev = await _environment(rest, shop["id"], "prod"), await _environment(rest, web["id"], "dev")
    in_prod = await rest.create_job(adb, name="Nightly build", environment_id=prod["id"])
    in_dev = await rest.create_job(adb, name="CI check", environment_id=dev["id"])
    plain = await rest.create_job(adb, name="nightly echo")

    async def job_ids(**params: Any) -> list[int]:
        response = await rest.http.get(f"{rest.base}/jobs/", params=params)
        assert response.status_code == 200, (params, response.text)
        return [j["id"] for j in response.json()["data"]]

    assert await job_ids(project_id=shop["id"]) == [in_prod]
    assert await job_ids(environment_id=dev["id"]) == [in_dev]
    assert await job_ids(project_id__in=f"[{shop['id']},{web['id']}]") == [in_prod, in_dev]
    assert await job_ids(name__icontains="NIGHTLY") == [in_prod, plain]
    filtered = (await rest.http.get(f"{rest.base}/jobs/", params={"project_id": shop["id"]})).json()["extra"]
    assert filtered["filters"]["project_id"] == shop["id"]

    runs = {job: await _trigger(rest, job) for job in (in_prod, in_dev, plain)}

    async def run_ids(**params: Any) -> list[int]:
        response = await rest.http.get(f"{rest.base}/runs/", params={"order_by": "id", **params})
        assert response.status_code == 200, (params, response.text)
        return [r["id"] for r in response.json()["data"]]

    assert await run_ids(project_id=shop["id"]) == [runs[in_prod]]
    assert await run_ids(environment_id=dev["id"]) == [runs[in_dev]]
    assert await run_ids(project_id__in=f"{shop['id']},{web['id']}") == [runs[in_prod], runs[in_dev]]
    deferred = await _trigger(rest, in_prod)
    await adb.execute("UPDATE runs SET deferring_run_id = %s WHERE id = %s", (runs[in_prod], deferred))
    assert await run_ids(deferring_run_id=runs[in_prod]) == [deferred]


async def test_projects_over_v3_with_their_repository(rest: Rest, other_rest: Rest) -> None:
    v3 = f"/api/v3/accounts/{rest.account_id}"
    created = await _project(rest, "Jaffle Shop", dbt_project_subdirectory="transform")
    assert created["name"] == "Jaffle Shop" and created["account_id"] == rest.account_id
    assert created["dbt_project_subdirectory"] == "transform" and created["state"] == 1
    assert created["repository"]["remote_url"] == "https://git.example.com/acme/shop.git"
    await _project(rest, "web")
    got = (await rest.http.get(f"{v3}/projects/{created['id']}/")).json()["data"]
    assert got == created
    named = (await rest.http.get(f"{v3}/projects/", params={"name__icontains": "jaffle"})).json()["data"]
    assert [p["id"] for p in named] == [created["id"]]
    v2 = (await rest.http.get(f"{rest.base}/projects/")).json()["data"]  # dbt Cloud still serves v2 reads
    assert len(v2) == 2
    described = await rest.http.post(f"{v3}/projects/{created['id']}/", json={"description": "the shop"})
    assert described.status_code == 200 and described.json()["data"]["description"] == "the shop"
    updated = await rest.http.post(f"{v3}/projects/{created['id']}/", json={"name": "Jaffle"})
    assert updated.status_code == 200 and updated.json()["data"]["name"] == "Jaffle", updated.text
    assert updated.json()["data"]["repository"]["remote_url"] == "https://git.example.com/acme/shop.git"
    theirs = await other_rest.http.get(f"/api/v3/accounts/{other_rest.account_id}/projects/{created['id']}/")
    assert theirs.status_code == 404
    bad = await rest.http.post(f"{v3}/projects/", json={"name": "x", "repository": {"remote_url": "--upload-pack=x"}})
    assert bad.status_code == 400 and "remote_url" in bad.json()["status"]["user_message"]
    assert (await rest.http.delete(f"{v3}/projects/{created['id']}/")).status_code == 200
    assert (await rest.http.get(f"{v3}/projects/{created['id']}/")).status_code == 404


async def test_environments_with_connection_and_write_only_secrets(rest: Rest, adb: AsyncDb) -> None:
    v3 = f"/api/v3/accounts/{rest.account_id}"
    project = await _project(rest)
    other_project = await _project(rest, "web")
    env = await _environment(rest, project["id"], "Production")
    assert env["project_id"] == project["id"] and env["type"] == "deployment" and env["dbt_version"] == "1.10"
    assert env["deployment_type"] is None and env["description"] == ""
    staging = await _environment(rest, project["id"], "Staging", deployment_type="staging", description="pre-prod")
    assert staging["deployment_type"] == "staging" and staging["description"] == "pre-prod"
    kept = await rest.http.post(f"{v3}/projects/{project['id']}/environments/{staging['id']}/", json={"name": "S"})
    assert kept.json()["data"]["deployment_type"] == "staging" and kept.json()["data"]["description"] == "pre-prod"
    unknown = {"name": "x", "type": "deployment", "deployment_type": "qa"}
    refused = await rest.http.post(f"{v3}/projects/{project['id']}/environments/", json=unknown)
    assert refused.status_code == 400 and "deployment_type" in refused.json()["status"]["user_message"]
    deleted = await rest.http.delete(f"{v3}/projects/{project['id']}/environments/{staging['id']}/")
    assert deleted.status_code == 200
    assert env["connection"]["type"] == "postgres" and env["connection"]["details"]["host"] == "db.internal"
    assert env["connection"]["secrets_set"] == ["password"]
    assert env["credentials"] == {"schema": "analytics", "threads": 6, "target_name": "prod"}
    assert "s3cret-pw" not in str(env)
    stored = await scalar(adb, "SELECT connection_secrets::text FROM environments WHERE id = %s", env["id"])
    assert "s3cret-pw" not in stored  # encrypted at rest
    dev = await _environment(rest, other_project["id"], "Development", type="development")
    scoped = (await rest.http.get(f"{v3}/projects/{project['id']}/environments/")).json()["data"]
    assert [e["id"] for e in scoped] == [env["id"]]
    listed = await rest.http.get(f"{v3}/environments/", params={"project_id__in": f"[{other_project['id']}]"})
    assert [e["id"] for e in listed.json()["data"]] == [dev["id"]]
    named = await rest.http.get(f"{v3}/environments/", params={"name__icontains": "PROD"})
    assert [e["id"] for e in named.json()["data"]] == [env["id"]]
    typed = await rest.http.get(f"{v3}/environments/", params={"type": "development"})
    assert [e["id"] for e in typed.json()["data"]] == [dev["id"]]
    path = f"{v3}/projects/{project['id']}/environments/{env['id']}/"
    assert (await rest.http.get(path)).json()["data"] == env
    changed = await rest.http.post(path, json={"name": "Prod", "dbt_version": "1.9"})
    assert changed.status_code == 200, changed.text
    assert changed.json()["data"]["name"] == "Prod" and changed.json()["data"]["connection"]["secrets_set"] == [
        "password"
    ]  # the secret not sent is kept
    bad = await rest.http.post(path, json={"connection": {**POSTGRES, "details": {"host": "h", "password": "x"}}})
    assert bad.status_code == 400 and "password" in bad.json()["status"]["user_message"]
    wrong_project = await rest.http.get(f"{v3}/projects/{other_project['id']}/environments/{env['id']}/")
    assert wrong_project.status_code == 404
    job_id = await rest.create_job(adb, environment_id=env["id"])
    in_use = await rest.http.delete(path)
    assert in_use.status_code == 409 and str(job_id) in in_use.json()["status"]["user_message"]
    assert (await rest.http.delete(f"{v3}/projects/{other_project['id']}/environments/{dev['id']}/")).status_code == 200


async def test_runs_and_jobs_include_their_environment_project_and_repository(rest: Rest, adb: AsyncDb) -> None:
    project = await _project(rest)
    env = await _environment(rest, project["id"])
    job_id = await rest.create_job(adb, environment_id=env["id"])
    run_id = await _trigger(rest, job_id)
    related = "trigger,job,environment,repository,project"
    run = (await rest.http.get(f"{rest.base}/runs/{run_id}/", params={"include_related": related})).json()["data"]
    assert run["environment"]["id"] == env["id"] and run["environment"]["name"] == "prod"
    assert run["project"]["id"] == project["id"] and run["project"]["name"] == "shop"
    assert run["repository"]["remote_url"] == "https://git.example.com/acme/shop.git"
    assert run["dbt_version"] == "1.10" and run["job"]["dbt_version"] == "1.10"
    job = (await rest.http.get(f"{rest.base}/jobs/{job_id}/")).json()["data"]
    assert job["environment"]["id"] == env["id"] and job["project"]["id"] == project["id"]
    assert job["project"]["repository"]["remote_url"] == "https://git.example.com/acme/shop.git"


async def test_href_points_at_the_runs_page(rest: Rest, adb: AsyncDb) -> None:
    run_id = await _trigger(rest, await rest.create_job(adb))
    run = (await rest.http.get(f"{rest.base}/runs/{run_id}/")).json()["data"]
    assert httpx.URL(run["href"]).path == f"/ui/runs/{run_id}"


async def test_a_method_a_path_does_not_take_is_405_with_allow(rest: Rest, adb: AsyncDb) -> None:
    run_id = await _trigger(rest, await rest.create_job(adb))
    response = await rest.http.put(f"{rest.base}/runs/{run_id}/cancel/")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json()["status"]["code"] == 405


async def test_a_body_that_is_not_json_is_a_clear_400(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb)
    response = await rest.http.post(
        f"{rest.base}/jobs/{job_id}/run/", content=b'{"cause": ', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    message = response.json()["status"]["user_message"]
    assert message.startswith("the request body is not valid JSON"), message
    assert "10:" not in message


async def test_has_docs_generated_when_the_run_generated_docs(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb, steps=["dbt build", "dbt docs generate"])
    with_docs, without = await _trigger(rest, job_id), await _trigger(rest, job_id)
    for run_id in (with_docs, without):
        await adb.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (run_id,))
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/catalog.json', 1, '{}'),"
        " (%s, 'target/index.html', 1, '<html>'), (%s, 'target/sources.json', 0, '{}')",
        (with_docs, with_docs, with_docs),
    )
    listed = (await rest.http.get(f"{rest.base}/runs/", params={"order_by": "id"})).json()["data"]
    assert [(r["has_docs_generated"], r["has_sources_generated"]) for r in listed] == [(True, True), (False, False)]


def _job_body(environment_id: int, project_id: int, **extra: Any) -> dict[str, Any]:
    """A job as dbt Cloud's clients create it (dbt Cloud's v2 job fields)."""
    return {
        "id": None,
        "account_id": None,
        "project_id": project_id,
        "environment_id": environment_id,
        "name": "Daily build",
        "description": "",
        "execute_steps": ["dbt build"],
        "generate_docs": True,
        "run_generate_sources": True,
        "deferring_job_definition_id": None,
        "deferring_environment_id": None,
        "triggers": {"github_webhook": False, "git_provider_webhook": False, "schedule": True, "on_merge": False},
        "settings": {"threads": 8, "target_name": "prod"},
        "schedule": {
            "cron": "0 6 * * *",
            "date": {"type": "custom_cron", "cron": "0 6 * * *"},
            "time": {"type": "every_hour", "interval": 1},
        },
        "execution": {"timeout_seconds": 900},
        "job_type": "scheduled",
        "state": 1,
        **extra,
    }  # fmt: skip


async def test_jobs_created_updated_and_deleted_with_every_setting(rest: Rest, adb: AsyncDb) -> None:
    project = await _project(rest)
    env = await _environment(rest, project["id"])
    response = await rest.http.post(f"{rest.base}/jobs/", json=_job_body(env["id"], project["id"]))
    assert response.status_code == 200, response.text
    job = response.json()["data"]
    assert (job["name"], job["environment_id"], job["project_id"]) == ("Daily build", env["id"], project["id"])
    assert job["generate_docs"] is True and job["run_generate_sources"] is True
    assert job["schedule"]["cron"] == "0 6 * * *" and job["triggers"]["schedule"] is True
    assert job["settings"] == {"threads": 8, "target_name": "prod"} and job["execution"]["timeout_seconds"] == 900
    columns = "cron, threads, generate_docs, run_source_freshness"
    row = await adb.execute(f"SELECT {columns} FROM jobs WHERE id = %s", (job["id"],))
    assert await row.fetchone() == ("0 6 * * *", 8, True, True)

    upstream = job["id"]
    downstream_body = _job_body(
        env["id"],
        project["id"],
        name="After the build",
        deferring_job_definition_id=upstream,
        triggers={"github_webhook": False, "schedule": False},
        job_completion_trigger_condition={
            "condition": {"job_id": upstream, "project_id": project["id"], "statuses": [10, 20]}
        },
    )
    downstream = (await rest.http.post(f"{rest.base}/jobs/", json=downstream_body)).json()["data"]
    assert downstream["deferring_job_definition_id"] == upstream and downstream["triggers"]["schedule"] is False
    assert downstream["schedule"]["cron"] == "0 6 * * *"  # the body's cron is kept while its trigger is off
    assert downstream["job_completion_trigger_condition"] == {
        "condition": {"job_id": upstream, "project_id": project["id"], "statuses": [10, 20]}
    }
    statuses = await scalar(adb, "SELECT statuses FROM job_completion_triggers WHERE job_id = %s", downstream["id"])
    assert sorted(statuses) == [10, 20]

    update = {**_job_body(env["id"], project["id"]), "name": "Hourly build", "generate_docs": False}
    update["schedule"] = {"cron": "0 * * * *", "date": {"type": "custom_cron", "cron": "0 * * * *"}}
    updated = await rest.http.post(f"{rest.base}/jobs/{upstream}/", json=update)
    assert updated.status_code == 200, updated.text
    assert updated.json()["data"]["name"] == "Hourly build" and updated.json()["data"]["generate_docs"] is False
    assert await scalar(adb, "SELECT cron FROM jobs WHERE id = %s", upstream) == "0 * * * *"

    for bad, field in (
        ({"settings": {"threads": 1000, "target_name": "x"}}, "threads"),
        ({"schedule": {"cron": "61 * * * *"}}, "cron"),
        ({"environment_id": 10**9}, "environment_id"),
        ({"deferring_job_definition_id": 10**9}, "defer"),
        ({"job_type": "nightly"}, "job_type"),
        ({"execute_steps": []}, "steps"),
    ):
        response = await rest.http.post(f"{rest.base}/jobs/", json={**_job_body(env["id"], project["id"]), **bad})
        assert response.status_code == 400, (bad, response.text)
        assert field in response.json()["status"]["user_message"], (bad, response.text)
    assert await scalar(adb, "SELECT count(*) FROM jobs") == 2

    deleted = await rest.http.delete(f"{rest.base}/jobs/{downstream['id']}/")
    assert deleted.status_code == 200 and deleted.json()["data"]["state"] == 2
    assert (await rest.http.get(f"{rest.base}/jobs/{downstream['id']}/")).status_code == 404


async def test_webhook_payloads_carry_every_documented_field(rest: Rest, adb: AsyncDb) -> None:
    project = await _project(rest, "Snowflake Github Demo")
    env = await _environment(rest, project["id"], "Production")
    job_id = await rest.create_job(adb, name="Daily Job (dbt build)", environment_id=env["id"])
    plain_id = await rest.create_job(adb, name="plain")
    await adb.execute(
        "INSERT INTO webhook_subscriptions (id, account_id, name, client_url, event_types, hmac_secret)"
        " VALUES ('wsu_12345abcde', %s, 'test', 'https://hooks.example.com/', %s, 'x')",
        (rest.account_id, ["job.run.started", "job.run.completed"]),
    )
    run_id, plain_run = await _trigger(rest, job_id), await _trigger(rest, plain_id)
    for run in (run_id, plain_run):
        await adb.execute("UPDATE runs SET status = 3, started_at = now() WHERE id = %s", (run,))
    payload = await scalar(adb, "SELECT payload FROM webhook_outbox WHERE run_id = %s", run_id)
    assert payload["webhookId"] == "wsu_12345abcde" and payload["webhooksID"] == "wsu_12345abcde"
    assert payload["accountId"] == rest.account_id and payload["eventType"] == "job.run.started"
    data = payload["data"]
    assert (data["jobId"], data["runId"], data["jobName"]) == (str(job_id), str(run_id), "Daily Job (dbt build)")
    assert (data["environmentId"], data["environmentName"]) == (str(env["id"]), "Production")
    assert (data["projectId"], data["projectName"]) == (str(project["id"]), "Snowflake Github Demo")
    assert data["dbtVersion"] == "1.10" and data["runStatus"] == "Running" and data["runStatusCode"] == 3
    assert data["runStatusMessage"] == "None"  # as dbt Cloud sends it while a run has no message
    await adb.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (run_id,))
    done = await scalar(
        adb, "SELECT payload FROM webhook_outbox WHERE run_id = %s AND event_type = %s", run_id, "job.run.completed"
    )
    assert done["data"]["runStatus"] == "Success" and done["data"]["runStatusMessage"] == "None"
    plain = (await scalar(adb, "SELECT payload FROM webhook_outbox WHERE run_id = %s", plain_run))["data"]
    assert "environmentId" not in plain and "projectId" not in plain  # a job without an environment has none


async def test_project_and_environment_lists_take_the_filters_dbt_cloud_clients_send(rest: Rest) -> None:
    v3 = f"/api/v3/accounts/{rest.account_id}"
    shop, web = await _project(rest, "shop"), await _project(rest, "web")
    prod = await _environment(rest, shop["id"], "prod")
    old = await _environment(rest, web["id"], "old", dbt_version="1.8")

    async def ids(path: str, **params: Any) -> list[int]:
        response = await rest.http.get(f"{v3}/{path}", params=params)
        assert response.status_code == 200, (params, response.text)
        return [item["id"] for item in response.json()["data"]]

    assert await ids("projects/", pk__in=f"[{web['id']}]") == [web["id"]]
    assert await ids("projects/", name="shop") == [shop["id"]]
    assert await ids("projects/", order_by="-name") == [web["id"], shop["id"]]
    assert await ids("environments/", dbt_version__in='["1.8"]') == [old["id"]]
    assert await ids(f"projects/{shop['id']}/environments/", name="prod") == [prod["id"]]
    assert await ids(f"projects/{shop['id']}/environments/", deployment_type__in='["production"]') == []
    assert await ids(f"projects/{shop['id']}/environments/", credentials_id=1) == []
    refused = await rest.http.get(f"{v3}/environments/", params={"deployment_type": "qa"})
    assert refused.status_code == 400 and "deployment_type" in refused.json()["status"]["user_message"]


async def test_include_related_takes_every_name_dbt_cloud_documents(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb)
    first, deferring = await _trigger(rest, job_id), await _trigger(rest, job_id)
    await adb.execute("UPDATE runs SET status = 20, finished_at = now() WHERE id = %s", (first,))
    await adb.execute("UPDATE runs SET deferring_run_id = %s WHERE id = %s", (first, deferring))
    retry = (await rest.http.post(f"{rest.base}/runs/{first}/retry/")).json()["data"]["id"]
    related = "run_retries,deferring_run,used_repo_cache,audit"
    run = (await rest.http.get(f"{rest.base}/runs/{first}/", params={"include_related": related})).json()["data"]
    assert [r["id"] for r in run["run_retries"]] == [retry] and run["deferring_run"] is None
    assert run["used_repo_cache"] is None and run["audit"] is None  # not recorded: unknown, never made up
    other = (await rest.http.get(f"{rest.base}/runs/{deferring}/", params={"include_related": related})).json()
    assert other["data"]["deferring_run"]["id"] == first and other["data"]["run_retries"] == []


async def test_a_job_read_and_written_back_keeps_what_rest_cannot_say(rest: Rest, adb: AsyncDb) -> None:
    project = await _project(rest)
    env = await _environment(rest, project["id"])
    first, second = await rest.create_job(adb, name="first"), await rest.create_job(adb, name="second")
    job_id = await rest.create_job(
        adb,
        name="dbt",
        steps=["dbt build"],
        environment_id=env["id"],
        cron="0 6 * * *",
        timezone="Europe/Amsterdam",
        retry_max_attempts=2,
        priority=5,
        missed_run_grace_seconds=60,
        git_branch="release",
        environment=Jsonb({"FOO": "bar"}),
        completion_mode="all",
    )
    await adb.execute(
        "INSERT INTO job_completion_triggers (job_id, upstream_job_id, statuses) VALUES (%s, %s, '{10}'),"
        " (%s, %s, '{10,20}')",
        (job_id, first, job_id, second),
    )
    columns = "cron, timezone, retry_max_attempts, priority, missed_run_grace_seconds, git_branch, environment"
    stored = await (await adb.execute(f"SELECT {columns} FROM jobs WHERE id = %s", (job_id,))).fetchone()
    job = (await rest.http.get(f"{rest.base}/jobs/{job_id}/")).json()["data"]
    assert job["dbt_version"] == "1.10" and job["job_completion_trigger_condition"]["condition"]["job_id"] == first
    written = await rest.http.post(f"{rest.base}/jobs/{job_id}/", json={**job, "name": "dbt nightly"})
    assert written.status_code == 200, written.text
    assert await (await adb.execute(f"SELECT {columns} FROM jobs WHERE id = %s", (job_id,))).fetchone() == stored
    triggers = await adb.execute(
        "SELECT upstream_job_id, statuses FROM job_completion_triggers WHERE job_id = %s ORDER BY 1", (job_id,)
    )
    assert await triggers.fetchall() == [(first, [10]), (second, [10, 20])]
    assert await scalar(adb, "SELECT completion_mode FROM jobs WHERE id = %s", job_id) == "all"
    changed = {**job, "schedule": {"cron": "0 7 * * *"}, "job_completion_trigger_condition": None, "runplane": None}
    assert (await rest.http.post(f"{rest.base}/jobs/{job_id}/", json=changed)).status_code == 200
    assert await scalar(adb, "SELECT timezone FROM jobs WHERE id = %s", job_id) == "UTC"  # a new cron: dbt Cloud's UTC
    assert await scalar(adb, "SELECT count(*) FROM job_completion_triggers WHERE job_id = %s", job_id) == 0
    wrong = await rest.http.post(f"{rest.base}/jobs/{job_id}/", json={**job, "dbt_version": "1.7"})
    assert wrong.status_code == 400 and "dbt_version" in wrong.json()["status"]["user_message"]


async def test_the_openapi_document_names_the_refusal_of_a_read_only_token(rest: Rest) -> None:
    document = (await rest.http.get("/openapi.json")).json()
    for path, method in (
        ("/api/v2/accounts/{account_id}/jobs/", "post"),
        ("/api/v3/accounts/{account_id}/projects/", "post"),
        ("/api/v2/accounts/{account_id}/jobs/{job_id}/run/", "post"),
    ):
        assert "403" in document["paths"][path][method]["responses"], (path, method)


async def test_runplanes_own_job_settings_over_rest(rest: Rest, adb: AsyncDb) -> None:
    project = await _project(rest)
    env = await _environment(rest, project["id"])
    upstream = await rest.create_job(adb, name="upstream", environment_id=env["id"])
    own = {
        "timezone": "Europe/Amsterdam",
        "retry_max_attempts": 2,
        "retry_on_step_failure": True,
        "missed_run_grace_seconds": 0,
        "priority": 7,
        "git_branch": "release",
        "schema": "nightly",
        "run_only_modified": True,
        "completion_mode": "all",
        "environment_variables": {"FOO": "bar", "DBT_ENV_SECRET_TOKEN": "s3cret"},
    }
    body = _job_body(env["id"], project["id"], deferring_job_definition_id=upstream, runplane=own)
    response = await rest.http.post(f"{rest.base}/jobs/", json=body)
    assert response.status_code == 200, response.text
    shown = response.json()["data"]["runplane"]
    assert shown == {
        **{k: v for k, v in own.items() if k != "environment_variables"},
        "environment_variables": {"FOO": "bar"},
        "secret_names": ["DBT_ENV_SECRET_TOKEN"],
        "job_completion_trigger_conditions": [],
        "version": 1,
        "overlap_policy": "serial",
        "jitter_seconds": 0,
        "catchup_window_seconds": 0,
        "catchup_all": False,
        "paused_by": "",
        "pause_note": "",
        "deactivation_reason": "",
    }
    assert "s3cret" not in response.text
    job_id = response.json()["data"]["id"]
    assert await scalar(adb, "SELECT timezone FROM jobs WHERE id = %s", job_id) == "Europe/Amsterdam"
    bad = await rest.http.post(f"{rest.base}/jobs/", json={**body, "runplane": {"timezone": "Mars/Olympus"}})
    assert bad.status_code == 400 and "runplane.timezone" in bad.json()["status"]["user_message"]
    priority_only = await rest.http.post(f"{rest.base}/jobs/{job_id}/", json={**body, "runplane": {"priority": 1}})
    assert priority_only.json()["data"]["runplane"]["priority"] == 1
    assert priority_only.json()["data"]["runplane"]["secret_names"] == ["DBT_ENV_SECRET_TOKEN"]  # kept
    assert priority_only.json()["data"]["runplane"]["retry_max_attempts"] == 2  # kept


async def test_a_trigger_retried_with_its_idempotency_key_makes_one_run(
    rest: Rest, other_rest: Rest, adb: AsyncDb
) -> None:
    job_id = await rest.create_job(adb)
    key = {"Idempotency-Key": "nightly-2026-11-26"}
    body = {"cause": "Nightly from Airflow", "git_branch": "release", "steps_override": ["dbt build"]}
    first = await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json=body, headers=key)
    assert first.status_code == 200, first.text
    run_id = first.json()["data"]["id"]
    again = await asyncio.gather(
        *(rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json=body, headers=key) for _ in range(4))
    )
    assert [(r.status_code, r.json()["data"]["id"]) for r in again] == [(200, run_id)] * 4
    assert again[0].json()["data"]["trigger"]["cause"] == "Nightly from Airflow"
    assert await scalar(adb, "SELECT count(*) FROM runs WHERE account_id = %s", rest.account_id) == 1

    # The same key with another body, or for another job, is refused and queues nothing.
    other_job = await rest.create_job(adb, name="hourly")
    for path, changed in (
        (f"{rest.base}/jobs/{job_id}/run/", {**body, "git_branch": "main"}),
        (f"{rest.base}/jobs/{job_id}/run/", {**body, "cause": "Manual rerun"}),
        (f"{rest.base}/jobs/{job_id}/run/", None),
        (f"{rest.base}/jobs/{other_job}/run/", body),
    ):
        refused = await rest.http.post(path, json=changed, headers=key)
        assert refused.status_code == 409, refused.text
        assert "idempotency" in refused.json()["status"]["user_message"], refused.text
    assert await scalar(adb, "SELECT count(*) FROM runs WHERE account_id = %s", rest.account_id) == 1

    # Another account's key is its own; a trigger without a key always queues.
    their_job = await other_rest.create_job(adb)
    theirs = await other_rest.http.post(f"{other_rest.base}/jobs/{their_job}/run/", json=body, headers=key)
    assert theirs.status_code == 200 and theirs.json()["data"]["id"] != run_id
    unkeyed = await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json=body)
    assert unkeyed.status_code == 200 and unkeyed.json()["data"]["id"] != run_id
    assert await scalar(adb, "SELECT count(*) FROM runs WHERE account_id = %s", rest.account_id) == 2


async def test_a_job_create_retried_with_its_idempotency_key_makes_one_job(
    rest: Rest, other_rest: Rest, adb: AsyncDb
) -> None:
    project = await _project(rest)
    env = await _environment(rest, project["id"])
    body = _job_body(env["id"], project["id"])
    key = {"Idempotency-Key": "create-daily-build"}
    first = await rest.http.post(f"{rest.base}/jobs/", json=body, headers=key)
    assert first.status_code == 200, first.text
    job_id = first.json()["data"]["id"]
    again = await asyncio.gather(*(rest.http.post(f"{rest.base}/jobs/", json=body, headers=key) for _ in range(4)))
    assert [(r.status_code, r.json()["data"]["id"]) for r in again] == [(200, job_id)] * 4
    assert await scalar(adb, "SELECT count(*) FROM jobs WHERE account_id = %s", rest.account_id) == 1

    refused = await rest.http.post(f"{rest.base}/jobs/", json={**body, "name": "Another build"}, headers=key)
    assert refused.status_code == 409, refused.text
    assert "idempotency key" in refused.text and str(job_id) in refused.text
    assert await scalar(adb, "SELECT count(*) FROM jobs WHERE account_id = %s", rest.account_id) == 1

    # Another account's key is its own; a create without a key always creates.
    their_project = await _project(other_rest)
    their_env = await _environment(other_rest, their_project["id"])
    theirs = await other_rest.http.post(
        f"{other_rest.base}/jobs/", json=_job_body(their_env["id"], their_project["id"]), headers=key
    )
    assert theirs.status_code == 200 and theirs.json()["data"]["id"] != job_id
    unkeyed = await rest.http.post(f"{rest.base}/jobs/", json=body)
    assert unkeyed.status_code == 200 and unkeyed.json()["data"]["id"] != job_id
