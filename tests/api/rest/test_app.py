"""The REST API (dbt Cloud v2) in-process: envelope, auth, triggers with overrides, lists, cancel, artifacts."""

from __future__ import annotations

import httpx

from api.admin import create_token
from api.rest.server import RestServer
from runplane.basics.settings import Settings
from tests.api.conftest import AsyncDb, Rest, scalar


async def test_token_and_bearer_both_work_and_anything_else_is_401(rest: Rest) -> None:
    for scheme in ("Token", "Bearer"):
        response = await rest.http.get("/api/v2/accounts/", headers={"Authorization": f"{scheme} {rest.token}"})
        assert response.status_code == 200
        assert [a["id"] for a in response.json()["data"]] == [rest.account_id]
    for header in ({}, {"Authorization": "Token nope"}, {"Authorization": f"Basic {rest.token}"}):
        async with httpx.AsyncClient(base_url=str(rest.http.base_url), headers=header) as anonymous:
            response = await anonymous.get(f"{rest.base}/runs/")
        assert response.status_code == 401
        body = response.json()
        assert body["status"]["is_success"] is False and body["status"]["code"] == 401 and body["data"] is None


async def test_a_read_only_token_reads_but_cannot_trigger(rest: Rest, adb: AsyncDb, settings: Settings) -> None:
    job_id = await rest.create_job(adb)
    token = await create_token(settings, account_id=rest.account_id, scopes=("read_only",))
    headers = {"Authorization": f"Token {token}"}
    assert (await rest.http.get(f"{rest.base}/jobs/{job_id}/", headers=headers)).status_code == 200
    response = await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={"cause": "read only"}, headers=headers)
    assert response.status_code == 403
    assert await scalar(adb, "SELECT count(*) FROM runs") == 0


async def test_trigger_with_every_override_is_recorded_and_echoed(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb, steps=["echo a"])
    body = {
        "cause": "Triggered by Airflow",
        "git_sha": "0123abcd",
        "git_branch": "feature/x",
        "github_pull_request_id": 42,
        "schema_override": "dbt_pr_42",
        "dbt_version_override": "1.8.0",
        "threads_override": 8,
        "target_name_override": "ci",
        "generate_docs_override": True,
        "timeout_seconds_override": 600,
        "steps_override": ["dbt build -s state:modified+"],
    }
    response = await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json=body)
    assert response.status_code == 200, response.text
    envelope = response.json()
    assert envelope["status"] == {"code": 200, "is_success": True, "user_message": "Success!", "developer_message": ""}
    run = envelope["data"]
    assert run["status"] == 1 and run["status_humanized"] == "Queued" and run["job_definition_id"] == job_id
    assert run["in_progress"] is True and run["is_complete"] is False
    assert run["href"].endswith(f"/ui/runs/{run['id']}")  # the run's page
    trigger = run["trigger"]
    assert trigger["cause"] == "Triggered by Airflow"
    assert {k: trigger[k] for k in body if k != "cause"} == {k: v for k, v in body.items() if k != "cause"}
    overrides = await scalar(adb, "SELECT overrides FROM runs WHERE id = %s", run["id"])
    assert overrides["steps"] == ["dbt build -s state:modified+"] and overrides["threads"] == 8
    assert overrides["target_name"] == "ci" and overrides["schema"] == "dbt_pr_42"
    assert await scalar(adb, "SELECT pull_request_number FROM runs WHERE id = %s", run["id"]) == 42


async def test_a_rejected_trigger_is_400_and_writes_nothing(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb)
    for body in (
        {"threads_override": 1000},
        {"schema_override": "drop table x;"},
        {"git_branch": "--upload-pack=evil"},
        {"steps_override": ["a\x00b"]},
        {"github_pull_request_id": 1, "gitlab_merge_request_id": 2},
        {"cause": 7},
        [1, 2],
    ):
        response = await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json=body)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["status"]["is_success"] is False
    assert await scalar(adb, "SELECT count(*) FROM runs") == 0


