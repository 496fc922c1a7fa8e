"""Deleting jobs, projects and environments from the pages: a page that asks first and changes nothing,
then a post with the forms' CSRF value through the same use cases as the APIs' deletes (queued runs
cancelled, an environment in use refused)."""

from __future__ import annotations

from runplane.basics.types import RunStatus
from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser
from tests.support.web_rows import insert_job, insert_runs


async def test_a_job_an_environment_and_a_project_deleted_after_a_confirmation(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    project = await scalar(
        adb, "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'shop', 'https://x.test/s.git')"
        " RETURNING id", browser.account_id,
    )  # fmt: skip
    environment = await scalar(
        adb, "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
        " schema_name) VALUES (%s, %s, 'prod', 'deployment', '1.10', 'postgres', 'shop') RETURNING id",
        browser.account_id, project,
    )  # fmt: skip
    job = await insert_job(adb, browser.account_id, "nightly", environment_id=environment)
    (queued,) = await insert_runs(adb, browser.account_id, job, 1, status=int(RunStatus.QUEUED))

    assert f'href="/ui/jobs/{job}/delete" id="delete-job"' in (await browser.http.get(f"/ui/jobs/{job}")).text
    projects = (await browser.http.get("/ui/projects")).text
    assert f'id="delete-project-{project}"' in projects and f'id="delete-environment-{environment}"' in projects

    # Asking changes nothing; neither does a post without the CSRF value.
    asking = await browser.http.get(f"/ui/jobs/{job}/delete")
    assert (
        asking.status_code == 200
        and 'id="confirm-delete"' in asking.text
        and "queued runs are cancelled" in asking.text
    )
    assert (await browser.http.post(f"/ui/jobs/{job}/delete")).status_code == 403
    assert await scalar(adb, "SELECT deleted_at FROM jobs WHERE id = %s", job) is None

    # An environment a job uses is not deleted: the asking page says why.
    refused = await browser.post(f"/ui/environments/{environment}/delete")
    assert refused.status_code == 409 and f"is used by jobs {job}" in refused.text and 'id="refusal"' in refused.text
    assert await scalar(adb, "SELECT deleted_at FROM environments WHERE id = %s", environment) is None

    deleted = await browser.post(f"/ui/jobs/{job}/delete")
    assert deleted.status_code == 303 and deleted.headers["location"] == "/ui/jobs"
    assert await scalar(adb, "SELECT deleted_at IS NOT NULL FROM jobs WHERE id = %s", job)
    assert await scalar(adb, "SELECT status FROM runs WHERE id = %s", queued) == int(RunStatus.CANCELLED)
    assert (await browser.http.get(f"/ui/jobs/{job}")).status_code == 404

    deleted = await browser.post(f"/ui/environments/{environment}/delete")
    assert deleted.status_code == 303 and deleted.headers["location"] == "/ui/projects"
    assert await scalar(adb, "SELECT deleted_at IS NOT NULL FROM environments WHERE id = %s", environment)
    assert (await browser.http.get(f"/ui/projects/{project}/delete")).status_code == 200
    deleted = await browser.post(f"/ui/projects/{project}/delete")
    assert deleted.status_code == 303 and deleted.headers["location"] == "/ui/projects"
    assert await scalar(adb, "SELECT deleted_at IS NOT NULL FROM projects WHERE id = %s", project)
    assert (await browser.http.get(f"/ui/projects/{project}/delete")).status_code == 404
