"""The web pages in-process over HTTP: login and logout, CSRF, token scopes, other accounts' 404,
keyset pages of runs, the live log stream, artifacts, run now, and the on-time view."""

from __future__ import annotations

import json
import re

from api.admin import create_account, create_token
from api.process import RunningApi
from api.web.session import csrf_for
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser
from tests.support.web_rows import RUN_RESULTS, insert_job, insert_runs, insert_steps


async def test_pages_need_a_login_and_a_bad_token_is_refused(browser: Browser) -> None:
    root = await browser.http.get("/")  # the bare address leads to the pages
    assert (root.status_code, root.headers["location"]) == (307, "/ui/")
    response = await browser.http.get("/ui/runs?status=queued")
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/login?next=%2Fui%2Fruns%3Fstatus%3Dqueued"
    refused = await browser.login("rp_not-a-token")
    assert refused.status_code == 401 and "Unknown, revoked or expired token" in refused.text
    assert "runplane_session" not in refused.headers.get("set-cookie", "")
    assert (await browser.http.get("/ui/runs")).status_code == 303


async def test_login_sets_an_http_only_cookie_and_logout_needs_csrf(browser: Browser) -> None:
    response = await browser.login()
    assert response.status_code == 303 and response.headers["location"] == "/ui/runs"
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and "path=/ui" in cookie
    assert (await browser.http.get("/ui/runs")).status_code == 200
    forged = await browser.http.post("/ui/logout", data={"csrf_token": "0" * 64})
    assert forged.status_code == 403
    assert (await browser.http.get("/ui/runs")).status_code == 200
    out = await browser.post("/ui/logout")
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert (await browser.http.get("/ui/runs")).status_code == 303


async def test_a_login_not_from_the_login_form_is_refused(browser: Browser) -> None:
    """Another site cannot log this browser into an account of its choosing (login CSRF)."""
    forged = await browser.http.post("/ui/login", data={"token": browser.token, "next": "/ui/runs"})
    assert forged.status_code == 403 and "did not come from runplane" in forged.text
    form = await browser.http.get("/ui/login")
    assert "samesite=strict" in form.headers["set-cookie"].lower()
    stale = await browser.http.post("/ui/login", data={"token": browser.token, "csrf_token": "0" * 43})
    assert stale.status_code == 403
    assert (await browser.http.get("/ui/runs")).status_code == 303  # not logged in by either
    assert (await browser.login()).status_code == 303
    assert (await browser.http.get("/ui/runs")).status_code == 200


async def test_login_never_redirects_off_the_site(browser: Browser) -> None:
    for target in ("https://evil.example/", "//evil.example/ui/", "/api/v2/accounts/"):
        response = await browser.login(next=target)
        assert response.headers["location"] == "/ui/runs"


async def test_a_revoked_token_ends_its_session(browser: Browser, settings: Settings, adb: AsyncDb) -> None:
    token = await create_token(settings, account_id=browser.account_id, scopes=("read_only",))
    await browser.login(token)
    assert (await browser.http.get("/ui/jobs")).status_code == 200
    await adb.execute("UPDATE api_tokens SET revoked_at = now() WHERE account_id = %s AND scopes = '{read_only}'",
                      (browser.account_id,))  # fmt: skip
    assert (await browser.http.get("/ui/jobs")).status_code == 303


async def test_another_accounts_run_and_job_answer_404(
    browser: Browser, api: RunningApi, settings: Settings, adb: AsyncDb
) -> None:
    other_id, _ = await create_account(settings, name="globex", run_slots=1, memory_mb=512)
    other_job = await insert_job(adb, other_id)
    (other_run,) = await insert_runs(adb, other_id, other_job, 1, status=3)
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/manifest.json', 0, 'x')",
        (other_run,),
    )
    await browser.login()
    for path in (
        f"/ui/runs/{other_run}",
        f"/ui/runs/{other_run}/logs",
        f"/ui/runs/{other_run}/artifacts/1/target/manifest.json",
        f"/ui/jobs/{other_job}",
        "/ui/runs/999999",
    ):
        response = await browser.http.get(path)
        assert response.status_code == 404, path
    for path in (f"/ui/runs/{other_run}/cancel", f"/ui/runs/{other_run}/rerun", f"/ui/jobs/{other_job}/run"):
        assert (await browser.post(path)).status_code == 404, path
    assert await scalar(adb, "SELECT count(*) FROM runs") == 1
    assert await scalar(adb, "SELECT cancel_requested_at FROM runs WHERE id = %s", other_run) is None
    mine = (await browser.http.get(f"/ui/runs?job={other_job}")).text
    assert f"#{other_run}<" not in mine


