"""Every filter dbt Cloud's OpenAPI document lists for the runs, jobs, projects and environments lists
is applied (or, for what runplane does not keep, refused with the reason), never a 400 for a name
the document gives."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import AsyncDb, Rest
from tests.api.rest.test_dbt_cloud import _environment, _project, _trigger


async def _ids(rest: Rest, path: str, **params: Any) -> list[int]:
    response = await rest.http.get(path, params=params)
    assert response.status_code == 200, (path, params, response.text)
    return [item["id"] for item in response.json()["data"]]


async def test_runs_take_ids_versions_docs_and_date_ranges(rest: Rest, adb: AsyncDb) -> None:
    project = await _project(rest)
    env = await _environment(rest, project["id"], dbt_version="1.10")
    job_id = await rest.create_job(adb, environment_id=env["id"])
    first, second, third = [await _trigger(rest, job_id) for _ in range(3)]
    await adb.execute(
        "UPDATE runs SET queued_at = '2024-01-10 12:00+00', finished_at = '2024-01-10 12:05+00', status = 20 "
        "WHERE id = %s",
        (first,),
    )
    await adb.execute(
        "UPDATE runs SET queued_at = '2024-02-10 12:00+00', finished_at = '2024-02-10 12:05+00', status = 10, "
        'overrides = overrides || \'{"dbt_version": "1.9"}\' WHERE id = %s',
        (second,),
    )
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/catalog.json', 0, '{}')",
        (second,),
    )
    runs = f"{rest.base}/runs/"
    assert await _ids(rest, runs, pk=second) == [second]
    assert await _ids(rest, runs, pk__in=f"[{first},{third}]", order_by="id") == [first, third]
    assert await _ids(rest, runs, id__gt=first, order_by="id") == [second, third]
    assert await _ids(rest, runs, dbt_version="1.9") == [second]
    assert await _ids(rest, runs, dbt_version__in='["1.10"]', order_by="id") == [first, third]
    assert await _ids(rest, runs, has_docs_generated="true") == [second]
    assert await _ids(rest, runs, has_docs_generated="false", order_by="id") == [first, third]
    assert await _ids(rest, runs, has_sources_generated="true") == []
    assert await _ids(rest, runs, created_at__range="2024-01-01,2024-01-31") == [first]
    # dbt Cloud's clients send the range as a JSON list too; the ends are included.
    both = '["2024-01-10T12:00:00+00:00", "2024-02-10 12:05:00+00:00"]'
    assert await _ids(rest, runs, finished_at__range=both, order_by="id") == [first, second]
    assert await _ids(rest, runs, state="all", order_by="id") == [first, second, third]
    assert await _ids(rest, runs, state="deleted") == []  # runplane keeps no deleted run
    echoed = (await rest.http.get(runs, params={"id__gt": first, "state": "1"})).json()["extra"]["filters"]
    assert echoed["id__gt"] == first and echoed["state"] == "active"
    for name, value in (("created_at__range", "2024-02-01"), ("state", "gone"), ("created_at__range", "x,y")):
        response = await rest.http.get(runs, params={name: value})
        assert response.status_code == 400 and name in response.json()["status"]["user_message"], response.text


async def test_jobs_take_ids_state_schedule_versions_and_recent_runs(rest: Rest, adb: AsyncDb) -> None:
    project = await _project(rest)
    old = await _environment(rest, project["id"], "old", dbt_version="1.8")
    scheduled = await rest.create_job(adb, name="nightly", cron="0 3 * * *", environment_id=old["id"])
    manual = await rest.create_job(adb, name="manual")
    gone = await rest.create_job(adb, name="gone")
    await adb.execute("UPDATE jobs SET deleted_at = now() WHERE id = %s", (gone,))
    jobs = f"{rest.base}/jobs/"
    assert await _ids(rest, jobs, pk=manual) == [manual]
    assert await _ids(rest, jobs, pk__in=f"{scheduled},{gone}") == [scheduled]
    assert await _ids(rest, jobs, id__gt=scheduled) == [manual]
    assert await _ids(rest, jobs, triggers_schedule="true") == [scheduled]
    assert await _ids(rest, jobs, triggers_schedule="false") == [manual]
    assert await _ids(rest, jobs, dbt_version__in='["1.8"]') == [scheduled]
    assert await _ids(rest, jobs, state="deleted") == [gone]
    assert await _ids(rest, jobs, state="all") == [scheduled, manual, gone]
    assert await _ids(rest, jobs, is_system="true") == []
    assert await _ids(rest, jobs, is_system="false") == [scheduled, manual]
    refused = await rest.http.get(jobs, params={"is_fusion_ready": "true"})
    assert refused.status_code == 400 and "is_fusion_ready" in refused.json()["status"]["user_message"]

    run_id = await _trigger(rest, manual)
    await adb.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (run_id,))
    newest = await _trigger(rest, manual)
    listed = await rest.http.get(
        jobs, params={"pk": manual, "include_related": "most_recent_run,most_recent_completed_run"}
    )
    (job,) = listed.json()["data"]
    assert job["most_recent_run"]["id"] == newest and job["most_recent_completed_run"]["id"] == run_id
    assert (await rest.http.get(jobs, params={"include_related": "frobs"})).status_code == 400


async def test_projects_and_environments_take_ids_state_and_include_related(rest: Rest) -> None:
    v3 = f"/api/v3/accounts/{rest.account_id}"
    shop, web = await _project(rest, "shop"), await _project(rest, "web")
    prod, dev = await _environment(rest, shop["id"], "prod"), await _environment(rest, shop["id"], "dev")
    assert await _ids(rest, f"{v3}/projects/", pk=web["id"]) == [web["id"]]
    assert await _ids(rest, f"{v3}/projects/", pk__gt=shop["id"]) == [web["id"]]
    assert await _ids(rest, f"{v3}/projects/", state="all", include_related="repository") == [shop["id"], web["id"]]
    assert await _ids(rest, f"{v3}/projects/", state="deleted") == []
    envs = f"{v3}/projects/{shop['id']}/environments/"
    assert await _ids(rest, envs, pk=dev["id"]) == [dev["id"]]
    assert await _ids(rest, envs, pk__in=f"[{prod['id']}]") == [prod["id"]]
    assert await _ids(rest, envs, id__gt=prod["id"], include_related="connection,credentials") == [dev["id"]]
    assert await _ids(rest, envs, state="2") == []
    assert (await rest.http.get(f"{v3}/projects/", params={"id__gt": 1})).status_code == 400  # not a project filter
