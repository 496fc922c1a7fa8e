"""``python -m bench.web_pages``: the web pages of one ``runplane api`` process over a million runs,
and how long a step's log line takes to reach a browser following the run.

- server time: the runs page (first page; a page deep in the history through its keyset cursor;
  filtered by status, job, cause and time), a run's page, the on-time page; each request timed by
  a client on the same machine over a kept-alive connection, p50/p99;
- EXPLAIN ANALYZE of the runs page's query with and without filters (the index it walks, its time);
- log line to browser: ``runplane up`` runs a job whose step prints 200 lines, each carrying the
  wall-clock time it was printed; headless Chromium (Debian's, driven by Playwright) follows the
  run's page and records when each line appears in the page; p50/p99 of the difference.

The million runs are bulk-inserted with generate_series into a private database. Prints JSON, then a
table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from api.admin import create_account
from api.store import QUERIES
from bench.sandbox import child_env, temporary_database, unique_name, wait_until
from bench.services import RunplaneServices
from runplane.basics.settings import Settings
from tests.support.ports import free_port

CHROMIUM = "/usr/bin/chromium"
LINES = 200
LOG_STEP = (
    "python3 -u -c \"import time\nfor i in range({lines}):\n    print(f'line {{i}} at {{time.time():.6f}}')\n"
    '    time.sleep({pause})"'
)


def _percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _fill(url: str, runs: int, jobs: int) -> dict[str, Any]:
    """An account with ``jobs`` jobs and ``runs`` runs over the last ~58 days, a second account with a
    tenth of that, and one finished run with 3 steps, 200 log chunks and 3 artifacts."""
    settings = Settings(database_url=url)
    account_id, token = asyncio.run(create_account(settings, name="bench", run_slots=10, memory_mb=512))
    other_id, _ = asyncio.run(create_account(settings, name="other", run_slots=10, memory_mb=512))
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for account, count in ((account_id, runs), (other_id, runs // 10)):
            conn.execute(
                "INSERT INTO jobs (account_id, name, job_type, steps, cron, timezone)"
                " SELECT %s, 'job-' || g, 'deploy', ARRAY['dbt build'], '*/5 * * * *', 'Europe/Berlin'"
                " FROM generate_series(1, %s) g",
                (account, jobs),
            )
            # Oldest first (ids follow time); one run in 5000 still queued, 1 in 50 manual, 1 in 20 errored.
            conn.execute(
                """
                INSERT INTO runs (account_id, job_id, job_type, status, trigger, cause, idempotency_key, takes_slot,
                                  scheduled_at, queued_at, dispatched_at, started_at, finished_at)
                SELECT %(account)s, j.first + g %% %(jobs)s, 'deploy',
                       CASE WHEN g > %(count)s - 5 THEN 1 WHEN g %% 20 = 0 THEN 20 ELSE 10 END,
                       CASE WHEN g %% 50 = 0 THEN 'manual' ELSE 'schedule' END, 'bench',
                       'bench-' || %(account)s || '-' || g, true,
                       t, t + interval '0.2 s',
                       CASE WHEN g > %(count)s - 5 THEN NULL ELSE t + interval '0.5 s' END,
                       CASE WHEN g > %(count)s - 5 THEN NULL ELSE t + make_interval(secs => 2 + g %% 90) END,
                       CASE WHEN g > %(count)s - 5 THEN NULL ELSE t + make_interval(secs => 120 + g %% 90) END
                  FROM (SELECT min(id) AS first FROM jobs WHERE account_id = %(account)s) j,
                       generate_series(1, %(count)s) g,
                       LATERAL (SELECT now() - make_interval(secs => (%(count)s - g) * 5) AS t) s
                """,
                {"account": account, "jobs": jobs, "count": count},
            )
        detail = conn.execute(
            "SELECT id FROM runs WHERE account_id = %s AND status = 10 ORDER BY id DESC LIMIT 1", (account_id,)
        ).fetchone()
        assert detail is not None
        run_id = int(detail[0])
        conn.execute(
            "INSERT INTO run_steps (run_id, step_index, command, status, started_at, finished_at)"
            " SELECT %s, i, 'dbt step ' || i, 10, now() - interval '1 minute', now() FROM generate_series(0, 2) i",
            (run_id,),
        )
        conn.execute(
            "INSERT INTO run_log_chunks (run_id, seq, step_index, text)"
            " SELECT %s, g, g %% 3, repeat('a log line of a dbt step ', 8) || E'\\n' FROM generate_series(1, 200) g",
            (run_id,),
        )
        conn.execute(
            "INSERT INTO artifacts (run_id, path, step_index, content)"
            " SELECT %s, p, 0, convert_to(repeat('x', 100000), 'UTF8')"
            " FROM unnest(ARRAY['target/manifest.json', 'target/run_results.json', 'target/catalog.json']) p",
            (run_id,),
        )
        conn.execute("VACUUM ANALYZE runs")
        job = conn.execute("SELECT min(id) FROM jobs WHERE account_id = %s", (account_id,)).fetchone()
        assert job is not None
    return {
        "account_id": account_id,
        "token": token,
        "run_id": run_id,
        "job_id": int(job[0]),
        "fill_seconds": round(time.perf_counter() - started, 1),
    }


async def _log_in(http: httpx.AsyncClient, token: str) -> httpx.Response:
    """The login form's post, with the CSRF value the form carries (and its cookie, kept by ``http``)."""
    form = (await http.get("/ui/login")).text
    value = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert value is not None, form
    return await http.post("/ui/login", data={"token": token, "csrf_token": value.group(1)})