async def test_cancel_needs_the_forms_csrf_value_and_a_job_admin_token(
    browser: Browser, settings: Settings, adb: AsyncDb
) -> None:
    job_id = await insert_job(adb, browser.account_id)
    (run_id,) = await insert_runs(adb, browser.account_id, job_id, 1, status=1)
    await browser.login()
    page = (await browser.http.get(f"/ui/runs/{run_id}")).text
    assert f'value="{browser.csrf}"' in page and 'id="cancel"' in page
    for form in (
        {},
        {"csrf_token": "nope"},
        {"csrf_token": csrf_for("another-session")},
        {"csrf_token": csrf_for(browser.token)},
    ):
        response = await browser.http.post(f"/ui/runs/{run_id}/cancel", data=form)
        assert response.status_code == 403
    assert await scalar(adb, "SELECT status FROM runs WHERE id = %s", run_id) == 1

    reader = await create_token(settings, account_id=browser.account_id, scopes=("read_only",))
    await browser.login(reader)
    page = (await browser.http.get(f"/ui/runs/{run_id}")).text
    assert "read only" in page and 'id="cancel"' not in page and 'id="rerun"' not in page
    response = await browser.http.post(f"/ui/runs/{run_id}/cancel", data={"csrf_token": browser.csrf})
    assert response.status_code == 403 and "do not allow" in response.text
    assert await scalar(adb, "SELECT status FROM runs WHERE id = %s", run_id) == 1

    out = await browser.http.post("/ui/logout", data={"csrf_token": browser.csrf})
    assert out.status_code == 303  # a read-only session can still log out
    await browser.login()
    response = await browser.post(f"/ui/runs/{run_id}/cancel")
    assert response.status_code == 303 and response.headers["location"] == f"/ui/runs/{run_id}"
    assert await scalar(adb, "SELECT status FROM runs WHERE id = %s", run_id) == 30
    finished = await browser.post(f"/ui/runs/{run_id}/cancel")
    assert finished.status_code == 409 and "already finished" in finished.text


async def test_runs_come_in_keyset_pages_of_50_newest_first(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id)
    ids = await insert_runs(adb, browser.account_id, job_id, 120)
    await browser.login()
    seen: list[int] = []
    url: str | None = "/ui/runs"
    pages = 0
    while url:
        page = (await browser.http.get(url)).text
        seen += [int(x) for x in re.findall(r'<a href="/ui/runs/(\d+)">#', page)]
        older = re.search(r'<a href="([^"]+)" id="older">', page)
        url = older.group(1).replace("&amp;", "&") if older else None
        pages += 1
    assert pages == 3
    assert seen == sorted(ids, reverse=True)


