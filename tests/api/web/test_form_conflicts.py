"""Two people editing one object from the pages: the second save is refused instead of reverting the
first, the other person's change is named at its field, what was typed is kept (never a secret), and
saving again from the form shown applies it on top."""

from __future__ import annotations

import html
import re

from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser

PASSWORD = "typed-again-password"
TOKEN = "ghp_typed-again-0123456789"


def _hidden(page: str, name: str) -> str:
    found = re.search(rf'<input type="hidden" name="{name}" value="([^"]*)">', page)
    assert found, f"no hidden {name} in the form"
    return html.unescape(found.group(1))


def _input(page: str, name: str) -> str:
    found = re.search(rf'<input id="f-{name}" name="{name}" type="\w+" value="([^"]*)"', page)
    assert found, f"no field {name} in the form"
    return html.unescape(found.group(1))


async def _project_and_environment(browser: Browser, adb: AsyncDb) -> tuple[int, int]:
    made = await browser.post(
        "/ui/projects/new", name="analytics", repository_url="https://github.com/acme/analytics.git",
        git_credential_kind="none",
    )  # fmt: skip
    assert made.status_code == 303, made.text
    project_id = int(await scalar(adb, "SELECT id FROM projects WHERE name = 'analytics'"))
    made = await browser.post(
        f"/ui/projects/{project_id}/environments/new", name="production", environment_type="deployment",
        dbt_version="1.10", conn_host="127.0.0.1", conn_port="5432", conn_user="dbt", conn_dbname="warehouse",
        target_name="prod", schema="analytics", threads="4",
    )  # fmt: skip
    assert made.status_code == 303, made.text
    return project_id, int(await scalar(adb, "SELECT id FROM environments WHERE name = 'production'"))


def _environment_form(page: str, **changed: str) -> dict[str, str]:
    fields = ("name", "dbt_version", "conn_host", "conn_port", "conn_user", "conn_dbname", "target_name", "schema")
    form = {name: _input(page, name) for name in fields}
    form |= {"environment_type": "deployment", "threads": _input(page, "threads")}
    form |= {"version": _hidden(page, "version"), "loaded_values": _hidden(page, "loaded_values")}
    return form | changed


async def test_a_second_save_of_an_environment_or_project_is_refused_with_the_first_named(
    browser: Browser, adb: AsyncDb
) -> None:
    await browser.login()
    project_id, environment_id = await _project_and_environment(browser, adb)
    edit = f"/ui/environments/{environment_id}/edit"
    alice = (await browser.http.get(edit)).text
    bob = (await browser.http.get(edit)).text

    saved = await browser.post(edit, **_environment_form(bob, threads="8"))
    assert saved.status_code == 303, saved.text
    late = await browser.post(edit, **_environment_form(alice, name="production eu", conn_password=PASSWORD))
    assert late.status_code == 409, late.text
    assert "someone else saved environment" in late.text and "They changed: threads." in late.text
    assert "Changed by someone else from &#39;4&#39; to &#39;8&#39;." in late.text  # at the threads field
    assert _input(late.text, "name") == "production eu"  # what Alice typed is kept
    assert PASSWORD not in late.text and "Nothing was kept of the password you typed: type it again." in late.text
    stored = await (
        await adb.execute("SELECT name, threads FROM environments WHERE id = %s", (environment_id,))
    ).fetchone()
    assert stored == ("production", 8)  # Bob's change stands, nothing of Alice's was written

    # The form shown carries the version now stored: saving it applies Alice's change on top of Bob's.
    again = await browser.post(edit, **_environment_form(late.text, threads="8"))
    assert again.status_code == 303, again.text
    stored = await (
        await adb.execute("SELECT name, threads FROM environments WHERE id = %s", (environment_id,))
    ).fetchone()
    assert stored == ("production eu", 8)

    edit = f"/ui/projects/{project_id}/edit"
    alice = (await browser.http.get(edit)).text
    bob = (await browser.http.get(edit)).text
    base = {"repository_url": "https://github.com/acme/analytics.git", "git_credential_kind": "none"}

    def project_form(page: str, name: str, **more: str) -> dict[str, str]:
        return (
            base
            | {"name": name, "version": _hidden(page, "version"), "loaded_values": _hidden(page, "loaded_values")}
            | more
        )

    assert (await browser.post(edit, **project_form(bob, "analytics v2"))).status_code == 303
    late = await browser.post(
        edit, **project_form(alice, "analytics eu", git_credential_kind="token", git_credential=TOKEN)
    )
    assert late.status_code == 409, late.text
    assert "someone else saved project" in late.text and "They changed: name." in late.text
    assert "Changed by someone else from &#39;analytics&#39; to &#39;analytics v2&#39;." in late.text
    assert TOKEN not in late.text and "the token or private key you typed: type it again" in late.text
    assert await scalar(adb, "SELECT name FROM projects WHERE id = %s", project_id) == "analytics v2"


async def test_a_refused_job_edit_keeps_the_form_with_the_conflict_explained(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    made = await browser.post("/ui/jobs/new", name="nightly", job_type="deploy", steps="dbt build", threads="4")
    assert made.status_code == 303, made.text
    job_id = int(made.headers["location"].rsplit("/", 1)[1])
    edit = f"/ui/jobs/{job_id}/edit"
    alice = (await browser.http.get(edit)).text
    bob = (await browser.http.get(edit)).text

    def job_form(page: str, **typed: str) -> dict[str, str]:
        base = {"name": "nightly", "job_type": "deploy", "steps": "dbt build", "threads": "4"}
        return base | {"version": _hidden(page, "version"), "loaded_values": _hidden(page, "loaded_values")} | typed

    assert (await browser.post(edit, **job_form(bob, steps="dbt build\ndbt test"))).status_code == 303
    secret = "DBT_ENV_SECRET_API_KEY=typed-but-refused"
    late = await browser.post(edit, **job_form(alice, name="nightly eu", threads="8", environment=f"PLAIN=1\n{secret}"))
    assert late.status_code == 409, late.text
    assert 'id="job-form"' in late.text  # the form, not an error page
    assert _input(late.text, "name") == "nightly eu" and _input(late.text, "threads") == "8"
    assert "They changed: steps." in late.text
    assert re.search(
        r'id="e-steps">Changed by someone else from &#39;dbt build&#39; to &#39;dbt build…&#39;', late.text
    )
    assert "typed-but-refused" not in late.text and ">PLAIN=1</textarea>" in late.text
    assert "The secret variables you typed (DBT_ENV_SECRET_API_KEY) were not kept: type them again." in late.text
    stored = await (await adb.execute("SELECT name, steps, threads FROM jobs WHERE id = %s", (job_id,))).fetchone()
    assert stored == ("nightly", ["dbt build", "dbt test"], 4)
