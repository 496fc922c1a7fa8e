"""Arranging accounts, jobs and runs with SQL (the test's own connection), and reading them back."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg

from runplane.basics.secrets import SecretBox
from runplane.basics.tokens import new_run_token, token_hash
from tests.conftest import TEST_SECRET_KEYS

Conn = psycopg.Connection[Any]


def create_account(db: Conn, *, run_slots: int = 1, memory_mb: int = 1024, name: str = "acme") -> int:
    row = db.execute(
        "INSERT INTO accounts (name, run_slots, memory_mb) VALUES (%s, %s, %s) RETURNING id",
        (name, run_slots, memory_mb),
    ).fetchone()
    assert row is not None
    return int(row[0])


def create_job(
    db: Conn,
    account_id: int,
    *,
    steps: Sequence[str] = ("echo hello",),
    job_type: str = "deploy",
    name: str = "job",
    timeout_seconds: int = 0,
    environment: dict[str, str] | None = None,
    retry_max_attempts: int = 0,
    retry_on_step_failure: bool = False,
    threads: int = 4,
    secrets: dict[str, str] | None = None,
) -> int:
    """A job; ``secrets`` are secret variables, stored encrypted with the test keys as the API stores them."""
    box = SecretBox.from_keys(TEST_SECRET_KEYS)
    secret_environment = {name: box.encrypt(value) for name, value in (secrets or {}).items()}
    row = db.execute(
        """INSERT INTO jobs (account_id, name, job_type, steps, timeout_seconds, environment, retry_max_attempts,
                             retry_on_step_failure, threads, secret_environment)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id""",
        (
            account_id,
            name,
            job_type,
            list(steps),
            timeout_seconds,
            json.dumps(environment or {}),
            retry_max_attempts,
            retry_on_step_failure,
            threads,
            json.dumps(secret_environment),
        ),
    ).fetchone()
    assert row is not None
    return int(row[0])


def create_dbt_environment(
    db: Conn,
    account_id: int,
    repository_url: str,
    dbname: str,
    dbt_version: str,
    *,
    variables: dict[str, str] | None = None,
    port: int = 5432,
) -> int:
    """A deployment environment of a new project at ``repository_url``, on branch main, whose
    warehouse is the database ``dbname`` of the Postgres on the local ``port``, with the environment
    ``variables``. (A run fenced on this machine may not reach the control plane's own Postgres.)"""
    project = db.execute(
        "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'jaffle', %s) RETURNING id",
        (account_id, repository_url),
    ).fetchone()
    assert project is not None
    connection = json.dumps({"host": "127.0.0.1", "port": str(port), "user": "postgres", "dbname": dbname})
    row = db.execute(
        """INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, git_branch,
                                     adapter_type, connection, schema_name, variables)
           VALUES (%s, %s, 'prod', 'deployment', %s, 'main', 'postgres', %s, 'analytics', %s) RETURNING id""",
        (account_id, project[0], dbt_version, connection, json.dumps(variables or {})),
    ).fetchone()
    assert row is not None
    return int(row[0])


def create_environment(db: Conn, account_id: int, dbt_version: str) -> int:
    """A deployment environment of a new project of the account, with the given dbt version."""
    project = db.execute(
        "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'shop', 'file:///srv/shop') RETURNING id",
        (account_id,),
    ).fetchone()
    assert project is not None
    row = db.execute(
        "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
        " schema_name) VALUES (%s, %s, 'prod', 'deployment', %s, 'postgres', 'analytics') RETURNING id",
        (account_id, project[0], dbt_version),
    ).fetchone()
    assert row is not None
    return int(row[0])


def queue_run(
    db: Conn,
    job_id: int,
    *,
    trigger: str = "manual",
    pull_request_number: int | None = None,
    overrides: dict[str, object] | None = None,
    status: int = 1,
    key: str | None = None,
) -> int:
    row = db.execute(
        """INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, overrides,
                             pull_request_number, status, scheduled_at, priority)
           SELECT account_id, id, job_type, %s, %s, job_type <> 'ci', %s, %s, %s, clock_timestamp(), priority
             FROM jobs WHERE id = %s RETURNING id""",
        (
            trigger,
            key or f"test:{uuid.uuid4().hex}",
            json.dumps(overrides or {}),
            pull_request_number,
            status,
            job_id,
        ),
    ).fetchone()
    assert row is not None
    return int(row[0])


def one(db: psycopg.Connection[tuple[Any, ...]], sql: str, params: Sequence[object] = ()) -> tuple[Any, ...]:
    """The row ``sql`` returns (the first of them); the test fails when it returns none."""
    row = db.execute(sql, params).fetchone()
    assert row is not None, sql
    return row


def run_row(db: Conn, run_id: int) -> dict[str, Any]:
    with db.cursor(row_factory=psycopg.rows.dict_row) as cur:
        row = cur.execute("SELECT * FROM runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None, f"run {run_id} not found"
    return row


def rows(db: Conn, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
    with db.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(sql, params).fetchall()


def statuses(db: Conn, run_ids: Sequence[int]) -> dict[int, int]:
    found = db.execute("SELECT id, status FROM runs WHERE id = ANY(%s)", (list(run_ids),)).fetchall()
    return {int(r[0]): int(r[1]) for r in found}


def all_terminal(db: Conn, run_ids: Sequence[int]) -> bool:
    return all(status >= 10 for status in statuses(db, run_ids).values())


def make_starting(db: Conn, run_id: int) -> str:
    """Move a queued run to starting as a dispatcher does, issuing its token; returns the token."""
    token = new_run_token()
    db.execute(
        "UPDATE runs SET status = 2, dispatched_at = clock_timestamp(), launch_attempts = launch_attempts + 1,"
        " runner_token_hash = %s WHERE id = %s",
        (token_hash(token), run_id),
    )
    return token