async def test_filters_by_status_cause_job_and_time(browser: Browser, adb: AsyncDb) -> None:
    job_a = await insert_job(adb, browser.account_id, "a")
    job_b = await insert_job(adb, browser.account_id, "b")
    done = await insert_runs(adb, browser.account_id, job_a, 3)
    queued = await insert_runs(adb, browser.account_id, job_b, 2, status=1)
    await adb.execute("UPDATE runs SET waiting_reason = 'no_run_slot' WHERE status = 1")
    await browser.login()

    def ids(page: str) -> set[int]:
        return {int(x) for x in re.findall(r'<a href="/ui/runs/(\d+)">#', page)}

    page = (await browser.http.get("/ui/runs?status=queued")).text
    assert ids(page) == set(queued) and "waiting for a free run slot" in page
    assert ids((await browser.http.get(f"/ui/runs?job={job_a}")).text) == set(done)
    assert ids((await browser.http.get("/ui/runs?cause=api")).text) == set()
    assert ids((await browser.http.get("/ui/runs?cause=schedule")).text) == set(done + queued)
    assert ids((await browser.http.get("/ui/runs?since=2000-01-01T00:00&until=2001-01-01T00:00")).text) == set()
    bad = await browser.http.get("/ui/runs?status=late")
    assert bad.status_code == 400 and "is not one of" in bad.text


async def test_the_runs_page_query_reads_an_index_in_order(adb: AsyncDb) -> None:
    """Each filter's plan walks an index in id order, newest first: no sort of the account's runs."""
    from api.store import QUERIES

    accounts = [
        await scalar(adb, "INSERT INTO accounts (name, run_slots) VALUES ('a', 2) RETURNING id") for _ in range(20)
    ]
    for other in accounts[1:]:  # neighbours with more history than the account looked at
        await insert_runs(adb, other, await insert_job(adb, other), 200)
    account_id = accounts[0]
    jobs = [await insert_job(adb, account_id, f"job {i}") for i in range(10)]
    for job_id in jobs:  # enough that walking the account's runs in id order beats sorting an environment's
        await insert_runs(adb, account_id, job_id, 400)
    await insert_runs(adb, account_id, jobs[0], 5, status=int(RunStatus.ERROR), delay=6)
    project = await scalar(
        adb, "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'p', 'https://x.test/p.git')"
        " RETURNING id", account_id,
    )  # fmt: skip
    environment = await scalar(
        adb, "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
        " connection, schema_name) VALUES (%s, %s, 'prod', 'deployment', '1.10', 'postgres', '{}', 's') RETURNING id",
        account_id, project,
    )  # fmt: skip
    await adb.execute("UPDATE jobs SET environment_id = %s WHERE id = ANY(%s)", (environment, jobs[:5]))
    await adb.execute("ANALYZE runs")
    await adb.execute("ANALYZE jobs")
    await adb.execute("ANALYZE environments")
    await adb.execute("SET enable_seqscan = off")
    base = {"account_id": account_id, "job_id": None, "status": None, "trigger": None, "since": None, "until": None}
    base |= {"delay": None, "waiting": None, "environment_id": None, "project_id": None}
    after = {"after_id": 2**62, "limit": 51}
    for extra, indexes in (
        # On this small history walking all runs by id is as cheap; either walk is in id order.
        ({}, ("runs_account_idx", "runs_pkey")),
        ({"status": int(RunStatus.ERROR)}, ("runs_account_ended_idx",)),
        ({"job_id": jobs[3]}, ("runs_job_idx",)),
        ({"trigger": "api"}, ("runs_account_trigger_idx",)),
        # An environment's or a project's runs: the account's runs in id order, their job's looked up.
        ({"environment_id": environment}, ("runs_account_idx", "runs_pkey")),
        ({"project_id": project}, ("runs_account_idx", "runs_pkey")),
    ):
        cur = await adb.execute("EXPLAIN " + QUERIES["runs_page"], {**base, **extra, **after}, prepare=False)
        plan = "\n".join(row[0] for row in await cur.fetchall())
        assert any(f"using {index} on runs" in plan for index in indexes) and "Sort" not in plan, plan


async def test_the_log_stream_sends_every_chunk_then_ends_with_the_run(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id)
    (run_id,) = await insert_runs(adb, browser.account_id, job_id, 1, status=3)
    await adb.execute(
        "INSERT INTO run_log_chunks (run_id, seq, step_index, text) VALUES (%s, 1, 0, 'one\n'), (%s, 2, 1, 'two\n')",
        (run_id, run_id),
    )
    await browser.login()
    events: list[tuple[str, str]] = []
    async with browser.http.stream("GET", f"/ui/runs/{run_id}/logs", headers={"Last-Event-ID": "1"}) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        event = ""
        async for line in stream.aiter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((event, line.removeprefix("data: ")))
                if event == "log":  # the run ends only once the follower has what was there
                    await adb.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (run_id,))
                if event == "end":
                    break
    assert events == [
        ("status", '{"status": "running"}'),
        ("log", json.dumps({"seq": 2, "step": 1, "text": "two\n"})),
        ("end", '{"status": "success"}'),
    ]


