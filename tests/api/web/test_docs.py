"""Hosted docs: a job's dbt docs site from its latest successful run that generated it, behind the login."""

from __future__ import annotations

from tests.api.conftest import AsyncDb, scalar
from tests.api.web.conftest import Browser

INDEX = (
    b'<html><script>var n = { manifest: "MANIFEST.JSON INLINE DATA", catalog: "CATALOG.JSON INLINE DATA" };</script>'
)


async def _job(db: AsyncDb, account_id: int, name: str = "docs") -> int:
    return int(
        await scalar(
            db,
            "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, %s, 'deploy', %s) RETURNING id",
            account_id,
            name,
            ["dbt build", "dbt docs generate"],
        )
    )


async def _run(browser: Browser, db: AsyncDb, job_id: int, status: int, files: dict[str, bytes]) -> int:
    """A run of the job (triggered over REST) that ended with ``status``, with these files of target/."""
    headers = {"Authorization": f"Token {browser.token}"}
    run = await browser.http.post(f"/api/v2/accounts/{browser.account_id}/jobs/{job_id}/run/", headers=headers)
    run_id = int(run.json()["data"]["id"])
    await db.execute("UPDATE runs SET status = %s, finished_at = now() WHERE id = %s", (status, run_id))
    for path, content in files.items():
        await db.execute(
            "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, %s, 1, %s)",
            (run_id, f"target/{path}", content),
        )
    return run_id


async def test_a_jobs_docs_are_served_from_its_latest_successful_run(browser: Browser, adb: AsyncDb) -> None:
    job_id = await _job(adb, browser.account_id)
    docs = f"/ui/jobs/{job_id}/docs/"
    assert (await browser.http.get(docs)).status_code == 303  # behind the login
    await browser.login()
    assert (await browser.http.get(docs)).status_code == 404  # no docs yet
    older = {"index.html": INDEX, "manifest.json": b'{"v": "old"}', "catalog.json": b'{"c": 1}'}
    await _run(browser, adb, job_id, 10, older)
    newer = {"index.html": INDEX, "manifest.json": b'{"v": "</script>new"}', "catalog.json": b'{"c": 2}'}
    await _run(browser, adb, job_id, 10, newer)
    await _run(browser, adb, job_id, 20, {"index.html": b"<html>failed run</html>"})
    page = await browser.http.get(docs)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"].startswith("sandbox allow-scripts")
    assert b'manifest: {"v": "<\\/script>new"}, catalog: {"c": 2}' in page.content  # inlined, opens at once
    manifest = await browser.http.get(f"{docs}manifest.json")
    assert manifest.json() == {"v": "</script>new"}
    assert (await browser.http.get(f"/ui/jobs/{job_id}/docs")).headers["location"] == docs
    assert (await browser.http.get(f"{docs}run_results.json")).status_code == 404


async def test_another_accounts_docs_answer_404(browser: Browser, adb: AsyncDb) -> None:
    other = int(
        await scalar(adb, "INSERT INTO accounts (name, run_slots, memory_mb) VALUES ('globex', 1, 512) RETURNING id")
    )
    job_id = await _job(adb, other)
    run_id = await _run(browser, adb, await _job(adb, browser.account_id), 10, {"index.html": INDEX})
    await adb.execute("UPDATE jobs SET account_id = %s WHERE id = %s", (other, job_id))
    await adb.execute("UPDATE runs SET job_id = %s, account_id = %s WHERE id = %s", (job_id, other, run_id))
    await browser.login()
    assert (await browser.http.get(f"/ui/jobs/{job_id}/docs/")).status_code == 404


async def test_a_job_links_its_docs_only_once_a_run_made_them_and_the_run_page_links_its_own(
    browser: Browser, adb: AsyncDb
) -> None:
    job_id = await _job(adb, browser.account_id)
    await adb.execute("UPDATE jobs SET generate_docs = true WHERE id = %s", (job_id,))
    await browser.login()
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert 'id="docs"' not in page and f"/ui/jobs/{job_id}/docs/" not in page  # no link to a 404
    assert 'id="no-docs">No docs yet' in page

    made = await _run(browser, adb, job_id, 10, {"index.html": INDEX, "manifest.json": b'{"v": 1}'})
    later = await _run(browser, adb, job_id, 20, {})
    page = (await browser.http.get(f"/ui/jobs/{job_id}")).text
    assert f'<a href="/ui/jobs/{job_id}/docs/" id="docs">' in page and f'href="/ui/runs/{made}">run #{made}</a>' in page
    assert (await browser.http.get(f"/ui/jobs/{job_id}/docs/")).status_code == 200

    run_page = (await browser.http.get(f"/ui/runs/{made}")).text
    assert f'<a href="/ui/runs/{made}/docs/" id="docs">' in run_page and 'id="hosted-docs"' in run_page
    site = await browser.http.get(f"/ui/runs/{made}/docs/")
    assert site.status_code == 200 and b'manifest: {"v": 1}' in site.content
    assert site.headers["content-security-policy"].startswith("sandbox allow-scripts")
    other = (await browser.http.get(f"/ui/runs/{later}")).text
    assert f"/ui/runs/{later}/docs/" not in other and f'href="/ui/jobs/{job_id}/docs/" id="job-docs"' in other
    assert (await browser.http.get(f"/ui/runs/{later}/docs/")).status_code == 404