async def test_another_accounts_ids_are_404_exactly_like_missing_ones(
    rest: Rest, other_rest: Rest, adb: AsyncDb
) -> None:
    job_id = await rest.create_job(adb)
    run_id = (await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={})).json()["data"]["id"]
    missing_job, missing_run = job_id + 1000, run_id + 1000
    pairs = [
        (("get", f"{other_rest.base}/jobs/{job_id}/"), ("get", f"{other_rest.base}/jobs/{missing_job}/")),
        (("post", f"{other_rest.base}/jobs/{job_id}/run/"), ("post", f"{other_rest.base}/jobs/{missing_job}/run/")),
        (("get", f"{other_rest.base}/runs/{run_id}/"), ("get", f"{other_rest.base}/runs/{missing_run}/")),
        (
            ("post", f"{other_rest.base}/runs/{run_id}/cancel/"),
            ("post", f"{other_rest.base}/runs/{missing_run}/cancel/"),
        ),
        (("get", f"{rest.base}/runs/"), ("get", "/api/v2/accounts/999999/runs/")),
    ]
    for (method, path), (missing_method, missing_path) in pairs:
        client = other_rest.http
        foreign = await client.request(method, path)
        missing = await client.request(missing_method, missing_path)
        assert foreign.status_code == missing.status_code == 404, (path, foreign.text)

        def strip(text: str, *ids: int) -> str:
            for i in ids:
                text = text.replace(str(i), "N")
            return text

        assert strip(foreign.text, job_id, run_id, rest.account_id) == strip(
            missing.text, missing_job, missing_run, 999999
        )
    assert await scalar(adb, "SELECT count(*) FROM runs") == 1
    assert await scalar(adb, "SELECT status FROM runs") == 1


async def test_get_run_includes_what_include_related_asks_for(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb, steps=["echo one", "echo two"])
    run_id = (await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={"cause": "c"})).json()["data"]["id"]
    await adb.execute(
        "INSERT INTO run_steps (run_id, step_index, command, status, started_at, finished_at) VALUES "
        "(%s, 0, 'echo one', 10, now(), now()), (%s, 1, 'echo two', 3, now(), NULL)",
        (run_id, run_id),
    )
    await adb.execute(
        "INSERT INTO run_log_chunks (run_id, seq, step_index, text) VALUES (%s, 1, 0, 'one\n'), (%s, 2, 1, 'tw'),"
        " (%s, 3, 1, 'o\n')",
        (run_id, run_id, run_id),
    )
    bare = (await rest.http.get(f"{rest.base}/runs/{run_id}/")).json()["data"]
    assert bare["trigger"] is None and bare["job"] is None and bare["run_steps"] == []
    full = (
        await rest.http.get(
            f"{rest.base}/runs/{run_id}", params={"include_related": "trigger,job,run_steps,debug_logs"}
        )
    ).json()["data"]
    assert (
        full["trigger"]["cause"] == "c"
        and full["job"]["id"] == job_id
        and full["job"]["execute_steps"][1] == "echo two"
    )
    assert [(s["index"], s["status"], s["logs"]) for s in full["run_steps"]] == [(1, 10, "one\n"), (2, 3, "two\n")]
    assert full["run_steps"][1]["debug_logs"] == "two\n"
    # repeated parameters, as Airflow and dbt-cloud-cli send a list
    repeated = await rest.http.get(f"{rest.base}/runs/{run_id}/", params=[("include_related", "run_steps")])
    steps = repeated.json()["data"]["run_steps"]
    assert len(steps) == 2 and steps[0]["debug_logs"] is None


