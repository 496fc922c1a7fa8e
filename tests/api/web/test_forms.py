"""Making and changing projects, environments and jobs from the web pages: the APIs' own checks, every
refusal next to its field with the typed input kept, secrets write-only, an edit keeping what the
form does not show."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from api.admin import create_token
from runplane.basics.settings import Settings
from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser

TOKEN = "ghp_not-a-real-token-0123456789"
PASSWORD = "s3cret-warehouse-password"
SECRET_VALUE = "a-secret-api-key-value"


def _id(response_location: str, pattern: str) -> int:
    found = re.search(pattern, response_location)
    assert found, response_location
    return int(found.group(1))


def _selected(page: str, name: str) -> str | None:
    """The value chosen in the page's select ``name`` (None: no such select, or nothing chosen)."""
    select = re.search(rf'<select id="f-{name}" name="{name}".*?</select>', page, re.S)
    chosen = select and re.search(r'<option value="([^"]*)" selected>', select.group(0))
    return chosen.group(1) if chosen else None


async def _project(browser: Browser, adb: AsyncDb) -> int:
    response = await browser.post(
        "/ui/projects/new",
        name="analytics",
        repository_url="https://github.com/acme/analytics.git",
        subdirectory="",
        git_credential_kind="token",
        git_credential=TOKEN,
    )
    assert response.status_code == 303, response.text
    return int(await scalar(adb, "SELECT id FROM projects WHERE name = 'analytics'"))


async def _environment(browser: Browser, adb: AsyncDb, project_id: int) -> int:
    response = await browser.post(
        f"/ui/projects/{project_id}/environments/new",
        name="production",
        environment_type="deployment",
        dbt_version="1.10",
        conn_host="127.0.0.1",
        conn_port="5432",
        conn_user="dbt",
        conn_dbname="warehouse",
        conn_password=PASSWORD,
        target_name="prod",
        schema="analytics",
        threads="8",
        variables="DBT_PROFILE_FLAG=1",
    )
    assert response.status_code == 303, response.text
    return int(await scalar(adb, "SELECT id FROM environments WHERE name = 'production'"))