async def _timings(base: str, token: str, paths: dict[str, str], count: int) -> dict[str, dict[str, float]]:
    async with httpx.AsyncClient(base_url=base, timeout=60, headers={"Authorization": f"Token {token}"}) as http:
        login = await _log_in(http, token)
        assert login.status_code == 303, login.text
        out = {}
        for name, path in paths.items():
            for _ in range(5):  # warm up
                (await http.get(path)).raise_for_status()
            times = []
            for _ in range(count):
                started = time.perf_counter()
                response = await http.get(path)
                times.append(time.perf_counter() - started)
                response.raise_for_status()
            out[name] = {
                "p50_ms": round(_percentile(times, 50) * 1000, 1),
                "p99_ms": round(_percentile(times, 99) * 1000, 1),
            }
    return out


async def _deep_cursor(base: str, token: str, pages: int) -> str:
    """The runs page ``pages`` pages into the history, reached by following "Older"."""
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        await _log_in(http, token)
        path = "/ui/runs"
        for _ in range(pages):
            page = (await http.get(path)).text
            older = re.search(r'<a href="([^"]+)" id="older">', page)
            assert older is not None
            path = older.group(1).replace("&amp;", "&")
        return path


def _plans(url: str, account_id: int, job_id: int) -> dict[str, dict[str, Any]]:
    base: dict[str, object] = {
        "account_id": account_id,
        "job_id": None,
        "status": None,
        "trigger": None,
        "since": None,
        "until": None,
        "delay": None,
        "waiting": None,
    }
    cases: dict[str, dict[str, object]] = {
        "no filter": {},
        "status queued": {"status": 1},
        "one job": {"job_id": job_id},
        "cause manual": {"trigger": "manual"},
        "cause api (none)": {"trigger": "api"},
    }
    out = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, extra in cases.items():
            params = {**base, **extra, "after_id": None, "limit": 51}
            rows = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES["runs_page"], params, prepare=False)
            explained = rows.fetchone()
            assert explained is not None
            plan = explained[0][0]
            indexes = sorted(set(re.findall(r'"Index Name": "([^"]+)"', json.dumps(plan))))
            out[name] = {"execution_ms": round(plan["Execution Time"], 2), "indexes": indexes}
    return out