async def test_artifacts_download_as_attachments(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id)
    (run_id,) = await insert_runs(adb, browser.account_id, job_id, 1)
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/manifest.json', 0, %s)",
        (run_id, b'{"nodes": {}}'),
    )
    await browser.login()
    page = (await browser.http.get(f"/ui/runs/{run_id}")).text
    link = re.search(r'href="(/ui/runs/\d+/artifacts/[^"]+)" download', page)
    assert link is not None
    response = await browser.http.get(link.group(1))
    assert response.status_code == 200 and response.content == b'{"nodes": {}}'
    assert response.headers["content-disposition"] == "attachment; filename*=UTF-8''manifest.json"
    assert (await browser.http.get(f"/ui/runs/{run_id}/artifacts/2/target/manifest.json")).status_code == 404


async def test_a_job_shows_its_schedule_and_runs_now_with_overrides(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id, cron="30 6 * * 1-5", timezone="Europe/Paris")
    await browser.login()
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert "At 06:30, Monday through Friday" in page
    fires = re.findall(r"<tr><td>(\w{3} \d{4}-\d\d-\d\d 06:30 CES?T)</td>", page)
    assert len(fires) == 5 and not {f[:3] for f in fires} & {"Sat", "Sun"}
    assert 'id="pause-button">Pause<' in page
    paused = await browser.post(f"/ui/jobs/{job_id}/pause")
    assert paused.status_code == 303 and paused.headers["location"] == f"/ui/jobs/{job_id}"
    assert await scalar(adb, "SELECT paused_at IS NOT NULL FROM jobs WHERE id = %s", job_id)
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert 'id="paused">paused<' in page and 'id="pause-button">Unpause<' in page
    assert (await browser.post(f"/ui/jobs/{job_id}/unpause")).status_code == 303
    assert not await scalar(adb, "SELECT paused_at IS NOT NULL FROM jobs WHERE id = %s", job_id)
    response = await browser.post(
        f"/ui/jobs/{job_id}/run", cause="checking a fix", steps="dbt build -s orders\n\n", threads="3", git_branch="fix"
    )
    assert response.status_code == 303
    run_id = int(response.headers["location"].rsplit("/", 1)[1])
    overrides = await scalar(adb, "SELECT overrides FROM runs WHERE id = %s", run_id)
    assert overrides == {"steps": ["dbt build -s orders"], "threads": 3, "git_branch": "fix"}
    assert (
        await scalar(adb, "SELECT trigger || ':' || cause FROM runs WHERE id = %s", run_id) == "manual:checking a fix"
    )
    refused = await browser.post(f"/ui/jobs/{job_id}/run", threads="1000")
    assert refused.status_code == 400 and 'id="e-threads">must be between' in refused.text
    rerun = await browser.post(f"/ui/runs/{run_id}/rerun")
    new_id = int(rerun.headers["location"].rsplit("/", 1)[1])
    assert await scalar(adb, "SELECT parent_run_id FROM runs WHERE id = %s", new_id) == run_id
    assert await scalar(adb, "SELECT overrides FROM runs WHERE id = %s", new_id) == overrides
    assert f'href="/ui/runs/{run_id}" id="parent-run"' in (await browser.http.get(f"/ui/runs/{new_id}")).text