async def test_a_project_an_environment_and_a_job_made_from_the_pages(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    assert 'id="new-project"' in (await browser.http.get("/ui/projects")).text
    project_id = await _project(browser, adb)
    stored = await scalar(adb, "SELECT git_credential FROM projects WHERE id = %s", project_id)
    assert stored and TOKEN not in stored  # encrypted at rest
    environment_id = await _environment(browser, adb, project_id)
    row = await (
        await adb.execute(
            "SELECT connection, connection_secrets, target_name, schema_name, threads FROM environments WHERE id = %s",
            (environment_id,),
        )
    ).fetchone()
    assert row is not None
    assert row[0] == {"host": "127.0.0.1", "port": "5432", "user": "dbt", "dbname": "warehouse"}
    assert set(row[1]) == {"password"} and PASSWORD not in str(row[1])
    assert row[2:] == ("prod", "analytics", 8)

    new = (await browser.http.get("/ui/jobs/new")).text
    assert f'<option value="{environment_id}" >production</option>' in new
    key = re.search(r'name="create_key" value="(\w+)"', new)
    assert key is not None
    form = {
        "name": "nightly build",
        "job_type": "deploy",
        "environment_id": str(environment_id),
        "steps": "dbt seed\ndbt build\n",
        "cron": "0 6 * * 1-5",
        "timezone": "Europe/Paris",
        "threads": "",
        "generate_docs": "on",
        "environment": f"PLAIN=visible\nDBT_ENV_SECRET_API_KEY={SECRET_VALUE}",
        "create_key": key.group(1),
    }
    response = await browser.post("/ui/jobs/new", **form)
    assert response.status_code == 303, response.text
    job_id = _id(response.headers["location"], r"/ui/jobs/(\d+)$")
    again = await browser.post("/ui/jobs/new", **form)  # the same form sent twice makes one job
    assert again.headers["location"] == response.headers["location"]
    job = await (
        await adb.execute(
            "SELECT steps, cron, timezone, environment_id, generate_docs, environment, secret_environment"
            " FROM jobs WHERE id = %s",
            (job_id,),
        )
    ).fetchone()
    assert job is not None
    assert job[:5] == (["dbt seed", "dbt build"], "0 6 * * 1-5", "Europe/Paris", environment_id, True)
    assert job[5] == {"PLAIN": "visible"} and set(job[6]) == {"DBT_ENV_SECRET_API_KEY"}
    assert SECRET_VALUE not in str(job[6])

    # Edit pages show no secret: neither the project's token, the password, nor the secret variable.
    for path in (
        f"/ui/projects/{project_id}/edit",
        f"/ui/environments/{environment_id}/edit",
        f"/ui/jobs/{job_id}/edit",
    ):
        page = (await browser.http.get(path)).text
        assert TOKEN not in page and PASSWORD not in page and SECRET_VALUE not in page, path
    edit = (await browser.http.get(f"/ui/jobs/{job_id}/edit")).text
    assert "DBT_ENV_SECRET_API_KEY" in edit and 'value="nightly build"' in edit


async def test_a_refused_form_shows_the_error_at_its_field_with_what_was_typed(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    response = await browser.post(
        "/ui/jobs/new", name="mine", job_type="deploy", steps="dbt build", threads="1000", cron="0 6 * * *"
    )
    assert response.status_code == 400
    page = response.text
    assert re.search(r'<p class="field-error" id="e-threads">must be between 0 and 64 \(got 1000\)</p>', page)
    assert 'name="name" type="text" value="mine"' in page and ">dbt build</textarea>" in page
    assert 'value="1000"' in page and 'aria-invalid="true" aria-describedby="e-threads"' in page
    assert 'href="/ui/runs"' in page  # inside the layout, with its menu
    assert await scalar(adb, "SELECT count(*) FROM jobs") == 0

    for form, field, words in (
        ({"cron": "61 * * * *"}, "cron", "not a valid cron"),
        ({"timezone": "Mars/Olympus", "cron": "0 * * * *"}, "timezone", "is not an IANA time zone"),
        ({"steps": ""}, "steps", "a job needs at least one step"),
        ({"job_type": "ci", "cron": "0 * * * *"}, "cron", "run on pull requests"),
        ({"environment": "no equals sign"}, "environment", "line 1 is not NAME=value"),
    ):
        fields = {"name": "mine", "job_type": "deploy", "steps": "dbt build", **form}
        refused = await browser.post("/ui/jobs/new", **fields)
        assert refused.status_code == 400, (form, refused.text[-500:])
        error = re.search(r'id="e-(\w+)">([^<]*)<', refused.text)
        assert error is not None and error.group(1) == field and words in error.group(2), (form, error)

    refused = await browser.post(
        "/ui/projects/new", name="p", repository_url="ftp://example.com/x.git", git_credential_kind="token",
        git_credential=TOKEN,
    )  # fmt: skip
    assert refused.status_code == 400 and 'id="e-repository_url"' in refused.text
    assert TOKEN not in refused.text  # a secret is never sent back, even on a refused form
    project_id = await _project(browser, adb)
    refused = await browser.post(
        f"/ui/projects/{project_id}/environments/new", name="e", environment_type="deployment", dbt_version="1.10",
        conn_user="dbt", conn_dbname="w", schema="s", conn_port="not-a-port", conn_host="db",
    )  # fmt: skip
    assert refused.status_code == 400 and re.search(r'id="e-conn_port">must be an integer', refused.text)
    assert 'name="conn_host" type="text" value="db"' in refused.text


async def test_editing_keeps_what_the_form_does_not_show_and_secrets_left_empty(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    project_id = await _project(browser, adb)
    environment_id = await _environment(browser, adb, project_id)
    upstream = int(
        await scalar(
            adb,
            "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, 'upstream', 'deploy', '{echo}')"
            " RETURNING id",
            browser.account_id,
        )
    )
    response = await browser.post(
        "/ui/jobs/new", name="downstream", job_type="deploy", steps="dbt build", environment_id=str(environment_id),
        environment=f"DBT_ENV_SECRET_KEY={SECRET_VALUE}",
    )  # fmt: skip
    job_id = _id(response.headers["location"], r"/ui/jobs/(\d+)$")
    await adb.execute("UPDATE jobs SET priority = 7 WHERE id = %s", (job_id,))
    await adb.execute(
        "INSERT INTO job_completion_triggers (job_id, upstream_job_id, statuses) VALUES (%s, %s, '{10}')",
        (job_id, upstream),
    )
    secret_before = await scalar(adb, "SELECT secret_environment FROM jobs WHERE id = %s", job_id)
    version = await scalar(adb, "SELECT version FROM jobs WHERE id = %s", job_id)
    edit = (await browser.http.get(f"/ui/jobs/{job_id}/edit")).text
    assert f'name="version" value="{version}"' in edit
    saved = await browser.post(
        f"/ui/jobs/{job_id}/edit", name="downstream v2", job_type="deploy", steps="dbt build\ndbt test",
        environment_id=str(environment_id), environment="", version=str(version), upstream_job_id=str(upstream),
        upstream_success="on",
    )  # fmt: skip
    assert saved.status_code == 303 and saved.headers["location"] == f"/ui/jobs/{job_id}"
    row = await (
        await adb.execute("SELECT name, steps, priority, secret_environment FROM jobs WHERE id = %s", (job_id,))
    ).fetchone()
    assert row == ("downstream v2", ["dbt build", "dbt test"], 7, secret_before)
    assert (
        await scalar(adb, "SELECT upstream_job_id FROM job_completion_triggers WHERE job_id = %s", job_id) == upstream
    )

    stale = await browser.post(
        f"/ui/jobs/{job_id}/edit", name="late edit", job_type="deploy", steps="dbt build", version=str(version)
    )
    assert stale.status_code == 409 and "someone else saved job" in stale.text  # the form again, typed input kept
    assert 'name="name" type="text" value="late edit"' in stale.text and 'href="/ui/jobs"' in stale.text

    # An environment saved with the password left empty keeps it; the box asks to remove it.
    before = await scalar(adb, "SELECT connection_secrets FROM environments WHERE id = %s", environment_id)
    kept = await browser.post(
        f"/ui/environments/{environment_id}/edit", name="production", environment_type="deployment",
        dbt_version="1.11", conn_host="db.internal", conn_user="dbt", conn_dbname="warehouse", schema="analytics",
    )  # fmt: skip
    assert kept.status_code == 303, kept.text
    row = await (
        await adb.execute(
            "SELECT connection_secrets, dbt_version, connection->>'host' FROM environments WHERE id = %s",
            (environment_id,),
        )
    ).fetchone()
    assert row == (before, "1.11", "db.internal")
    cleared = await browser.post(
        f"/ui/environments/{environment_id}/edit", name="production", environment_type="deployment",
        dbt_version="1.11", conn_host="db.internal", conn_user="dbt", conn_dbname="warehouse", schema="analytics",
        clear_password="on",
    )  # fmt: skip
    assert cleared.status_code == 303
    assert await scalar(adb, "SELECT connection_secrets FROM environments WHERE id = %s", environment_id) == {}


async def test_a_read_only_token_sees_no_forms_and_cannot_save(
    browser: Browser, settings: Settings, adb: AsyncDb
) -> None:
    reader = await create_token(settings, account_id=browser.account_id, scopes=("read_only",))
    await browser.login(reader)
    assert 'id="new-job"' not in (await browser.http.get("/ui/jobs")).text
    refused = await browser.http.post(
        "/ui/jobs/new", data={"csrf_token": browser.csrf, "name": "x", "job_type": "deploy", "steps": "echo"}
    )
    assert refused.status_code == 403
    assert await scalar(adb, "SELECT count(*) FROM jobs") == 0


async def test_a_job_runs_on_another_jobs_completion_set_on_its_form(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    first = await browser.post("/ui/jobs/new", name="first", job_type="deploy", steps="echo 1")
    first_id = _id(first.headers["location"], r"/ui/jobs/(\d+)$")
    second = await browser.post(
        "/ui/jobs/new", name="second", job_type="deploy", steps="echo 2", upstream_job_id=str(first_id),
        upstream_success="on", upstream_error="on",
    )  # fmt: skip
    second_id = _id(second.headers["location"], r"/ui/jobs/(\d+)$")
    row = await (
        await adb.execute(
            "SELECT upstream_job_id, statuses FROM job_completion_triggers WHERE job_id = %s", (second_id,)
        )
    ).fetchone()
    assert row == (first_id, [10, 20])
    edit = (await browser.http.get(f"/ui/jobs/{second_id}/edit")).text
    assert f'<option value="{first_id}" selected>first</option>' in edit and 'name="upstream_error" checked' in edit

    # The first job running on the second's completion would make a loop: refused at the field.
    loop = await browser.post(
        f"/ui/jobs/{first_id}/edit", name="first", job_type="deploy", steps="echo 1", upstream_job_id=str(second_id),
        upstream_success="on",
    )  # fmt: skip
    assert loop.status_code == 400
    assert re.search(r'id="e-upstream_job_id">these triggers would make jobs trigger each other in a loop<', loop.text)
    no_status = await browser.post(
        f"/ui/jobs/{first_id}/edit", name="first", job_type="deploy", steps="echo 1", upstream_job_id=str(second_id)
    )
    assert no_status.status_code == 400 and 'id="e-upstream_job_id">name at least one of' in no_status.text

    # A page from before the form had rows for every trigger posts none: a save keeps them all.
    third = await browser.post("/ui/jobs/new", name="third", job_type="deploy", steps="echo 3")
    third_id = _id(third.headers["location"], r"/ui/jobs/(\d+)$")
    await adb.execute(
        "INSERT INTO job_completion_triggers (job_id, upstream_job_id, statuses) VALUES (%s, %s, '{30}')",
        (second_id, third_id),
    )
    saved = await browser.post(f"/ui/jobs/{second_id}/edit", name="second", job_type="deploy", steps="echo 2")
    assert saved.status_code == 303
    kept = await scalar(adb, "SELECT count(*) FROM job_completion_triggers WHERE job_id = %s", second_id)
    assert kept == 2


async def test_several_completion_triggers_and_fan_in_on_the_job_form(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    ids = []
    for name in ("orders", "customers", "payments"):
        made = await browser.post("/ui/jobs/new", name=name, job_type="deploy", steps=f"echo {name}")
        ids.append(_id(made.headers["location"], r"/ui/jobs/(\d+)$"))
    orders, customers, payments = ids
    fan_in = {
        "name": "marts", "job_type": "deploy", "steps": "echo marts", "completion_mode": "all",
        "upstream_job_id": str(orders), "upstream_success": "on",
        "upstream_job_id_1": str(customers), "upstream_success_1": "on", "upstream_error_1": "on",
        "upstream_job_id_2": "", "upstream_success_2": "on",  # the empty row to add one: ignored
    }  # fmt: skip
    made = await browser.post("/ui/jobs/new", **fan_in)
    assert made.status_code == 303, made.text
    job_id = _id(made.headers["location"], r"/ui/jobs/(\d+)$")

    async def triggers() -> list[tuple[int, list[int]]]:
        cur = await adb.execute(
            "SELECT upstream_job_id, statuses FROM job_completion_triggers WHERE job_id = %s ORDER BY upstream_job_id",
            (job_id,),
        )
        return [(row[0], row[1]) for row in await cur.fetchall()]

    assert await triggers() == [(orders, [10]), (customers, [10, 20])]
    assert await scalar(adb, "SELECT completion_mode FROM jobs WHERE id = %s", job_id) == "all"

    # The edit form has a row per trigger, and one more to add another.
    edit = (await browser.http.get(f"/ui/jobs/{job_id}/edit")).text
    assert _selected(edit, "upstream_job_id_1") == str(customers)
    assert 'name="upstream_error_1" checked' in edit and 'name="upstream_job_id_2"' in edit
    assert 'name="upstream_job_id_3"' not in edit
    version = await scalar(adb, "SELECT version FROM jobs WHERE id = %s", job_id)
    added = await browser.post(
        f"/ui/jobs/{job_id}/edit",
        **{**fan_in, "version": str(version), "upstream_job_id_2": str(payments), "upstream_cancelled_2": "on"},
    )
    assert added.status_code == 303, added.text
    assert await triggers() == [(orders, [10]), (customers, [10, 20]), (payments, [10, 30])]

    # An error of one trigger is shown at its own row, with every row as it was typed.
    version = await scalar(adb, "SELECT version FROM jobs WHERE id = %s", job_id)
    for form, words in (
        ({"upstream_job_id_1": str(orders)}, f"job {orders} is listed twice"),
        ({"upstream_success_1": "", "upstream_error_1": ""}, "name at least one of success, error, cancelled"),
        ({"upstream_job_id_1": str(job_id)}, "a job cannot run on its own completion"),
    ):
        sent = {k: v for k, v in {**fan_in, "version": str(version), **form}.items() if v}
        refused = await browser.post(f"/ui/jobs/{job_id}/edit", **sent)
        assert refused.status_code == 400, (form, refused.text[-500:])
        assert re.search(rf'id="e-upstream_job_id_1">{words}<', refused.text), (form, refused.text[-2000:])
        assert _selected(refused.text, "upstream_job_id") == str(orders)
    assert len(await triggers()) == 3

    # A row set back to no job removes its trigger.
    removed = await browser.post(f"/ui/jobs/{job_id}/edit", **{**fan_in, "upstream_job_id_1": ""}, version=str(version))
    assert removed.status_code == 303, removed.text
    assert await triggers() == [(orders, [10])]


async def test_an_environments_secret_variables_are_write_only_on_its_form(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    project_id = await _project(browser, adb)
    environment_id = await _environment(browser, adb, project_id)
    fields = {
        "name": "production", "environment_type": "deployment", "dbt_version": "1.10", "conn_host": "127.0.0.1",
        "conn_user": "dbt", "conn_dbname": "warehouse", "schema": "analytics",
    }  # fmt: skip
    path = f"/ui/environments/{environment_id}/edit"

    async def stored() -> tuple[dict[str, str], dict[str, str]]:
        cur = await adb.execute("SELECT variables, secret_variables FROM environments WHERE id = %s", (environment_id,))
        row = await cur.fetchone()
        assert row is not None
        return row[0], row[1]

    saved = await browser.post(path, **fields, variables=f"PLAIN=1\nDBT_ENV_SECRET_WAREHOUSE_KEY={SECRET_VALUE}")
    assert saved.status_code == 303, saved.text
    plain, sealed = await stored()
    assert plain == {"PLAIN": "1"} and set(sealed) == {"DBT_ENV_SECRET_WAREHOUSE_KEY"}
    assert SECRET_VALUE not in str(sealed)  # encrypted at rest
    edit = (await browser.http.get(path)).text
    assert "DBT_ENV_SECRET_WAREHOUSE_KEY" in edit and SECRET_VALUE not in edit and ">PLAIN=1</textarea>" in edit

    refused = await browser.post(path, **{**fields, "threads": "1000"}, variables=f"DBT_ENV_SECRET_NEW={SECRET_VALUE}")
    assert refused.status_code == 400 and SECRET_VALUE not in refused.text  # a refused form echoes no secret
    assert 'id="e-threads"' in refused.text
    job = await browser.post(
        "/ui/jobs/new", name="j", job_type="deploy", steps="dbt build", threads="1000",
        environment=f"PLAIN=typed\nDBT_ENV_SECRET_KEY={SECRET_VALUE}",
    )  # fmt: skip
    assert job.status_code == 400 and SECRET_VALUE not in job.text and "PLAIN=typed" in job.text  # nor a job's

    kept = await browser.post(path, **fields, variables="PLAIN=2")  # not named: kept
    assert kept.status_code == 303, kept.text
    assert await stored() == ({"PLAIN": "2"}, sealed)
    removed = await browser.post(path, **fields, variables="DBT_ENV_SECRET_WAREHOUSE_KEY=")  # empty: removed
    assert removed.status_code == 303, removed.text
    assert await stored() == ({}, {})


async def test_priority_missed_run_grace_and_fan_in_set_on_the_job_form(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    new = (await browser.http.get("/ui/jobs/new")).text
    for name in ("priority", "missed_run_grace_seconds", "completion_mode"):
        assert f'name="{name}"' in new, name
    upstream = await browser.post("/ui/jobs/new", name="upstream", job_type="deploy", steps="echo up")
    upstream_id = _id(upstream.headers["location"], r"/ui/jobs/(\d+)$")
    made = await browser.post(
        "/ui/jobs/new", name="urgent", job_type="deploy", steps="echo 1", cron="0 6 * * *", priority="9",
        missed_run_grace_seconds="0", upstream_job_id=str(upstream_id), upstream_success="on", completion_mode="all",
    )  # fmt: skip
    assert made.status_code == 303, made.text
    job_id = _id(made.headers["location"], r"/ui/jobs/(\d+)$")

    async def stored() -> tuple[int, int, str]:
        cur = await adb.execute(
            "SELECT priority, missed_run_grace_seconds, completion_mode FROM jobs WHERE id = %s", (job_id,)
        )
        row = await cur.fetchone()
        assert row is not None
        return row[0], row[1], row[2]

    assert await stored() == (9, 0, "all")  # 0: a missed fire is skipped, not the default grace
    shown = (await browser.http.get(f"/ui/jobs/{job_id}")).text  # the job's page shows them, not only its form
    assert '<span id="priority">9</span>' in shown
    assert '<span id="grace">none: a fire missed is skipped</span>' in shown
    completion = re.search(r'<div id="completion">(.*?)</div>', shown, re.S)
    assert completion is not None
    assert "all of:" in completion.group(1) and f'href="/ui/jobs/{upstream_id}"' in completion.group(1)
    assert "on success" in completion.group(1)
    edit = (await browser.http.get(f"/ui/jobs/{job_id}/edit")).text
    assert 'name="priority" type="text" value="9"' in edit
    assert 'name="missed_run_grace_seconds" type="text" value="0"' in edit
    assert '<option value="all" selected>' in edit
    version = await scalar(adb, "SELECT version FROM jobs WHERE id = %s", job_id)
    edited = {
        "name": "urgent", "job_type": "deploy", "steps": "echo 1", "cron": "0 6 * * *", "version": str(version),
        "upstream_job_id": str(upstream_id), "upstream_success": "on",
    }  # fmt: skip
    saved = await browser.post(
        f"/ui/jobs/{job_id}/edit", **edited, priority="-3", missed_run_grace_seconds="", completion_mode="any"
    )
    assert saved.status_code == 303, saved.text
    assert await stored() == (-3, 300, "any")  # empty grace: the default, as the API's
    shown = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert '<span id="priority">-3</span>' in shown and '<span id="grace">5 m 00 s</span>' in shown
    assert "any of:" in shown

    # The API's bounds, each refused at its field with what was typed; nothing is saved.
    version = await scalar(adb, "SELECT version FROM jobs WHERE id = %s", job_id)
    for form, field, words in (
        ({"priority": "5000"}, "priority", "must be between -1000 and 1000 (got 5000)"),
        ({"priority": "high"}, "priority", "&#39;high&#39; is not a whole number"),
        ({"missed_run_grace_seconds": "-5"}, "missed_run_grace_seconds", "must be between 0 and 86400 (got -5)"),
        ({"missed_run_grace_seconds": "90000"}, "missed_run_grace_seconds", "must be between 0 and 86400"),
        ({"completion_mode": "some"}, "completion_mode", "choose one of any, all"),
    ):
        refused = await browser.post(f"/ui/jobs/{job_id}/edit", **{**edited, "version": str(version), **form})
        assert refused.status_code == 400, (form, refused.text[-500:])
        error = re.search(r'<p class="field-error" id="e-(\w+)">([^<]*)</p>', refused.text)
        assert error is not None and error.group(1) == field and words in error.group(2), (form, error)
        typed = next(iter(form.values()))
        if field != "completion_mode":  # a select shows its choices; the text fields show what was typed
            assert f'name="{field}" type="text" value="{typed}"' in refused.text, form
    assert await stored() == (-3, 300, "any")


async def test_run_now_at_a_later_time_with_docs_and_dbt_version_overridden(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    project_id = await _project(browser, adb)
    environment_id = await _environment(browser, adb, project_id)
    made = await browser.post(
        "/ui/jobs/new", name="docs", job_type="deploy", steps="dbt build", environment_id=str(environment_id),
        generate_docs="on",
    )  # fmt: skip
    job_id = _id(made.headers["location"], r"/ui/jobs/(\d+)$")
    await browser.http.get("/ui/time-zone", params={"zone": "Europe/Paris"})  # the viewer's zone
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert 'name="run_at" type="datetime-local"' in page and "Run at (Europe/Paris)" in page
    assert "the job&#39;s setting (yes)" in page and 'name="dbt_version"' in page

    at = (datetime.now(UTC) + timedelta(days=2)).replace(second=0, microsecond=0)
    typed = at.astimezone(ZoneInfo("Europe/Paris")).strftime("%Y-%m-%dT%H:%M")  # what datetime-local sends
    later = await browser.post(f"/ui/jobs/{job_id}/run", run_at=typed, generate_docs="off", dbt_version="1.11")
    assert later.status_code == 303, later.text
    run_id = int(later.headers["location"].rsplit("/", 1)[1])
    row = await (
        await adb.execute("SELECT status, scheduled_at, overrides FROM runs WHERE id = %s", (run_id,))
    ).fetchone()
    assert row == (1, at, {"generate_docs": False, "dbt_version": "1.11"})  # queued for then, in the viewer's zone

    now = await browser.post(f"/ui/jobs/{job_id}/run")  # both left empty: now, with the job's docs setting
    now_id = int(now.headers["location"].rsplit("/", 1)[1])
    assert await scalar(adb, "SELECT overrides FROM runs WHERE id = %s", now_id) == {}

    for form, field, words in (
        ({"run_at": "2020-01-01T06:00"}, "run_at", "is in the past"),
        ({"run_at": "tomorrow"}, "run_at", "is not a time"),
        ({"run_at": "2999-01-01T06:00"}, "run_at", "at most 366 days ahead"),
        ({"generate_docs": "maybe"}, "generate_docs", "is not one of on, off"),
        ({"dbt_version": "1.11; rm -rf /"}, "dbt_version", "a version or image tag"),
    ):
        refused = await browser.post(f"/ui/jobs/{job_id}/run", **form)
        assert refused.status_code == 400, (form, refused.text[-500:])
        error = re.search(r'<p class="field-error" id="e-(\w+)">([^<]*)</p>', refused.text)
        assert error is not None and error.group(1) == field and words in error.group(2), (form, error)
        if field == "run_at":
            assert f'name="run_at" type="datetime-local" value="{form["run_at"]}"' in refused.text
    assert await scalar(adb, "SELECT count(*) FROM runs WHERE job_id = %s", job_id) == 2


async def test_run_now_sent_twice_makes_one_run(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    made = await browser.post("/ui/jobs/new", name="once", job_type="deploy", steps="echo once")
    job_id = _id(made.headers["location"], r"/ui/jobs/(\d+)$")
    page = await browser.http.get(f"/ui/jobs/{job_id}")
    assert page.headers["cache-control"] == "no-store"  # going back to the page gives it a new key
    key = re.search(r'name="run_key" value="(\w+)"', page.text)
    assert key is not None
    again = re.search(r'name="run_key" value="(\w+)"', (await browser.http.get(f"/ui/jobs/{job_id}")).text)
    assert again is not None and again.group(1) != key.group(1)  # each page its own

    first = await browser.post(f"/ui/jobs/{job_id}/run", run_key=key.group(1), cause="deploy fix")
    second = await browser.post(f"/ui/jobs/{job_id}/run", run_key=key.group(1), cause="deploy fix")
    assert first.status_code == second.status_code == 303, second.text
    assert first.headers["location"] == second.headers["location"]
    assert await scalar(adb, "SELECT count(*) FROM runs WHERE job_id = %s", job_id) == 1
    other = await browser.post(f"/ui/jobs/{job_id}/run", run_key=key.group(1), cause="another cause")
    assert other.status_code == 409  # the key of one run, sent with another request: nothing queued
    fresh = await browser.post(f"/ui/jobs/{job_id}/run", run_key=again.group(1), cause="deploy fix")
    assert fresh.status_code == 303 and fresh.headers["location"] != first.headers["location"]
    assert await scalar(adb, "SELECT count(*) FROM runs WHERE job_id = %s", job_id) == 2


async def test_every_warehouse_has_its_form_and_an_edit_keeps_its_adapter(
    browser: Browser, settings: Settings, adb: AsyncDb
) -> None:
    await browser.login()
    project_id = await _project(browser, adb)
    new = (await browser.http.get(f"/ui/projects/{project_id}/environments/new?adapter=duckdb")).text
    assert 'name="adapter_type" value="duckdb"' in new and 'name="conn_path"' in new
    assert 'name="conn_host"' not in new and _selected(new, "adapter") == "duckdb"

    directory = f"{settings.runner.local_warehouse_root}/forms-{project_id}"
    refused = await browser.post(
        f"/ui/projects/{project_id}/environments/new", name="local", environment_type="deployment",
        dbt_version="1.10", adapter_type="duckdb", conn_path="/tmp/dev.duckdb", schema="main",
    )  # fmt: skip
    assert refused.status_code == 400
    assert 'id="e-conn_path"' in refused.text and 'name="adapter_type" value="duckdb"' in refused.text
    saved = await browser.post(
        f"/ui/projects/{project_id}/environments/new", name="local", environment_type="deployment",
        dbt_version="1.10", adapter_type="duckdb", conn_path=f"{directory}/dev.duckdb", conn_keep_open="true",
        schema="main",
    )  # fmt: skip
    assert saved.status_code == 303, saved.text
    local = int(await scalar(adb, "SELECT id FROM environments WHERE name = 'local'"))
    edit = (await browser.http.get(f"/ui/environments/{local}/edit")).text
    assert f'value="{directory}/dev.duckdb"' in edit and _selected(edit, "conn_keep_open") == "true"
    version = await scalar(adb, "SELECT version FROM environments WHERE id = %s", local)
    again = await browser.post(
        f"/ui/environments/{local}/edit", name="local", environment_type="deployment", dbt_version="1.10",
        adapter_type="duckdb", conn_path=f"{directory}/dev.duckdb", schema="main", threads="2", version=str(version),
    )  # fmt: skip
    assert again.status_code == 303, again.text
    row = await (
        await adb.execute("SELECT adapter_type, connection, threads FROM environments WHERE id = %s", (local,))
    ).fetchone()
    assert row == ("duckdb", {"path": f"{directory}/dev.duckdb"}, 2)

    snowflake = await browser.post(
        f"/ui/projects/{project_id}/environments/new", name="cloud", environment_type="deployment",
        dbt_version="1.10", adapter_type="snowflake", conn_account="acme-eu", conn_user="dbt",
        conn_database="ANALYTICS", conn_warehouse="TRANSFORMING", conn_private_key=PASSWORD, schema="dbt",
    )  # fmt: skip
    assert snowflake.status_code == 303, snowflake.text
    cloud = int(await scalar(adb, "SELECT id FROM environments WHERE name = 'cloud'"))
    secrets = await scalar(adb, "SELECT connection_secrets FROM environments WHERE id = %s", cloud)
    assert set(secrets) == {"private_key"} and PASSWORD not in str(secrets)
    shown = (await browser.http.get(f"/ui/environments/{cloud}/edit")).text
    assert PASSWORD not in shown and 'name="clear_private_key"' in shown and 'name="conn_warehouse"' in shown