async def test_list_runs_filters_orders_and_pages(rest: Rest, adb: AsyncDb) -> None:
    first, second = await rest.create_job(adb, name="a"), await rest.create_job(adb, name="b")
    ids = [
        (await rest.http.post(f"{rest.base}/jobs/{job}/run/", json={})).json()["data"]["id"]
        for job in (first, second, first, first)
    ]
    await adb.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (ids[0],))
    page = (await rest.http.get(f"{rest.base}/runs/", params={"limit": 2, "offset": 1, "order_by": "-id"})).json()
    assert [r["id"] for r in page["data"]] == [ids[2], ids[1]]
    assert page["extra"]["pagination"] == {"count": 2, "total_count": 4}
    by_job = (await rest.http.get(f"{rest.base}/runs/", params={"job_definition_id": first})).json()
    assert [r["id"] for r in by_job["data"]] == [ids[3], ids[2], ids[0]]  # newest first
    done = (await rest.http.get(f"{rest.base}/runs/", params={"status__in": "[10,20]"})).json()
    assert [r["id"] for r in done["data"]] == [ids[0]]
    queued = (await rest.http.get(f"{rest.base}/runs/", params={"status": 1, "job_definition_id": first})).json()
    assert [r["id"] for r in queued["data"]] == [ids[3], ids[2]]
    for bad in ({"order_by": "password"}, {"status": 4}, {"limit": 101}, {"offset": -1}, {"status__in": "[x]"}):
        response = await rest.http.get(f"{rest.base}/runs/", params=bad)
        assert response.status_code == 400, bad


async def test_cancel_a_queued_run_then_again_is_a_conflict(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb)
    run_id = (await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={})).json()["data"]["id"]
    response = await rest.http.post(f"{rest.base}/runs/{run_id}/cancel/")
    assert response.status_code == 200
    assert response.json()["data"]["status"] == 30 and response.json()["data"]["is_cancelled"] is True
    again = await rest.http.post(f"{rest.base}/runs/{run_id}/cancel")
    assert again.status_code == 409 and "already finished" in again.json()["status"]["user_message"]


async def test_artifacts_listed_and_read_by_step(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb, steps=["a", "b"])
    run_id = (await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={})).json()["data"]["id"]
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/manifest.json', 1, %s),"
        " (%s, 'target/compiled/model.sql', 0, %s)",
        (run_id, b'{"nodes": {}}', run_id, b"select 1"),
    )
    listed = (await rest.http.get(f"{rest.base}/runs/{run_id}/artifacts/")).json()["data"]
    assert sorted(listed) == ["compiled/model.sql", "manifest.json"]
    assert (await rest.http.get(f"{rest.base}/runs/{run_id}/artifacts", params={"step": 2})).json()["data"] == [
        "manifest.json"
    ]
    manifest = await rest.http.get(f"{rest.base}/runs/{run_id}/artifacts/manifest.json")
    assert manifest.status_code == 200 and manifest.json() == {"nodes": {}}
    assert manifest.headers["content-type"].startswith("application/json")
    nested = await rest.http.get(f"{rest.base}/runs/{run_id}/artifacts/compiled/model.sql", params={"step": 1})
    assert nested.text == "select 1"
    wrong_step = await rest.http.get(f"{rest.base}/runs/{run_id}/artifacts/manifest.json", params={"step": 1})
    assert wrong_step.status_code == 404


async def test_a_file_every_step_wrote_is_listed_once_and_read_per_step(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb, steps=["dbt build", "dbt docs generate"])
    run_id = (await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={})).json()["data"]["id"]
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/run_results.json', 0, %s),"
        " (%s, 'target/run_results.json', 1, %s)",
        (run_id, b'{"step": 1}', run_id, b'{"step": 2}'),
    )
    assert (await rest.http.get(f"{rest.base}/runs/{run_id}/artifacts/")).json()["data"] == ["run_results.json"]
    path = f"{rest.base}/runs/{run_id}/artifacts/run_results.json"
    assert (await rest.http.get(path)).json() == {"step": 2}  # without a step: the last one's
    assert (await rest.http.get(path, params={"step": 1})).json() == {"step": 1}


