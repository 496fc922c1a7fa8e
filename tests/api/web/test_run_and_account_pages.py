"""What a dbt Cloud user looks for on the pages: a run's summary (counts, failed nodes first, model
timing), the run history's environment, commit and schema with its filters, a job's own settings and
its upstream jobs, the account's settings (tokens, webhooks, run slots), and the on-time page's
queued runs that only wait for their time."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime, timedelta

from api.admin import create_token
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser
from tests.support.realistic_account import seed_realistic_account
from tests.support.web_rows import insert_job, insert_runs


def _section(page: str, start: str, end: str = "</table>") -> str:
    at = page.index(start)
    return page[at : page.index(end, at)]


async def test_a_run_summary_counts_its_nodes_and_lists_the_failed_ones_first(browser: Browser, adb: AsyncDb) -> None:
    seeded = await seed_realistic_account(adb, browser.account_id, runs_per_job=3)
    await browser.login()
    page = (await browser.http.get(f"/ui/runs/{seeded.failed_run}")).text
    content = await scalar(adb, "SELECT content FROM artifacts WHERE run_id = %s", seeded.failed_run)
    results = json.loads(bytes(content))["results"]
    expected = {"pass": 0, "warn": 0, "error": 0, "skip": 0}
    for r in results:
        expected[{"success": "pass", "pass": "pass", "warn": "warn", "skipped": "skip"}.get(r["status"], "error")] += 1
    assert expected["error"] == 4 and expected["skip"] > 0 and expected["warn"] > 0
    summary = _section(page, 'id="summary"', "</section>")
    for key, count in expected.items():
        assert re.search(rf'id="count-{key}"><span class="pill s-\w+">{count}</span>', summary), (key, count)
    failed = re.findall(r"<tr><td><code>([^<]+)</code></td><td><span class=\"pill s-\w+\">([\w ]+)</span>", summary)
    statuses = [status for _, status in failed]
    assert statuses[:4] and set(statuses[:4]) <= {"error", "fail"} and set(statuses[4:]) == {"warn"}
    assert {node for node, _ in failed} == {r["unique_id"] for r in results if r["status"] in ("error", "fail", "warn")}
    assert "division by zero" in summary
    models = _section(page, 'class="models"')  # the table lists failed nodes first too
    first = re.findall(r'<tr><td><code>[^<]+</code></td><td><span class="pill s-(\w+)">', models)
    assert first[:4] == ["error"] * 4 and "error" not in first[4:]


async def test_a_run_draws_its_model_timing_without_scripts(browser: Browser, adb: AsyncDb) -> None:
    seeded = await seed_realistic_account(adb, browser.account_id, runs_per_job=3)
    await browser.login()
    page = (await browser.http.get(f"/ui/runs/{seeded.failed_run}")).text
    chart = _section(page, '<ol class="timing"', "</ol>")
    bars = re.findall(r'<span class="segment t-(\w+)" style="margin-left:([\d.]+)%;width:([\d.]+)%">', chart)
    content = await scalar(adb, "SELECT content FROM artifacts WHERE run_id = %s", seeded.failed_run)
    ran = [r for r in json.loads(bytes(content))["results"] if r["timing"]]
    assert len(bars) == min(100, len(ran))
    assert min(float(left) for _, left, _ in bars) == 0.0  # the first node to start begins the chart
    assert max(float(left) + float(width) for _, left, width in bars) > 99.0  # the last to end ends it
    lefts = [float(left) for _, left, _ in bars]
    assert lefts == sorted(lefts)  # in the order they began: the threads overlap
    assert {outcome for outcome, _, _ in bars} >= {"pass", "error"}
    assert "<script" not in chart and "<svg" not in chart


async def test_the_run_history_shows_environment_commit_and_schema_and_filters_by_them(
    browser: Browser, adb: AsyncDb
) -> None:
    seeded = await seed_realistic_account(adb, browser.account_id, runs_per_job=4)
    await browser.login()
    page = (await browser.http.get("/ui/runs")).text
    rows = re.findall(
        r'<a href="/ui/runs/(\d+)">#\d+</a></td>\s*<td><a[^>]*>[^<]*</a></td>\s*<td><span[^>]*>\w+</span></td>\s*'
        r'<td class="environment">([^<]*)</td>\s*'
        r'<td class="hide-narrow"><code class="sha" title="(\w*)">[^<]*</code></td>\s*'
        r'<td class="hide-narrow"><code class="schema">([^<]*)</code></td>',
        page,
    )
    assert len(rows) == 32
    truth = {
        row[0]: row[1:]
        for row in await (
            await adb.execute(
                "SELECT r.id, e.name, r.git_sha, CASE WHEN r.job_type = 'ci' THEN r.schema_name"
                " ELSE coalesce(nullif(r.overrides->>'schema', ''), nullif(j.schema_name, ''), e.schema_name) END"
                " FROM runs r JOIN jobs j ON j.id = r.job_id JOIN environments e ON e.id = j.environment_id"
                " WHERE r.account_id = %s",
                (browser.account_id,),
            )
        ).fetchall()
    }
    for run, environment, sha, schema in rows:
        name, git_sha, effective = truth[int(run)]
        assert (html.unescape(environment), sha, html.unescape(schema)) == (name, git_sha, effective or "—"), run
    assert any(schema.startswith("dbt_cloud_pr_") for *_, schema in rows)  # a CI run's own schema
    assert any(schema == "backfill_2026" for *_, schema in rows)  # a run's override

    def ids(text: str) -> set[int]:
        return {int(x) for x in re.findall(r'<a href="/ui/runs/(\d+)">#', text)}

    snowflake, marketing = seeded.environments[0], seeded.projects[1]
    by_environment = (await browser.http.get("/ui/runs", params={"environment": snowflake})).text
    in_snowflake = await (
        await adb.execute(
            "SELECT r.id FROM runs r JOIN jobs j ON j.id = r.job_id WHERE j.environment_id = %s", (snowflake,)
        )
    ).fetchall()
    assert ids(by_environment) == {row[0] for row in in_snowflake} and len(in_snowflake) == 12
    assert f'<option value="{snowflake}" selected>' in by_environment
    failed_in_marketing = (await browser.http.get("/ui/runs", params={"project": marketing, "status": "error"})).text
    expected = await (
        await adb.execute(
            "SELECT r.id FROM runs r JOIN jobs j ON j.id = r.job_id JOIN environments e ON e.id = j.environment_id"
            " WHERE e.project_id = %s AND r.status = 20",
            (marketing,),
        )
    ).fetchall()
    assert ids(failed_in_marketing) == {row[0] for row in expected}
    refused = await browser.http.get("/ui/runs", params={"environment": "prod"})
    assert refused.status_code == 400 and "is not one of this account&#39;s environments" in refused.text


async def test_a_job_shows_its_own_settings_and_its_upstream_jobs_by_name(browser: Browser, adb: AsyncDb) -> None:
    seeded = await seed_realistic_account(adb, browser.account_id, runs_per_job=1)
    await browser.login()
    nightly = (await browser.http.get(f"/ui/jobs/{seeded.jobs[0]}")).text
    settings = _section(nightly, 'id="settings"', "\n  </div>")
    facts = dict(re.findall(r'<div id="setting-([\w-]+)"><span>[^<]+</span>(.*?)</div>', settings))
    assert f'href="/ui/environments/{seeded.environments[0]}/edit"' in facts["environment"]
    assert "Production (Snowflake) (deployment, snowflake)" in facts["environment"]
    assert facts["dbt-version"].startswith("1.10")
    assert facts["threads"].startswith("16 ") and "the job" in facts["threads"]
    assert facts["target-name"].startswith("prod ")
    assert facts["timeout"].startswith("2 h 00 m")
    staging = (await browser.http.get(f"/ui/jobs/{seeded.jobs[2]}")).text  # threads from its environment
    assert re.search(r'id="setting-threads"><span>Threads</span>8 <span class="muted">\(the environment', staging)
    assert re.search(r'id="setting-timeout"><span>Timeout</span>2 h 00 m', staging)

    dashboards = (await browser.http.get(f"/ui/jobs/{seeded.jobs[5]}")).text
    upstream = _section(dashboards, 'id="completion"', "</div>")
    linked = re.findall(r'<a href="/ui/jobs/(\d+)" class="upstream">([^<]+)</a>', upstream)
    assert linked == [
        (str(seeded.jobs[0]), "Nightly full build of every finance, orders and customer model"),
        (str(seeded.jobs[3]), "Marketing attribution"),
    ]


async def test_the_settings_page_lists_tokens_without_secrets_webhooks_and_run_slots(
    browser: Browser, adb: AsyncDb, settings: Settings
) -> None:
    seeded = await seed_realistic_account(adb, browser.account_id, runs_per_job=2)
    reader = await create_token(settings, account_id=browser.account_id, scopes=("read_only",), name="fresh reader")
    revoked = await create_token(settings, account_id=browser.account_id, scopes=("read_only",), name="old laptop")
    await adb.execute("UPDATE api_tokens SET revoked_at = now() WHERE name = 'old laptop'")
    await browser.login()
    running = await scalar(
        adb, "SELECT count(*) FROM runs WHERE account_id = %s AND status IN (2, 3) AND takes_slot", browser.account_id
    )
    page = (await browser.http.get("/ui/settings")).text
    assert f'<strong id="slots">{running} of 2</strong>' in page and running == 1
    tokens = _section(page, 'id="tokens"')
    names = re.findall(r"<tr><td>([^<]+)</td><td><code>", tokens)
    assert "fresh reader" in names and "Airflow production trigger" in names and "old laptop" not in names
    assert browser.token not in page and reader not in page and revoked not in page
    for token in (browser.token, reader):
        assert token[:12] not in page  # no more of a token than its prefix
    rows = dict(re.findall(r"<tr><td>([^<]+)</td>.*?<td class=\"last-used\">(.*?)</td>", tokens, re.S))
    assert rows["Terraform account admin"] == "never" and "<time" in rows["Airflow production trigger"]
    hashes = await (await adb.execute("SELECT encode(token_hash, 'hex') FROM api_tokens")).fetchall()
    assert not any(h[0] in page for h in hashes)
    webhooks = _section(page, 'id="webhooks"')
    assert "Slack #data-alerts" in webhooks and "every job" in webhooks and ">2</td>" in webhooks
    assert all(w in webhooks for w in seeded.webhooks) and "not-a-secret-ciphertext" not in page

    as_reader = await browser.login(reader, next="/ui/settings")  # a read-only token sees it too
    assert as_reader.headers["location"] == "/ui/settings"
    assert (await browser.http.get("/ui/settings")).status_code == 200


async def test_using_a_token_marks_it_used_at_most_once_a_minute(
    browser: Browser, adb: AsyncDb, settings: Settings
) -> None:
    token = await create_token(settings, account_id=browser.account_id, scopes=("read_only",), name="api client")
    assert await scalar(adb, "SELECT last_used_at FROM api_tokens WHERE name = 'api client'") is None
    headers = {"Authorization": f"Token {token}"}
    answer = await browser.http.get(f"/api/v2/accounts/{browser.account_id}/jobs/", headers=headers)
    assert answer.status_code == 200
    first = await scalar(adb, "SELECT last_used_at FROM api_tokens WHERE name = 'api client'")
    assert first is not None
    await browser.http.get(f"/api/v2/accounts/{browser.account_id}/jobs/", headers=headers)
    assert await scalar(adb, "SELECT last_used_at FROM api_tokens WHERE name = 'api client'") == first
    await adb.execute("UPDATE api_tokens SET last_used_at = now() - interval '2 minutes' WHERE name = 'api client'")
    await browser.login()  # a page seen in a session counts as a use of its token
    await adb.execute("UPDATE api_tokens SET last_used_at = now() - interval '2 minutes'")
    await browser.http.get("/ui/settings")
    age = await scalar(
        adb, "SELECT now() - last_used_at FROM api_tokens WHERE account_id = %s AND name = ''", browser.account_id
    )
    assert age < timedelta(minutes=1)


async def test_a_run_queued_for_later_does_not_count_as_waiting_for_the_platform(
    browser: Browser, adb: AsyncDb
) -> None:
    job_id = await insert_job(adb, browser.account_id)
    (later,) = await insert_runs(adb, browser.account_id, job_id, 1, status=int(RunStatus.QUEUED))
    at = datetime.now(UTC) + timedelta(hours=3)
    await adb.execute("UPDATE runs SET scheduled_at = %s WHERE id = %s", (at, later))
    await browser.login()
    page = (await browser.http.get("/ui/on-time?window=1h")).text
    waiting = _section(page, 'id="waiting"')
    assert 'id="not-due"' in waiting and "the platform’s" not in waiting
    assert "due: waiting for the scheduler" not in waiting
    (due,) = await insert_runs(adb, browser.account_id, job_id, 1, status=int(RunStatus.QUEUED), delay=7)
    waiting = _section((await browser.http.get("/ui/on-time?window=1h")).text, 'id="waiting"')
    assert "due: waiting for the scheduler" in waiting and "the platform’s" in waiting and due