def _server_figures(args: argparse.Namespace) -> dict[str, Any]:
    with temporary_database() as url, tempfile.TemporaryDirectory() as logs:
        filled = _fill(url, args.runs, args.jobs)
        rest_port = free_port()
        with RunplaneServices(
            url, Path(logs), RUNPLANE_API__PORT=str(free_port()), RUNPLANE_API__REST_PORT=str(rest_port),
            RUNPLANE_API__RUNNER_PORT=str(free_port()),
        ) as services:  # fmt: skip
            services.start("api", "api")
            base = f"http://127.0.0.1:{rest_port}"
            if not wait_until(lambda: _answers(base), 60):
                services.check_alive()
                raise RuntimeError("the API did not answer")
            token, job_id = filled["token"], filled["job_id"]
            deep = asyncio.run(_deep_cursor(base, token, args.deep_pages))
            paths = {
                "baseline: login form (a template, no query)": "/ui/login",
                "baseline: REST GET account (token check + one query)": f"/api/v2/accounts/{filled['account_id']}/",
                "runs: first page": "/ui/runs",
                f"runs: page {args.deep_pages + 1} (keyset)": deep,
                "runs: status queued": "/ui/runs?status=queued",
                "runs: one job": f"/ui/runs?job={job_id}",
                "runs: cause manual": "/ui/runs?cause=manual",
                "runs: cause api (no run has it)": "/ui/runs?cause=api",
                "runs: queued in one hour a week ago": "/ui/runs?since={}&until={}".format(*_hour_a_week_ago()),
                "run detail (3 steps, 200 log chunks, 3 artifacts)": f"/ui/runs/{filled['run_id']}",
                "on time: 24h": "/ui/on-time?window=24h",
                "on time: 7d": "/ui/on-time?window=7d",
            }
            timings = asyncio.run(_timings(base, token, paths, args.requests))
        plans = _plans(url, filled["account_id"], job_id)
    return {"runs": args.runs, "fill_seconds": filled["fill_seconds"], "pages": timings, "runs_page_plans": plans}