async def test_a_job_and_its_runs_name_their_environment_and_project(rest: Rest, adb: AsyncDb) -> None:
    project_id = await scalar(
        adb,
        "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'shop', 'file:///srv/shop') RETURNING id",
        rest.account_id,
    )
    environment_id = await scalar(
        adb,
        "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
        " schema_name) VALUES (%s, %s, 'prod', 'deployment', '1.10', 'postgres', 'analytics') RETURNING id",
        rest.account_id,
        project_id,
    )
    job_id = await rest.create_job(adb, environment_id=environment_id)
    plain_id = await rest.create_job(adb, name="plain")
    job = (await rest.http.get(f"{rest.base}/jobs/{job_id}/")).json()["data"]
    assert (job["environment_id"], job["project_id"], job["dbt_version"]) == (environment_id, project_id, "1.10")
    plain = (await rest.http.get(f"{rest.base}/jobs/{plain_id}/")).json()["data"]
    assert (plain["environment_id"], plain["project_id"]) == (None, None)
    triggered = (await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={})).json()["data"]
    assert (triggered["environment_id"], triggered["project_id"], triggered["dbt_version"]) == (
        environment_id,
        project_id,
        "1.10",
    )  # the trigger's own answer names them, as a later read does
    run_id = triggered["id"]
    await adb.execute("UPDATE runs SET git_sha = 'abc1234' WHERE id = %s", (run_id,))
    run = (await rest.http.get(f"{rest.base}/runs/{run_id}/")).json()["data"]
    assert (run["environment_id"], run["project_id"], run["git_sha"]) == (environment_id, project_id, "abc1234")
    listed = (await rest.http.get(f"{rest.base}/runs/", params={"job_definition_id": job_id})).json()["data"]
    assert [(r["id"], r["project_id"]) for r in listed] == [(run_id, project_id)]


async def test_jobs_and_accounts(rest: Rest, other_rest: Rest, adb: AsyncDb) -> None:
    job_ids = [await rest.create_job(adb, name=n, cron="0 2 * * *") for n in ("b-job", "a-job", "c-job")]
    await other_rest.create_job(adb, name="theirs")
    listed = (await rest.http.get(f"{rest.base}/jobs/", params={"order_by": "name"})).json()
    assert [j["name"] for j in listed["data"]] == ["a-job", "b-job", "c-job"]
    assert listed["extra"]["pagination"] == {"count": 3, "total_count": 3}
    job = (await rest.http.get(f"{rest.base}/jobs/{job_ids[0]}/")).json()["data"]
    assert job["execute_steps"] == ["echo hello"] and job["schedule"]["cron"] == "0 2 * * *"
    assert job["job_type"] == "scheduled" and job["project_id"] is None and job["environment_id"] is None
    # the clients list accounts and jobs under v3 and leave off trailing slashes
    v3 = await rest.http.get(f"/api/v3/accounts/{rest.account_id}/jobs")
    assert [j["id"] for j in v3.json()["data"]] == job_ids
    account = (await rest.http.get(f"{rest.base}/")).json()["data"]
    assert account["id"] == rest.account_id and account["name"] == "acme"


async def test_rerun_after_an_error_keeps_the_overrides_and_names_its_parent(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb)
    first = (await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={"threads_override": 3})).json()["data"]
    await adb.execute("UPDATE runs SET status = 20, finished_at = now() WHERE id = %s", (first["id"],))
    rerun = (await rest.http.post(f"{rest.base}/jobs/{job_id}/rerun/")).json()["data"]
    assert rerun["id"] != first["id"] and rerun["retrying_run_id"] == first["id"]
    assert rerun["trigger"]["threads_override"] == 3
    assert rerun["trigger"]["cause"] == f"Rerun of run {first['id']} from step 1"
    again = await rest.http.post(f"{rest.base}/runs/{rerun['id']}/retry/")
    assert again.status_code == 409  # the rerun is queued, not failed: nothing to resume


async def test_pause_and_unpause_a_job_and_run_it_while_paused(rest: Rest, other_rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb, cron="0 2 * * *")
    paused = (await rest.http.post(f"{rest.base}/jobs/{job_id}/pause/")).json()["data"]
    assert paused["paused"] is True and paused["deactivated"] is False
    assert await scalar(adb, "SELECT paused_at IS NOT NULL FROM jobs WHERE id = %s", job_id)
    run = (await rest.http.post(f"{rest.base}/jobs/{job_id}/run/")).json()["data"]
    assert run["job_paused"] is True and run["status"] == 1
    theirs = await other_rest.http.post(f"{other_rest.base}/jobs/{job_id}/unpause/")
    assert theirs.status_code == 404  # another account's job looks missing, and stays paused
    unpaused = (await rest.http.post(f"{rest.base}/jobs/{job_id}/unpause/")).json()["data"]
    assert unpaused["paused"] is False
    run = (await rest.http.post(f"{rest.base}/jobs/{job_id}/run/")).json()["data"]
    assert run["job_paused"] is False
    account = (await rest.http.get(f"{rest.base}/")).json()["data"]
    assert account["deactivate_after_failures"] == 100


