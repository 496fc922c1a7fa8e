"""Migrations: from empty they give the same schema every time, and they are safe to repeat and race."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from api.runner.run_spec import decrypter, load_dbt_context
from runplane.basics.errors import FailedPrecondition
from runplane.basics.secrets import SecretBox
from runplane.commands.migrate import migrate, migrations
from runplane.dbt.context import DbtContext
from tests.conftest import ADMIN_URL, TEST_SECRET_KEYS, _db_url, _drop
from tests.support.records import one

SCHEMA_QUERY = """
SELECT table_name, column_name, data_type, is_nullable, column_default
FROM information_schema.columns WHERE table_schema = 'public'
ORDER BY table_name, ordinal_position
"""
INDEX_QUERY = "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY indexname"


@pytest.fixture
def empty_db() -> Iterator[str]:
    name = f"rp_empty_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    yield _db_url(name)
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        _drop(conn, name)


def _schema(url: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    with psycopg.connect(url) as conn:
        return conn.execute(SCHEMA_QUERY).fetchall(), conn.execute(INDEX_QUERY).fetchall()


def test_migrating_from_empty_gives_the_template_schema(empty_db: str, database_url: str) -> None:
    applied = migrate(empty_db)
    assert applied == [m.version for m in migrations()]
    assert _schema(empty_db) == _schema(database_url)
    tables = {row[0] for row in _schema(empty_db)[0]}
    assert {
        "accounts", "api_tokens", "jobs", "job_completion_triggers", "runs", "run_steps", "run_log_chunks",
        "artifacts", "orchestrator_term", "queuer_workers", "job_ownership", "schema_migrations",
    } <= tables  # fmt: skip
    indexes = {str(name): str(definition) for name, definition in _schema(empty_db)[1]}
    assert "WHERE (status = 1)" in indexes["runs_queued_idx"]
    assert "UNIQUE" in indexes["runs_idempotency_key_key"]


def test_migrate_twice_is_a_no_op(empty_db: str) -> None:
    assert migrate(empty_db)
    before = _schema(empty_db)
    assert migrate(empty_db) == []
    assert _schema(empty_db) == before


@pytest.mark.timeout(120)  # three cold interpreters importing runplane: seconds each on a busy machine
def test_migrate_from_two_processes_at_once(empty_db: str) -> None:
    env = {"RUNPLANE_DATABASE_URL": empty_db, "PATH": "/usr/bin:/bin", "RUNPLANE_LOG_FORMAT": "text"}
    procs = [
        subprocess.Popen([sys.executable, "-m", "runplane", "migrate"], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert sum("migrations applied" in out for out in outputs) == 1
    assert sum("up to date" in out for out in outputs) == 2
    with psycopg.connect(empty_db) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert versions == [m.version for m in migrations()]


def test_every_job_change_that_bumps_the_version_notifies(db: psycopg.Connection[tuple[object, ...]]) -> None:
    db.execute("LISTEN runplane_jobs")
    (account_id,) = one(db, "INSERT INTO accounts (name, run_slots) VALUES ('a', 1) RETURNING id")
    (job_id,) = one(
        db,
        "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, 'j', 'deploy', ARRAY['true']) RETURNING id",
        (account_id,),
    )
    db.execute("UPDATE jobs SET consecutive_failures = 3 WHERE id = %s", (job_id,))  # not scheduling: quiet
    db.execute("UPDATE jobs SET cron = '* * * * *', version = version + 1 WHERE id = %s", (job_id,))
    payloads = [n.payload for n in db.notifies(timeout=1, stop_after=3)]
    assert payloads == [
        f'{{"job_id" : {job_id}, "version" : 1, "op" : "insert"}}',
        f'{{"job_id" : {job_id}, "version" : 2, "op" : "update"}}',
    ]


def test_a_database_made_by_another_version_is_refused_with_the_fix(empty_db: str) -> None:
    migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("UPDATE schema_migrations SET checksum = 'older' WHERE version = 1")
    with pytest.raises(FailedPrecondition, match=r"made by another version of runplane.*new database"):
        migrate(empty_db)
    env = {"RUNPLANE_DATABASE_URL": empty_db, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "runplane", "migrate"], env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 2
    assert "differs from the one applied" in done.stderr


SEALED_VERSION = 23  # environments.secret_variables: the environments' secret variables, encrypted


def test_secret_variables_an_environment_held_in_clear_are_encrypted_and_still_reach_the_run(empty_db: str) -> None:
    migrate(empty_db, until=SEALED_VERSION - 1)  # the schema as the previous version left it
    secret = "env-pa55-from-before"
    with psycopg.connect(empty_db, autocommit=True) as conn:
        (account_id,) = one(conn, "INSERT INTO accounts (name, run_slots) VALUES ('a', 1) RETURNING id")
        (project_id,) = one(
            conn,
            "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'p', 'file:///srv/p') RETURNING id",
            (account_id,),
        )
        (environment_id,) = one(
            conn,
            "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
            " schema_name, variables) VALUES (%s, %s, 'prod', 'deployment', '1.10', 'postgres', 'analytics', %s)"
            " RETURNING id",
            (account_id, project_id, Jsonb({"DBT_ENV_SECRET_TOKEN": secret, "DBT_ENV_SECRET_EMPTY": "", "PLAIN": "p"})),
        )
        (job_id,) = one(
            conn,
            "INSERT INTO jobs (account_id, name, job_type, steps, environment_id)"
            " VALUES (%s, 'j', 'deploy', ARRAY['true'], %s) RETURNING id",
            (account_id, environment_id),
        )
        (run_id,) = one(
            conn,
            "INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at)"
            " VALUES (%s, %s, 'deploy', 'manual', 'k', true, now()) RETURNING id",
            (account_id, job_id),
        )

    env = {"RUNPLANE_DATABASE_URL": empty_db, "PATH": "/usr/bin:/bin", "RUNPLANE_LOG_FORMAT": "text"}
    keyless = subprocess.run(
        [sys.executable, "-m", "runplane", "migrate"], env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert keyless.returncode == 2 and "RUNPLANE_SECRET_KEYS" in keyless.stderr, keyless.stderr
    assert secret not in keyless.stdout + keyless.stderr
    keyed = subprocess.run(
        [sys.executable, "-m", "runplane", "migrate"],
        env={**env, "RUNPLANE_SECRET_KEYS": TEST_SECRET_KEYS},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert keyed.returncode == 0, keyed.stderr

    box = SecretBox.from_keys(TEST_SECRET_KEYS)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        clear, sealed = one(
            conn, "SELECT variables, secret_variables FROM environments WHERE id = %s", (environment_id,)
        )
        raw = one(conn, "SELECT secret_variables::text FROM environments WHERE id = %s", (environment_id,))
        assert secret not in raw[0]
    assert clear == {"PLAIN": "p"}  # no secret left in clear; the empty one (unset) is gone
    assert sorted(sealed) == ["DBT_ENV_SECRET_TOKEN"] and box.decrypt(sealed["DBT_ENV_SECRET_TOKEN"]) == secret
    assert migrate(empty_db, box) == []  # sealed once: a second call finds nothing
    context = asyncio.run(_dbt_context(empty_db, run_id, box))  # what the runner API gives the run's runner
    assert context is not None
    assert context.secret_variables == {"DBT_ENV_SECRET_TOKEN": secret} and secret in context.secrets()
    assert dict(context.variables) == {"PLAIN": "p"}


async def _dbt_context(url: str, run_id: int, box: SecretBox) -> DbtContext | None:
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row) as conn:
        return await load_dbt_context(conn, run_id, decrypter(box))