def _hour_a_week_ago() -> tuple[str, str]:
    start = time.time() - 7 * 86400
    return time.strftime("%Y-%m-%dT%H:%M", time.gmtime(start)), time.strftime(
        "%Y-%m-%dT%H:%M", time.gmtime(start + 3600)
    )


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/ui/login", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _log_latency(args: argparse.Namespace) -> dict[str, Any]:
    """Lines printed by a real step of a real run, seen by a real browser following its page."""
    from playwright.sync_api import sync_playwright

    with temporary_database() as url, tempfile.TemporaryDirectory() as tmp:
        rest_port = free_port()
        prefix = unique_name("rpbench")
        env = child_env(
            RUNPLANE_DATABASE_URL=url, RUNPLANE_BUS_PREFIX=prefix, RUNPLANE_REDIS_PREFIX=prefix,
            RUNPLANE_LOG_FORMAT="text", RUNPLANE_LOG_LEVEL="WARNING", RUNPLANE_API__PORT=str(free_port()),
            RUNPLANE_API__REST_PORT=str(rest_port), RUNPLANE_API__RUNNER_PORT=str(free_port()),
            RUNPLANE_RUNNER__API_ADDRESS="", RUNPLANE_METRICS_PORT=str(free_port()), RUNPLANE_DRAIN_SECONDS="5",
            HOME=tmp,
        )  # fmt: skip
        env["RUNPLANE_RUNNER__API_ADDRESS"] = f"127.0.0.1:{env['RUNPLANE_API__RUNNER_PORT']}"
        settings = Settings(database_url=url)
        account_id, token = asyncio.run(create_account(settings, name="bench", run_slots=2, memory_mb=512))
        step = LOG_STEP.format(lines=args.lines, pause=args.pause)
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, 'log lines', 'adhoc', %s)"
                " RETURNING id",
                (account_id, [step]),
            ).fetchone()
        assert row is not None
        job_id = int(row[0])
        log_path = Path(tmp) / "up.log"
        with log_path.open("w") as out:
            up = subprocess.Popen(
                [sys.executable, "-m", "runplane", "up", "--queuer-workers", "1", "--dispatchers", "1"],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        base = f"http://127.0.0.1:{rest_port}"
        try:
            if not wait_until(lambda: _answers(base), 90):
                raise RuntimeError(f"runplane up did not serve the pages:\n{log_path.read_text()[-3000:]}")
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                seen: list[tuple[float, str]] = []
                page.expose_function("__logText", lambda at, text: seen.append((at, text)))
                # Report when each piece of log text lands in the page (wall clock, as the step's lines).
                page.add_init_script(_OBSERVE_LOGS)
                page.goto(f"{base}/ui/login")
                page.fill("#token", token)
                page.click("#login")
                page.goto(f"{base}/ui/jobs/{job_id}")
                page.click("#run-now-button")
                page.wait_for_url(re.compile(r"/ui/runs/\d+$"))
                deadline = time.monotonic() + args.lines * args.pause + 120
                # The sync API hands the page's calls to __logText only while it waits on the page.
                while len(_line_times(seen)) < args.lines and time.monotonic() < deadline:
                    page.wait_for_timeout(100)
                browser.close()
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
    latencies = [arrived - printed for printed, arrived in _line_times(seen).values()]
    if len(latencies) < args.lines:
        raise RuntimeError(f"only {len(latencies)} of {args.lines} lines reached the page")
    return {
        "lines": len(latencies),
        "line_interval_s": args.pause,
        "p50_ms": round(_percentile(latencies, 50) * 1000, 1),
        "p99_ms": round(_percentile(latencies, 99) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1),
        "api_log_poll_interval_s": Settings().api.log_poll_interval,
    }


_OBSERVE_LOGS = """
document.addEventListener("DOMContentLoaded", () => {
    const logs = document.getElementById("logs");
    if (!logs) return;
    new MutationObserver((records) => {
        const now = Date.now() / 1000;
        for (const r of records) for (const n of r.addedNodes)
            if (n.nodeType === Node.TEXT_NODE) window.__logText(now, n.textContent);
    }).observe(logs, {childList: true, subtree: true});
});
"""


def _line_times(seen: list[tuple[float, str]]) -> dict[int, tuple[float, float]]:
    """(printed, on the page) of each line, on the page when its newline arrived; a page reloaded after
    the run ended shows the lines again, later, so the first time counts."""
    out: dict[int, tuple[float, float]] = {}
    pending = ""
    for arrived, text in seen:
        *lines, pending = (pending + text).split("\n")
        for line in lines:
            found = re.search(r"line (\d+) at (\d+\.\d+)", line)
            if found and int(found.group(1)) not in out:
                out[int(found.group(1))] = (float(found.group(2)), arrived)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.web_pages", description=__doc__)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--requests", type=int, default=200, help="timed requests per page")
    parser.add_argument("--deep-pages", type=int, default=200, help="how many pages deep the keyset case is")
    parser.add_argument("--lines", type=int, default=LINES)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between two log lines of the step")
    parser.add_argument("--skip-log", action="store_true", help="only the server figures")
    args = parser.parse_args()
    result: dict[str, Any] = {"server": _server_figures(args)}
    if not args.skip_log:
        result["log_line_to_browser"] = _log_latency(args)
    print(json.dumps(result, indent=2))
    print()
    print("| page | p50 ms | p99 ms |\n| --- | --- | --- |")
    for name, figures in result["server"]["pages"].items():
        print(f"| {name} | {figures['p50_ms']} | {figures['p99_ms']} |")
    if "log_line_to_browser" in result:
        log = result["log_line_to_browser"]
        print(f"| log line → browser ({log['lines']} lines) | {log['p50_ms']} | {log['p99_ms']} |")


if __name__ == "__main__":
    main()