async def test_on_time_splits_run_delay_and_counts_what_waits(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id)
    await insert_runs(adb, browser.account_id, job_id, 6, delay=5)
    await insert_runs(adb, browser.account_id, job_id, 3, delay=40)
    await insert_runs(adb, browser.account_id, job_id, 1, delay=300)
    await insert_runs(adb, browser.account_id, job_id, 2, status=1)
    await adb.execute("UPDATE runs SET waiting_reason = 'job_already_running' WHERE status = 1")
    await browser.login()
    page = (await browser.http.get("/ui/on-time?window=1h")).text
    assert '<strong id="on-time-ratio">90.0 %</strong> of 10 started runs' in page
    assert re.search(r'id="runs-within_25s"[^>]*>6</a></td>\s*<td class="num">60.0 %', page)
    assert re.search(r'id="runs-within_60s"[^>]*>3</a>', page) and re.search(r'id="runs-late"[^>]*>1</a>', page)
    assert re.search(r"waiting for this job&#39;s running run \(serial execution\)</td>.*?>2</a>", page, re.S)
    assert (await browser.http.get("/ui/on-time?window=2y")).status_code == 400


async def test_a_failed_dbt_run_offers_rerun_from_its_failure(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id, steps=["dbt seed", "dbt build"])
    (run_id,) = await insert_runs(adb, browser.account_id, job_id, 1, status=int(RunStatus.ERROR))
    await insert_steps(adb, run_id, ("dbt seed", 10, True), ("dbt build", 20, True))
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/run_results.json', 1, '{}')",
        (run_id,),
    )
    await browser.login()
    page = (await browser.http.get(f"/ui/runs/{run_id}")).text
    assert f'action="/ui/runs/{run_id}/rerun-from-failure"' in page and 'id="rerun-from-failure"' in page
    response = await browser.post(f"/ui/runs/{run_id}/rerun-from-failure")
    assert response.status_code == 303
    new_id = int(response.headers["location"].rsplit("/", 1)[1])
    row = await (
        await adb.execute("SELECT trigger, parent_run_id, overrides FROM runs WHERE id = %s", (new_id,))
    ).fetchone()
    assert row is not None and row[0] == "retry" and row[1] == run_id
    assert row[2]["steps"] == ["dbt retry --state .runplane/retry-state"] and row[2]["resume"] is True

    # A run that succeeded has nothing to resume: only "Rerun" (every step again) is offered.
    (done_id,) = await insert_runs(adb, browser.account_id, job_id, 1)
    page = (await browser.http.get(f"/ui/runs/{done_id}")).text
    assert 'id="rerun"' in page and 'id="rerun-from-failure"' not in page


async def test_run_now_on_a_ci_job_asks_for_its_pull_request(browser: Browser, adb: AsyncDb) -> None:
    job_id = int(
        await scalar(
            adb,
            "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, 'checks', 'ci', '{echo}') RETURNING id",
            browser.account_id,
        )
    )
    await browser.login()
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert 'name="pull_request_number"' in page
    response = await browser.post(f"/ui/jobs/{job_id}/run", pull_request_number="42", cause="checking PR 42")
    assert response.status_code == 303, response.text
    run_id = int(response.headers["location"].rsplit("/", 1)[1])
    assert await scalar(adb, "SELECT pull_request_number FROM runs WHERE id = %s", run_id) == 42
    missing = await browser.post(f"/ui/jobs/{job_id}/run")
    assert missing.status_code == 400 and "pull request" in missing.text


async def test_the_runs_filter_with_every_field_left_empty_lists_all_runs(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id)
    ids = await insert_runs(adb, browser.account_id, job_id, 2)
    await browser.login()
    # What the filter form sends with "all jobs", "any" status and cause, and no times.
    response = await browser.http.get("/ui/runs?job=&status=&cause=&since=&until=")
    assert response.status_code == 200, response.text
    assert {int(x) for x in re.findall(r'<a href="/ui/runs/(\d+)">#', response.text)} == set(ids)


