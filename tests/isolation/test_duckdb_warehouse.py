"""A DuckDB environment through the real local launcher as root: each run on a uid of its own.

The first run seeds the environment's DuckDB file, the second (another uid) builds the models from
those seeds in the same file, and a third, after another account's run had one of those uids, still
does: every run of the environment reads and writes its file. The other account's run, on a uid that
made files there, can neither open the file nor list the warehouse root, and its environment naming
the same file (saved behind the API's back, as before the directory was claimed) is refused at run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from runplane.basics.types import RunStatus
from tests.dbt.conftest import DBT_BIN, EXAMPLE, KEPT_WAREHOUSES, duckdb_tables
from tests.isolation.conftest import run_log, wait_until_ended
from tests.support.files import directory_for_all
from tests.support.git_servers import commit_all
from tests.support.processes import Services
from tests.support.records import Conn, create_account, create_job, queue_run

pytestmark = [pytest.mark.slow, pytest.mark.dbt, pytest.mark.timeout(600)]

WHO = 'echo "UID $(id -u)"'


@pytest.fixture
def warehouse_root() -> Iterator[Path]:
    """A warehouse root of this test's own (the runner makes it root's, 0711)."""
    KEPT_WAREHOUSES.mkdir(exist_ok=True)
    root = KEPT_WAREHOUSES / f"launcher-{os.getpid()}"
    shutil.rmtree(root, ignore_errors=True)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def duckdb_environment(db: Conn, account_id: int, repository: Path, path: Path) -> int:
    project = db.execute(
        "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'jaffle', %s) RETURNING id",
        (account_id, str(repository)),
    ).fetchone()
    assert project is not None
    row = db.execute(
        """INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, git_branch,
                                     adapter_type, connection, schema_name)
           VALUES (%s, %s, 'prod', 'deployment', 'test', 'main', 'duckdb', %s, 'analytics') RETURNING id""",
        (account_id, project[0], json.dumps({"path": str(path)})),
    ).fetchone()
    assert row is not None
    return int(row[0])


def dbt_job(db: Conn, account_id: int, environment_id: int, steps: list[str]) -> int:
    job = create_job(db, account_id, steps=steps)
    db.execute("UPDATE jobs SET environment_id = %s WHERE id = %s", (environment_id, job))
    return job


def ended(db: Conn, job_id: int) -> tuple[dict[str, object], str]:
    run_id = queue_run(db, job_id)
    run = wait_until_ended(db, run_id, timeout=300)
    return run, run_log(db, run_id)


def uid_of(log: str) -> int:
    [uid] = re.findall(r"^UID (\d+)$", log, flags=re.M)
    return int(uid)


def test_every_run_of_a_duckdb_environment_shares_its_file_and_no_other_account_reaches_it(
    db: Conn, system: Services, warehouse_root: Path
) -> None:
    shared = directory_for_all("runplane-duckdb-")
    project = shared / "jaffle"
    shutil.copytree(EXAMPLE, project)
    commit_all(project, "the example project")
    system.env.update(
        RUNPLANE_RUNNER__DBT_VERSIONS=json.dumps({"test": str(DBT_BIN)}),
        RUNPLANE_RUNNER__LOCAL_WAREHOUSE_ROOT=str(warehouse_root),
        RUNPLANE_REPOSITORIES__LOCAL_ROOTS=json.dumps([str(shared)]),
    )
    database = warehouse_root / "jaffle" / "production.duckdb"
    owner = create_account(db, name="owner")
    environment = duckdb_environment(db, owner, project, database)
    seed = dbt_job(db, owner, environment, ["dbt seed", WHO])
    build = dbt_job(db, owner, environment, ["dbt run", WHO])
    system.start("scheduler")
    system.start("dispatcher")

    first, first_log = ended(db, seed)
    assert first["status"] == RunStatus.SUCCESS, first_log[-4000:]
    second, second_log = ended(db, build)  # the models read the first run's seeds
    assert second["status"] == RunStatus.SUCCESS, second_log[-4000:]
    assert uid_of(first_log) != uid_of(second_log)

    # Another account's run, on one of those two uids (the range has two), cannot reach the file.
    other = create_account(db, name="other")
    probe = (
        f'{WHO}; if cat {database} > /dev/null; then echo "OPEN yes"; else echo "OPEN no"; fi; '
        f'if ls {warehouse_root}; then echo "LIST yes"; else echo "LIST no"; fi'
    )
    outsider, outsider_log = ended(db, create_job(db, other, steps=[probe]))
    assert outsider["status"] == RunStatus.SUCCESS, outsider_log[-4000:]
    assert uid_of(outsider_log) in {uid_of(first_log), uid_of(second_log)}
    assert "OPEN no" in outsider_log and "Permission denied" in outsider_log, outsider_log[-2000:]
    assert "LIST no" in outsider_log, outsider_log[-2000:]
    stolen = dbt_job(db, other, duckdb_environment(db, other, project, database), ["dbt run"])
    refused, refused_log = ended(db, stolen)
    assert "belongs to another environment" in refused_log
    assert refused["status"] == RunStatus.ERROR
    assert str(refused["status_message"]).startswith(
        f"the environment's DuckDB path is in {database.parent}, which belongs to another environment"
    ), refused["status_message"]

    third, third_log = ended(db, build)  # after the uid went to another account and came back
    assert third["status"] == RunStatus.SUCCESS, third_log[-4000:]
    tables = duckdb_tables(database)
    assert {"customers", "orders", "raw_orders"} <= tables, tables  # the seeds of the first, models of the others
