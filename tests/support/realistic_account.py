"""An account as a dbt team's looks after some weeks, arranged straight in the database: two projects,
an environment of every adapter, jobs with schedules and fan-in, hundreds of runs (failed, cancelled,
queued, running; failed and skipped steps; dbt's run_results with hundreds of nodes), tokens and
webhooks. The pages are checked on it, not on a handful of tidy rows."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from runplane.basics.types import RunStatus
from tests.api.conftest import AsyncDb, scalar

ENVIRONMENTS = [  # (project, name, type, adapter, connection, schema)
    ("analytics", "Production (Snowflake)", "deployment", "snowflake",
     {"account": "acme-eu1", "user": "DBT_PROD", "database": "ANALYTICS", "warehouse": "TRANSFORMING_XL"}, "analytics"),
    ("analytics", "Staging on BigQuery", "deployment", "bigquery",
     {"project": "acme-staging-391204", "location": "EU"}, "dbt_staging"),
    ("analytics", "Development", "development", "postgres",
     {"host": "dev-db.internal.acme.example", "user": "dbt_dev", "dbname": "warehouse"}, "dbt_dev"),
    ("marketing", "Lakehouse", "deployment", "databricks",
     {"host": "adb-4921.12.azuredatabricks.net", "http_path": "/sql/1.0/warehouses/8a2f1c"}, "marketing"),
    ("marketing", "Redshift legacy", "deployment", "redshift",
     {"host": "legacy.c9x.eu-west-1.redshift.amazonaws.com", "user": "dbt", "dbname": "mart"}, "marketing_legacy"),
    ("marketing", "Local DuckDB", "development", "duckdb",
     {"path": "/var/lib/runplane-test-warehouses/marketing.duckdb"}, "main"),
]  # fmt: skip

JOBS = [  # (name, environment index, steps, cron, upstream job indexes)
    ("Nightly full build of every finance, orders and customer model", 0, ["dbt source freshness", "dbt build"],
     "0 2 * * *", []),
    ("Hourly incremental orders", 0, ["dbt run --select tag:hourly", "dbt test --select tag:hourly"], "5 * * * *", []),
    ("Staging refresh", 1, ["dbt build --exclude tag:slow"], "30 */4 * * *", []),
    ("Marketing attribution", 3, ["dbt seed", "dbt run", "dbt test"], "15 6 * * 1-5", []),
    ("Legacy mart export", 4, ["dbt run --select mart"], "0 7 * * *", []),
    ("Executive dashboards (after finance and marketing)", 0, ["dbt run --select dashboards+"], None, [0, 3]),
    ("CI checks", 2, ["dbt build --select state:modified+"], None, []),
    ("Local smoke test", 5, ["dbt debug", "dbt build"], None, []),
]  # fmt: skip

SHAS = ["3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39", "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d",
        "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", "0badc0ffee0ddf00d1234567890abcdef1234567"]  # fmt: skip


@dataclass(frozen=True)
class Realistic:
    projects: list[int]
    environments: list[int]
    jobs: list[int]
    runs: list[int]
    failed_run: int  # an error run with a failed and a skipped step and a run_results of many nodes
    running_run: int
    webhooks: list[str]


def run_results(rng: random.Random, nodes: int, started: datetime, *, failing: bool) -> dict[str, Any]:
    """A dbt ``run_results.json`` of ``nodes`` nodes run on four threads, as dbt 1.10 writes it."""
    results: list[dict[str, Any]] = []
    threads = [started] * 4
    for i in range(nodes):
        kind = "test" if i % 3 == 2 else "model"
        thread = min(range(4), key=lambda t: threads[t])
        took = rng.choice([0.2, 0.4, 1.1, 2.5, 7.9, 31.0]) * (1 + rng.random())
        begin = threads[thread]
        end = begin + timedelta(seconds=took)
        threads[thread] = end
        status = "success" if kind == "model" else "pass"
        message = "SELECT 1204" if kind == "model" else None
        if failing and i in (17, 88):
            status, message = (
                "error",
                "Database Error in model fct_orders (models/marts/fct_orders.sql)\n  division by zero",
            )
        elif failing and i in (23, 41):
            status, message = "fail", "Got 14 results, configured to fail if != 0"
        elif i % 29 == 5:
            status, message = "warn", "Got 2 results, configured to warn if != 0"
        elif failing and i > nodes - 12:
            status, message, took = "skipped", "SKIP relation analytics.downstream_of_fct_orders", 0.0
        name = f"fct_{['orders', 'customers', 'payments', 'sessions', 'campaigns'][i % 5]}_{i:03d}"
        results.append({
            "unique_id": f"{kind}.acme.{name}" if kind == "model" else f"test.acme.not_null_{name}_id.{i:010x}",
            "status": status,
            "execution_time": round(took, 3),
            "thread_id": f"Thread-{thread + 1}",
            "timing": [] if status == "skipped" else [
                {"name": "compile", "started_at": begin.isoformat().replace("+00:00", "Z"),
                 "completed_at": (begin + timedelta(seconds=0.05)).isoformat().replace("+00:00", "Z")},
                {"name": "execute", "started_at": (begin + timedelta(seconds=0.05)).isoformat().replace("+00:00", "Z"),
                 "completed_at": end.isoformat().replace("+00:00", "Z")},
            ],
            "adapter_response": {"rows_affected": rng.randint(0, 2_000_000)} if kind == "model" else {},
            "message": message,
            "failures": 14 if status == "fail" else None,
        })  # fmt: skip
    return {"metadata": {"dbt_version": "1.10.4"}, "elapsed_time": 312.4, "results": results}


async def seed_realistic_account(db: AsyncDb, account_id: int, *, runs_per_job: int = 60) -> Realistic:
    """The account's projects, environments, jobs, runs, tokens and webhooks (see the module's text)."""
    rng = random.Random(20261128)
    projects: dict[str, int] = {}
    for name in ("analytics", "marketing"):
        projects[name] = int(await scalar(
            db, "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, %s, %s) RETURNING id",
            account_id, name, f"https://github.com/acme-data/{name}-dbt.git",
        ))  # fmt: skip
    environments = []
    for project, name, kind, adapter, connection, schema in ENVIRONMENTS:
        environments.append(int(await scalar(
            db,
            "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
            " connection, schema_name, threads, target_name) VALUES (%s, %s, %s, %s, '1.10', %s, %s, %s, 8, 'prod')"
            " RETURNING id",
            account_id, projects[project], name, kind, adapter, json.dumps(connection), schema,
        )))  # fmt: skip
    jobs: list[int] = []
    for name, env, steps, cron, upstream in JOBS:
        job_type = "ci" if name == "CI checks" else "deploy"
        job = int(await scalar(
            db,
            "INSERT INTO jobs (account_id, name, job_type, steps, cron, timezone, environment_id, threads,"
            " timeout_seconds, target_name) VALUES (%s, %s, %s, %s, %s, 'Europe/Paris', %s, %s, %s, %s) RETURNING id",
            account_id, name, job_type, steps, cron, environments[env], 16 if env == 0 else 0,
            7200 if cron else 0, "prod" if env == 0 else "",
        ))  # fmt: skip
        jobs.append(job)
        for up in upstream:
            await db.execute(
                "INSERT INTO job_completion_triggers (job_id, upstream_job_id, statuses) VALUES (%s, %s, '{10}')",
                (job, jobs[up]),
            )
    now = datetime.now(UTC).replace(microsecond=0)
    run_ids: list[int] = []
    step_rows: list[tuple[Any, ...]] = []
    failed_run = running_run = 0
    for j, job in enumerate(jobs):
        ci = JOBS[j][0] == "CI checks"
        for k in range(runs_per_job):
            newest = k == runs_per_job - 1
            scheduled = now - timedelta(hours=(runs_per_job - k) * 2, minutes=j * 7)
            status = rng.choices([10, 20, 30], weights=[80, 15, 5])[0]
            if newest and j == 0:
                status = int(RunStatus.ERROR)
            if newest and j == 1:
                status, scheduled = int(RunStatus.RUNNING), now - timedelta(minutes=3)
            if newest and j == 2:
                status, scheduled = int(RunStatus.QUEUED), now - timedelta(minutes=2)
            started = scheduled + timedelta(seconds=rng.choice([3, 8, 14, 40, 95, 400]))
            took = timedelta(seconds=rng.randint(40, 3600))
            terminal = status in (10, 20, 30)
            overrides = {"schema": "backfill_2026"} if k % 17 == 3 else {}
            run = int(await scalar(
                db,
                "INSERT INTO runs (account_id, job_id, job_type, status, trigger, cause, idempotency_key, takes_slot,"
                " scheduled_at, queued_at, dispatched_at, started_at, finished_at, git_sha, overrides, schema_name,"
                " pull_request_number, waiting_reason, status_message)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                account_id, job, "ci" if ci else "deploy", status,
                "ci" if ci else "schedule" if JOBS[j][3] else "completion" if JOBS[j][4] else "manual",
                f"Pull request #{400 + k} opened" if ci else "Scheduled by its cron",
                f"realistic:{job}:{k}", not ci, scheduled, scheduled + timedelta(seconds=1),
                None if status == 1 else scheduled + timedelta(seconds=2),
                None if status == 1 else started, started + took if terminal else None,
                "" if status == 1 else SHAS[k % len(SHAS)], json.dumps(overrides),
                f"dbt_cloud_pr_{job}_{400 + k}" if ci else "", 400 + k if ci else None,
                "job_already_running" if status == 1 else "",
                "Database Error in model fct_orders: division by zero" if status == 20 else "",
            ))  # fmt: skip
            run_ids.append(run)
            if status == 1:
                continue
            run_steps = [
                ("Clone git repository", True),
                ("Create profile from connection", True),
                ("Invoke dbt deps", True),
            ]
            run_steps += [(command, False) for command in JOBS[j][2]]
            failed_at = len(run_steps) - 2 if status == 20 and len(run_steps) > 4 else len(run_steps) - 1
            for index, (command, setup) in enumerate(run_steps):
                begin = started + timedelta(seconds=index * 20)
                if status == 3:
                    step_status, ran = (3, True) if index == len(run_steps) - 1 else (10, True)
                elif status == 20 and index > failed_at:
                    step_status, ran = 1, False  # never started: skipped
                elif status == 20 and index == failed_at:
                    step_status, ran = 20, True
                elif status == 30 and index == len(run_steps) - 1:
                    step_status, ran = 30, True
                else:
                    step_status, ran = 10, True
                step_rows.append(
                    (run, index, command, step_status, {10: 0, 20: 1, 30: 130}.get(step_status) if ran else None,
                     begin if ran else None, begin + timedelta(seconds=18) if ran and step_status != 3 else None,
                     setup, not ran),
                )  # fmt: skip
            if newest and j == 0:
                failed_run = run
            if newest and j == 1:
                running_run = run
            if newest or k % 10 == 0:
                content = run_results(rng, 240 if newest else 60, started, failing=status == 20)
                await db.execute(
                    "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/run_results.json',"
                    " %s, %s)",
                    (run, failed_at, json.dumps(content).encode()),
                )
                await db.execute(
                    "INSERT INTO run_log_chunks (run_id, seq, step_index, text)"
                    " SELECT %s, g, g %% 4, format(E'%%s | %%s of 240 OK created sql table model analytics.fct_%%s\\n',"
                    " to_char(now(), 'HH24:MI:SS'), g, g) FROM generate_series(1, 300) g",
                    (run,),
                )
    async with db.cursor() as cur:
        await cur.executemany(
            "INSERT INTO run_steps (run_id, step_index, command, status, exit_code, started_at, finished_at,"
            " setup, skipped) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            step_rows,
        )
    for name, scopes, used in (
        ("Airflow production trigger", ["job_admin"], True),
        ("Looker read-only", ["read_only"], True),
        ("Terraform account admin", ["account_admin"], False),
    ):
        await db.execute(
            "INSERT INTO api_tokens (account_id, token_hash, token_prefix, name, scopes, last_used_at)"
            " VALUES (%s, %s, %s, %s, %s, CASE WHEN %s THEN now() - interval '5 minutes' END)",
            (account_id, rng.randbytes(32), f"rp_{rng.randbytes(3).hex()}", name, scopes, used),
        )
    webhooks = []
    for i, (name, url, events) in enumerate((
        ("Slack #data-alerts", "https://hooks.slack.example/services/T000/B000/XXXX", ["job.run.errored"]),
        ("PagerDuty", "https://events.pagerduty.example/v2/enqueue", ["job.run.errored", "job.run.completed"]),
    )):  # fmt: skip
        webhook = f"wsu_{account_id}_{i}"
        await db.execute(
            "INSERT INTO webhook_subscriptions (id, account_id, name, client_url, event_types, job_ids, hmac_secret)"
            " VALUES (%s, %s, %s, %s, %s, %s, 'not-a-secret-ciphertext')",
            (webhook, account_id, name, url, events, jobs[:2] if i else []),
        )
        webhooks.append(webhook)
    return Realistic(
        projects=list(projects.values()),
        environments=environments,
        jobs=jobs,
        runs=run_ids,
        failed_run=failed_run,
        running_run=running_run,
        webhooks=webhooks,
    )