async def test_steps_that_never_ran_show_as_skipped_in_a_finished_run(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id, steps=["dbt seed", "dbt build", "dbt test"])
    (run_id,) = await insert_runs(adb, browser.account_id, job_id, 1, status=int(RunStatus.ERROR))
    await insert_steps(adb, run_id, ("dbt seed", 20, True), ("dbt build", 1, False), ("dbt test", 1, False))
    await adb.execute("UPDATE run_steps SET skipped = true WHERE run_id = %s AND step_index = 1", (run_id,))
    await browser.login()
    page = (await browser.http.get(f"/ui/runs/{run_id}")).text
    steps = page[page.index('id="steps"') : page.index("</table>", page.index('id="steps"'))]
    assert steps.count(">skipped</span>") == 2 and ">queued</span>" not in steps


async def test_a_paused_job_shows_as_paused_without_next_runs(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id, cron="0 * * * *")
    await adb.execute("UPDATE jobs SET paused_at = now() WHERE id = %s", (job_id,))
    await browser.login()
    jobs = (await browser.http.get("/ui/jobs")).text
    row = re.search(rf'<tr>\s*<td><a href="/ui/jobs/{job_id}">.*?</tr>', jobs, re.S)
    assert row is not None and ">paused<" in row.group(0) and "active" not in row.group(0)
    assert "UTC" not in row.group(0).split("</td>")[3]  # no next run time
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert 'id="next-fires"' not in page and "Every hour" in page


async def test_the_header_names_the_account(browser: Browser) -> None:
    await browser.login()
    page = (await browser.http.get("/ui/runs")).text
    assert 'id="account-name">acme<' in page and f"account {browser.account_id}" not in page


async def test_times_show_in_the_viewers_time_zone_with_utc_at_hand(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id)
    (run_id,) = await insert_runs(adb, browser.account_id, job_id, 1)
    await adb.execute("UPDATE runs SET scheduled_at = '2026-01-15 12:00:00+00' WHERE id = %s", (run_id,))
    await browser.login()
    await browser.http.get("/ui/time-zone", params={"zone": "Asia/Tokyo"})  # what the page's script asks
    page = (await browser.http.get(f"/ui/runs/{run_id}")).text
    assert (
        '<time datetime="2026-01-15T12:00:00Z" title="2026-01-15 12:00:00 UTC">2026-01-15 21:00:00 JST</time>' in page
    )
    switched = await browser.http.get("/ui/time-zone", params={"zone": "UTC", "next": f"/ui/runs/{run_id}"})
    assert switched.status_code == 303 and switched.headers["location"] == f"/ui/runs/{run_id}"
    page = (await browser.http.get(f"/ui/runs/{run_id}")).text
    assert ">2026-01-15 12:00:00 UTC</time>" in page
    await browser.http.get("/ui/time-zone", params={"zone": "Not/AZone"})  # an unknown zone shows UTC
    page = (await browser.http.get(f"/ui/runs/{run_id}")).text
    assert ">2026-01-15 12:00:00 UTC</time>" in page and "times in UTC" in page


async def test_error_pages_keep_the_menu_and_speak_in_words(browser: Browser, adb: AsyncDb) -> None:
    await browser.login()
    bad = await browser.http.get("/ui/runs/abc")
    assert bad.status_code == 400
    assert '<div class="error" id="problem" role="alert">The run id in the address must be a whole number.</div>' in (
        bad.text
    )
    assert 'href="/ui/jobs"' in bad.text and 'id="account-name">acme<' in bad.text
    missing = await browser.http.get("/ui/jobs/999999")
    assert missing.status_code == 404 and 'id="what-now">It is not in this account' in missing.text
    job_id = await insert_job(adb, browser.account_id)
    refused = await browser.post(f"/ui/jobs/{job_id}/run", threads="1000")
    assert refused.status_code == 400
    assert 'id="e-threads">must be between 1 and 64 (got 1000)</p>' in refused.text  # at its field
    assert 'name="threads" type="text" value="1000"' in refused.text  # with what was typed