async def test_the_openapi_document_lists_the_dbt_cloud_paths(rest_server: RestServer) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rest_server.port}") as http:
        document = (await http.get("/openapi.json")).json()
    assert set(document["paths"]) == {
        "/api/v3/accounts/{account_id}/projects/{project_id}/commit-statuses/",
        "/api/v3/accounts/{account_id}/runs/{run_id}/commit-statuses/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/environment-variables/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/environment-variables/{variable_id}/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/environment-variables/bulk/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/environment-variables/environment/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/environment-variables/job/",
        "/api/v2/accounts/",
        "/api/v2/accounts/{account_id}/",
        "/api/v2/accounts/{account_id}/jobs/",
        "/api/v2/accounts/{account_id}/jobs/{job_id}/",
        "/api/v2/accounts/{account_id}/jobs/{job_id}/run/",
        "/api/v2/accounts/{account_id}/jobs/{job_id}/rerun/",
        "/api/v2/accounts/{account_id}/jobs/{job_id}/pause/",
        "/api/v2/accounts/{account_id}/jobs/{job_id}/unpause/",
        "/api/v2/accounts/{account_id}/jobs/{job_id}/skipped-occurrences/",
        "/api/v2/accounts/{account_id}/projects/",
        "/api/v2/accounts/{account_id}/projects/{project_id}/",
        "/api/v3/accounts/{account_id}/projects/",
        "/api/v3/accounts/{account_id}/connections/",
        "/api/v3/accounts/{account_id}/connections/{connection_id}/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/repositories/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/repositories/{repository_id}/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/credentials/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/credentials/{credentials_id}/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/",
        "/api/v3/accounts/{account_id}/environments/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/environments/",
        "/api/v3/accounts/{account_id}/projects/{project_id}/environments/{environment_id}/",
        "/api/v2/accounts/{account_id}/runs/",
        "/api/v2/accounts/{account_id}/pull-requests/{pull_request_number}/close/",
        "/api/v2/accounts/{account_id}/runs/{run_id}/",
        "/api/v2/accounts/{account_id}/runs/{run_id}/cancel/",
        "/api/v2/accounts/{account_id}/runs/{run_id}/retry/",
        "/api/v2/accounts/{account_id}/runs/{run_id}/artifacts/",
        "/api/v2/accounts/{account_id}/runs/{run_id}/artifacts/{path}",
        "/api/v2/accounts/{account_id}/jobs/{job_id}/artifacts/{path}",
        "/api/v2/accounts/{account_id}/steps/{step_id}/",
        "/api/v2/accounts/{account_id}/users/",
        "/api/v2/accounts/{account_id}/environments/",
        "/api/v2/accounts/{account_id}/environments/{environment_id}/",
        "/api/v3/accounts/{account_id}/webhooks/subscriptions/",
        "/api/v3/accounts/{account_id}/webhooks/subscription/{webhook_id}/",
        "/api/v3/accounts/{account_id}/webhooks/subscription/{webhook_id}/deliveries/",
        "/api/v3/accounts/{account_id}/webhooks/subscription/{webhook_id}/test/",
        "/api/v3/accounts/{account_id}/webhooks/subscription/{webhook_id}/events/",
        "/api/v3/accounts/{account_id}/webhooks/subscription/{webhook_id}/event/{event_id}/receipt/",
        "/api/v2/accounts/{account_id}/notifications/",
        "/api/v2/accounts/{account_id}/notifications/{notification_id}/",
        "/api/v2/accounts/{account_id}/notifications/{notification_id}/test/",
        "/api/v2/accounts/{account_id}/notifications/{notification_id}/deliveries/",
        "/api/v3/accounts/{account_id}/git-webhooks/",
        "/webhooks/{provider}/{hook_id}/",
    }
