"""dbt Cloud's documented operations and fields that clients call: whether a run can be retried and
what a retry reruns, a rerun retried with its key, a step by its id, a job's latest artifact, the
v2 environment paths, who the calling token is, and the rules every write keeps (the body's
account, a version check when the client sends one)."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import AsyncDb, Rest, scalar
from tests.api.rest.test_dbt_cloud import POSTGRES, _environment, _project, _trigger
from tests.api.rest.test_run_steps import COMMANDS, _dbt_run


async def test_a_run_says_whether_it_can_be_retried_and_what_a_retry_reruns(rest: Rest, adb: AsyncDb) -> None:
    job_id, failed = await _dbt_run(rest, adb, [10, 10, 10, 10, 20])
    run = (await rest.http.get(f"{rest.base}/runs/{failed}/")).json()["data"]
    assert run["can_retry"] is True and run["retry_not_supported_reason"] is None
    details = await rest.http.get(f"{rest.base}/runs/{failed}/retry/")
    assert details.status_code == 200, details.text
    assert details.json()["data"] == {"failed_step": "Invoke `dbt build`", "skipped_steps": ["Invoke `dbt test`"]}

    queued = await _trigger(rest, job_id)
    run = (await rest.http.get(f"{rest.base}/runs/{queued}/")).json()["data"]
    assert run["can_retry"] is False and run["retry_not_supported_reason"] == "RETRY_NOT_FAILED_RUN"
    refused = await rest.http.get(f"{rest.base}/runs/{queued}/retry/")
    assert refused.status_code == 409 and "RETRY_NOT_FAILED_RUN" in refused.json()["status"]["user_message"]


async def test_a_rerun_retried_with_its_idempotency_key_queues_one_run(rest: Rest, adb: AsyncDb) -> None:
    job_id, failed = await _dbt_run(rest, adb, [10, 10, 10, 20])
    key = {"Idempotency-Key": "rerun-after-outage-1"}
    first = await rest.http.post(f"{rest.base}/jobs/{job_id}/rerun/", headers=key)
    assert first.status_code == 200, first.text
    rerun = first.json()["data"]
    assert rerun["retrying_run_id"] == failed and rerun["trigger"]["steps_override"] == COMMANDS
    # The retry comes after the rerun was queued: the job's latest run is no longer the failed one,
    # which without the key would make a new run.
    again = await rest.http.post(f"{rest.base}/jobs/{job_id}/rerun/", headers=key)
    assert again.status_code == 200 and again.json()["data"]["id"] == rerun["id"], again.text
    runs = await rest.http.get(f"{rest.base}/runs/", params={"job_definition_id": job_id})
    assert runs.json()["extra"]["pagination"]["total_count"] == 2
    other_job = await rest.create_job(adb, name="other")
    reused = await rest.http.post(f"{rest.base}/jobs/{other_job}/rerun/", headers=key)
    assert reused.status_code == 409, reused.text


async def test_a_step_is_read_by_the_id_its_run_shows(rest: Rest, adb: AsyncDb) -> None:
    _, run_id = await _dbt_run(rest, adb, [10, 10, 10, 20])
    steps = (await rest.http.get(f"{rest.base}/runs/{run_id}/", params={"include_related": "run_steps"})).json()
    listed = steps["data"]["run_steps"][3]
    got = await rest.http.get(f"{rest.base}/steps/{listed['id']}/", params={"include_related": "debug_logs"})
    assert got.status_code == 200, got.text
    step = got.json()["data"]
    assert (step["id"], step["name"], step["status"]) == (listed["id"], "Invoke `dbt seed`", 20)
    assert step["debug_logs"] == "log of dbt seed\n"
    assert (await rest.http.get(f"{rest.base}/steps/{listed['id'] + 500}/")).status_code == 404


async def test_a_jobs_artifact_is_its_latest_successful_runs(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb)
    path = f"{rest.base}/jobs/{job_id}/artifacts/manifest.json"
    assert (await rest.http.get(path)).status_code == 404  # no successful run yet
    older, newer, failed = [await _trigger(rest, job_id) for _ in range(3)]
    for run_id, status in ((older, 10), (newer, 10), (failed, 20)):
        await adb.execute("UPDATE runs SET status = %s, finished_at = now() WHERE id = %s", (status, run_id))
        await adb.execute(
            "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/manifest.json', 0, %s)",
            (run_id, f'{{"run": {run_id}}}'.encode()),
        )
    got = await rest.http.get(path)
    assert got.status_code == 200 and got.json() == {"run": newer}, got.text


async def test_environments_over_v2_paths(rest: Rest) -> None:
    project = await _project(rest)
    v2 = f"{rest.base}/environments/"
    body = {"project_id": project["id"], "name": "prod", "type": "deployment", "dbt_version": "1.10"}
    created = await rest.http.post(v2, json={**body, "connection": POSTGRES, "credentials": {"schema": "analytics"}})
    assert created.status_code == 200, created.text
    env = created.json()["data"]
    assert env["project_id"] == project["id"]
    listed = await rest.http.get(v2, params={"project_id": project["id"]})
    assert [e["id"] for e in listed.json()["data"]] == [env["id"]]
    renamed = await rest.http.post(f"{v2}{env['id']}/", json={"name": "production"})
    assert renamed.status_code == 200 and renamed.json()["data"]["name"] == "production", renamed.text
    assert (await rest.http.get(f"{v2}{env['id']}/")).json()["data"]["name"] == "production"
    assert (await rest.http.delete(f"{v2}{env['id']}/")).status_code == 200
    assert (await rest.http.get(f"{v2}{env['id']}/")).status_code == 404


async def test_users_answers_for_the_calling_token(rest: Rest) -> None:
    got = await rest.http.get(f"{rest.base}/users/")
    assert got.status_code == 200, got.text
    (user,) = got.json()["data"]
    assert user["id"] is None and user["email"] is None  # a token is not a person
    (permission,) = user["permissions"]
    assert permission["account_id"] == rest.account_id and permission["license_type"] == "developer"
    assert permission["permission_sets"] and set(permission["permission_sets"]) <= {
        "read_only",
        "job_admin",
        "account_admin",
    }


async def test_a_body_naming_another_account_is_refused(rest: Rest, adb: AsyncDb) -> None:
    other = rest.account_id + 1000
    job = {"account_id": other, "name": "x", "execute_steps": ["dbt build"]}
    project = await _project(rest)
    for path, body in (
        (f"{rest.base}/jobs/", job),
        (f"/api/v3/accounts/{rest.account_id}/projects/", {"account_id": other, "name": "x"}),
        (f"/api/v3/accounts/{rest.account_id}/projects/{project['id']}/", {"account_id": other, "name": "x"}),
    ):
        response = await rest.http.post(path, json=body)
        assert response.status_code == 400, (path, response.text)
        assert "account_id" in response.json()["status"]["user_message"], response.text
    same = await rest.http.post(f"{rest.base}/jobs/", json={**job, "account_id": rest.account_id})
    assert same.status_code == 200, same.text


async def test_project_and_environment_updates_honour_if_match(rest: Rest) -> None:
    project = await _project(rest)
    env = await _environment(rest, project["id"])
    v3 = f"/api/v3/accounts/{rest.account_id}"
    for path in (f"{v3}/projects/{project['id']}/", f"{v3}/projects/{project['id']}/environments/{env['id']}/"):
        read = await rest.http.get(path)
        etag = read.headers["ETag"]
        first: dict[str, Any] = {"name": "first writer"}
        saved = await rest.http.post(path, json=first, headers={"If-Match": etag})
        assert saved.status_code == 200, saved.text
        assert saved.headers["ETag"] != etag
        stale = await rest.http.post(path, json={"name": "second writer"}, headers={"If-Match": etag})
        assert stale.status_code == 409, stale.text
        assert (await rest.http.get(path)).json()["data"]["name"] == "first writer"
        # Without If-Match a client that knows no versions still writes, as dbt Cloud's do.
        assert (await rest.http.post(path, json={"name": "blind"})).status_code == 200


async def test_turning_the_schedule_off_keeps_its_cron(rest: Rest, adb: AsyncDb) -> None:
    project = await _project(rest)
    env = await _environment(rest, project["id"])
    body: dict[str, Any] = {
        "name": "nightly",
        "environment_id": env["id"],
        "execute_steps": ["dbt build"],
        "triggers": {"schedule": True},
        "schedule": {"cron": "0 3 * * *"},
    }
    job = (await rest.http.post(f"{rest.base}/jobs/", json=body)).json()["data"]
    path = f"{rest.base}/jobs/{job['id']}/"
    # Off, as clients send it: the same body with the trigger off (and, here, no schedule at all).
    off = await rest.http.post(path, json={**body, "triggers": {"schedule": False}, "schedule": None})
    assert off.status_code == 200, off.text
    shown = off.json()["data"]
    assert shown["triggers"]["schedule"] is False and shown["schedule"]["cron"] == "0 3 * * *"
    assert await scalar(adb, "SELECT cron IS NULL FROM jobs WHERE id = %s", job["id"])  # nothing schedules it
    listed = await rest.http.get(f"{rest.base}/jobs/", params={"triggers_schedule": "false"})
    assert [j["id"] for j in listed.json()["data"]] == [job["id"]]
    # Saved again while off, with the cron it shows: still kept; on again: scheduled by it.
    again = await rest.http.post(path, json={**body, "triggers": {"schedule": False}})
    assert again.json()["data"]["schedule"]["cron"] == "0 3 * * *"
    on = await rest.http.post(path, json=body)
    assert on.json()["data"]["triggers"]["schedule"] is True
    assert await scalar(adb, "SELECT cron FROM jobs WHERE id = %s", job["id"]) == "0 3 * * *"
    bad = await rest.http.post(path, json={**body, "triggers": {"schedule": False}, "schedule": {"cron": "nope"}})
    assert bad.status_code == 400 and "schedule.cron" in bad.json()["status"]["user_message"]