async def test_on_time_links_its_buckets_and_reasons_to_their_runs_and_tells_whose_wait(
    browser: Browser, adb: AsyncDb
) -> None:
    job_id = await insert_job(adb, browser.account_id)
    on_time = await insert_runs(adb, browser.account_id, job_id, 2, delay=5)
    (platform_late,) = await insert_runs(adb, browser.account_id, job_id, 1, delay=300)
    (own_late,) = await insert_runs(adb, browser.account_id, job_id, 1, delay=400)
    # This one waited for a run slot until a second before it started: the account's own limit.
    await adb.execute("UPDATE runs SET dispatched_at = started_at - interval '1 second' WHERE id = %s", (own_late,))
    queued = await insert_runs(adb, browser.account_id, job_id, 2, status=1)
    await adb.execute("UPDATE runs SET waiting_reason = 'no_run_slot' WHERE id = %s", (queued[0],))
    await browser.login()
    page = (await browser.http.get("/ui/on-time?window=1h")).text
    assert 'id="refresh" data-seconds="30"' in page and 'id="refresh-toggle"' in page

    def linked(key: str) -> tuple[int, str]:
        found = re.search(rf'<a href="([^"]+)" id="{key}"[^>]*>(\d+)</a>', page)
        assert found is not None, key
        return int(found.group(2)), found.group(1).replace("&amp;", "&")

    def ids(url: str) -> set[int]:
        return {int(x) for x in re.findall(r'<a href="/ui/runs/(\d+)">#', url)}

    for key, expected in (
        ("runs-within_25s", set(on_time)),
        ("runs-late", {platform_late, own_late}),
        ("runs-late_own", {own_late}),
        ("runs-late_platform", {platform_late}),
        ("waiting-no_run_slot", {queued[0]}),
    ):
        count, url = linked(key)
        listed = (await browser.http.get(url)).text
        assert count == len(expected) and ids(listed) == expected, (key, url)
    assert "the account’s own" in page and "the platform’s" in page


async def test_a_dbt_step_shows_its_models_and_json_artifacts_open_pretty_printed(
    browser: Browser, adb: AsyncDb
) -> None:
    job_id = await insert_job(adb, browser.account_id, steps=["dbt build"])
    (run_id,) = await insert_runs(adb, browser.account_id, job_id, 1, status=int(RunStatus.ERROR))
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/run_results.json', 0, %s)",
        (run_id, json.dumps(RUN_RESULTS).encode()),
    )
    await browser.login()
    page = (await browser.http.get(f"/ui/runs/{run_id}")).text
    table = page[page.index('id="models-1"') : page.index("</table>", page.index('id="models-1"'))]
    rows = re.findall(r"<tr><td><code>([^<]+)</code></td><td><span class=\"pill s-(\w+)\">(\w+)</span></td>", table)
    # The failed node first, as in the run's summary.
    assert rows == [("test.shop.not_null_orders_id", "error", "fail"), ("model.shop.orders", "success", "success")]
    assert "1.50 s" in table and ">12</td>" in table and "Got 3 results" in table

    view = re.search(r'href="(/ui/runs/\d+/artifacts/1/target/run_results.json\?view=1)"', page)
    assert view is not None
    shown = await browser.http.get(view.group(1))
    assert shown.status_code == 200 and shown.headers["content-type"].startswith("text/html")
    assert "{\n  &#34;results&#34;: [\n    {\n      &#34;unique_id&#34;: &#34;model.shop.orders&#34;" in shown.text
    assert 'id="download"' in shown.text


async def test_a_job_charts_the_duration_of_its_runs(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id)
    ids = await insert_runs(adb, browser.account_id, job_id, 3)
    await adb.execute("UPDATE runs SET finished_at = started_at + interval '90 seconds' WHERE id = %s", (ids[-1],))
    await browser.login()
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    chart = page[page.index('<svg id="duration-chart"') : page.index("</svg>")]
    bars = re.findall(r'<a href="/ui/runs/(\d+)"><rect class="bar-success" [^>]* height="([\d.]+)">', chart)
    assert [int(run) for run, _ in bars] == ids  # oldest first
    assert float(bars[-1][1]) == 120.0 and float(bars[0][1]) == 40.0  # 90 s is the tallest; 30 s a third
    assert "longest 1 m 30 s" in chart


