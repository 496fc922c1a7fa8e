"""A refused form names every invalid field at once, refuses a port outside 1–65535 and a dbt version
this installation does not run, and says which typed secrets it did not keep."""

from __future__ import annotations

import re

import pytest

from runplane.basics.settings import Settings
from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser
from tests.support.web_rows import insert_job

PASSWORD = "never-echoed-password"


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    """An installation that runs dbt 1.10 and 1.11 (its runners' dbt_versions) and no other."""
    runner = settings.runner.model_copy(update={"dbt_versions": {"1.10": "/opt/dbt-1.10/bin", "1.11": "/x/bin"}})
    return settings.model_copy(update={"runner": runner})


def _errors(page: str) -> dict[str, str]:
    return dict(re.findall(r'<p class="field-error" id="e-(\w+)">([^<]*)</p>', page))


async def test_every_invalid_field_is_flagged_at_once_and_typed_secrets_are_asked_again(
    browser: Browser, adb: AsyncDb
) -> None:
    await browser.login()
    made = await browser.post(
        "/ui/projects/new", name="shop", repository_url="https://github.com/acme/shop.git", git_credential_kind="none"
    )
    assert made.status_code == 303, made.text
    project_id = int(await scalar(adb, "SELECT id FROM projects WHERE name = 'shop'"))
    form = {
        "name": "", "environment_type": "deployment", "dbt_version": "9.99", "conn_host": "db", "conn_port": "99999999",
        "conn_user": "dbt", "conn_dbname": "w", "schema": "not a schema", "threads": "many",
        "conn_password": PASSWORD,
    }  # fmt: skip
    refused = await browser.post(f"/ui/projects/{project_id}/environments/new", **form)
    assert refused.status_code == 400, refused.text
    errors = _errors(refused.text)
    assert set(errors) == {"name", "dbt_version", "conn_port", "schema", "threads"}, errors
    assert "between 1 and 65535" in errors["conn_port"]
    assert "dbt &#39;9.99&#39; is not installed on the runners (installed: 1.10, 1.11)" in errors["dbt_version"]
    assert PASSWORD not in refused.text
    assert "Nothing was kept of the password you typed: type it again." in refused.text
    assert await scalar(adb, "SELECT count(*) FROM environments") == 0

    # Each of them alone is refused too: a port in range and an installed version are what pass.
    good = form | {"name": "prod", "schema": "analytics", "threads": "4", "dbt_version": "1.11", "conn_port": "5432"}
    for field, value in (("conn_port", "0"), ("conn_port", "65536"), ("dbt_version", "9.99")):
        alone = await browser.post(f"/ui/projects/{project_id}/environments/new", **(good | {field: value}))
        assert alone.status_code == 400 and set(_errors(alone.text)) == {field}, (field, value, _errors(alone.text))
    assert (await browser.post(f"/ui/projects/{project_id}/environments/new", **good)).status_code == 303
    assert '<option value="1.10">' in (await browser.http.get(f"/ui/projects/{project_id}/environments/new")).text

    job = {"name": "", "job_type": "deploy", "steps": "", "threads": "1000", "timeout_seconds": "soon",
           "priority": "5000", "environment": "DBT_ENV_SECRET_KEY=typed"}  # fmt: skip
    refused = await browser.post("/ui/jobs/new", **job)
    assert refused.status_code == 400, refused.text
    errors = _errors(refused.text)
    assert set(errors) == {"name", "steps", "threads", "timeout_seconds", "priority"}, errors
    assert "The secret variables you typed (DBT_ENV_SECRET_KEY) were not kept: type them again." in refused.text
    schedule = {"name": "hourly", "job_type": "deploy", "steps": "dbt build", "cron": "61 * * * *"}
    refused = await browser.post("/ui/jobs/new", **schedule, timezone="Mars/Olympus")
    assert set(_errors(refused.text)) == {"cron", "timezone"}, _errors(refused.text)
    assert await scalar(adb, "SELECT count(*) FROM jobs") == 0


async def test_a_project_edit_names_a_refused_repository_with_the_other_refused_fields(
    browser: Browser, adb: AsyncDb
) -> None:
    await browser.login()
    made = await browser.post(
        "/ui/projects/new", name="shop", repository_url="https://github.com/acme/shop.git", git_credential_kind="none"
    )
    assert made.status_code == 303, made.text
    project_id = int(await scalar(adb, "SELECT id FROM projects WHERE name = 'shop'"))
    refused = await browser.post(
        f"/ui/projects/{project_id}/edit", name="", repository_url="ftp://example.com/x.git", subdirectory="../up",
        git_credential_kind="none",
    )  # fmt: skip
    assert refused.status_code == 400, refused.text
    assert set(_errors(refused.text)) == {"name", "repository_url", "subdirectory"}, _errors(refused.text)
    assert await scalar(adb, "SELECT name FROM projects WHERE id = %s", project_id) == "shop"


async def test_run_now_names_every_refused_override_at_once(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    job_id = await insert_job(adb, browser.account_id, "nightly")
    refused = await browser.post(
        f"/ui/jobs/{job_id}/run", threads="0", git_sha="not-a-sha", schema="not a schema", timeout_seconds="soon"
    )
    assert refused.status_code == 400, refused.text
    assert set(_errors(refused.text)) == {"threads", "git_sha", "schema", "timeout_seconds"}, _errors(refused.text)
    assert await scalar(adb, "SELECT count(*) FROM runs WHERE job_id = %s", job_id) == 0