async def test_search_finds_jobs_and_runs_by_id_name_and_cause(
    browser: Browser, settings: Settings, adb: AsyncDb
) -> None:
    nightly = await insert_job(adb, browser.account_id, "Nightly orders")
    other = await insert_job(adb, browser.account_id, "hourly_100%")
    (run_id,) = await insert_runs(adb, browser.account_id, nightly, 1)
    await adb.execute("UPDATE runs SET cause = 'backfill for finance' WHERE id = %s", (run_id,))
    their_account, _ = await create_account(settings, name="globex", run_slots=1, memory_mb=512)
    await insert_job(adb, their_account, "nightly orders of globex")
    await browser.login()

    async def found(q: str) -> tuple[set[int], set[int]]:
        page = (await browser.http.get("/ui/search", params={"q": q})).text
        jobs = page[page.index('id="found-jobs"') : page.index('id="found-runs"')]
        runs = page[page.index('id="found-runs"') :]
        return (
            {int(x) for x in re.findall(r'<a href="/ui/jobs/(\d+)">[^<]+</a> <span', jobs)},
            {int(x) for x in re.findall(r'<a href="/ui/runs/(\d+)">#', runs)},
        )

    assert await found("NIGHTLY") == ({nightly}, {run_id})
    assert await found("finance") == (set(), {run_id})
    assert await found(f"#{run_id}") == ({nightly} if nightly == run_id else set(), {run_id})
    assert await found(f"#{other}") == ({other}, set())
    assert await found("100%") == ({other}, set())
    assert await found("0%") == ({other}, set())  # % is a character, not a wildcard
    assert await found("globex") == (set(), set())


async def test_a_job_that_generates_docs_links_to_them(browser: Browser, adb: AsyncDb) -> None:
    documented = await insert_job(adb, browser.account_id, "documented", generate_docs=True)
    plain = await insert_job(adb, browser.account_id, "plain")
    (run_id,) = await insert_runs(adb, browser.account_id, documented, 1)
    await browser.login()
    for path in (f"/ui/jobs/{documented}", f"/ui/runs/{run_id}"):  # the run kept no docs: no link to a 404
        assert 'id="docs"' not in (await browser.http.get(path)).text
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/index.html', 0, '<html>')",
        (run_id,),
    )
    job_page = (await browser.http.get(f"/ui/jobs/{documented}")).text
    assert f'<a href="/ui/jobs/{documented}/docs/" id="docs">' in job_page
    assert f'<a href="/ui/runs/{run_id}/docs/" id="docs">' in (await browser.http.get(f"/ui/runs/{run_id}")).text
    assert 'id="docs"' not in (await browser.http.get(f"/ui/jobs/{plain}")).text


async def test_a_dbt_runs_setup_steps_are_listed_by_name_before_its_commands(browser: Browser, adb: AsyncDb) -> None:
    job_id = await insert_job(adb, browser.account_id, steps=["dbt build"])
    (run_id,) = await insert_runs(adb, browser.account_id, job_id, 1, status=int(RunStatus.ERROR))
    setup = ("Clone git repository", "Create profile from connection postgres", "Invoke dbt deps")
    await insert_steps(adb, run_id, *[(name, 10, True) for name in setup], ("dbt build", 20, True))
    await adb.execute("UPDATE run_steps SET setup = step_index < 3 WHERE run_id = %s", (run_id,))
    await browser.login()
    page = (await browser.http.get(f"/ui/runs/{run_id}")).text
    steps = page[page.index('id="steps"') : page.index("</table>", page.index('id="steps"'))]
    shown = re.findall(r'<tr><td>(\d+)</td><td class="wrap">(.*?)</td>', steps)
    assert shown == [
        ("1", "Clone git repository"),
        ("2", "Create profile from connection postgres"),
        ("3", "Invoke dbt deps"),
        ("4", "<code>dbt build</code>"),
    ]
