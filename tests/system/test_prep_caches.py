"""A dbt run's prep on one machine with a uid per run (``make run``'s default, the dispatcher root):
the host's repository and package caches serve every run whatever its uid, no run can write them,
and a run that cannot even make its own directory (a work directory closed to run users) ends as
an error that says why."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from runplane.basics.types import RunStatus
from tests.dbt.conftest import DBT_BIN, EXAMPLE
from tests.support.files import directory_for_all
from tests.support.git_servers import commit_all, macro_package, trusting
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.processes import Services
from tests.support.records import (
    Conn,
    create_account,
    create_dbt_environment,
    create_job,
    queue_run,
    rows,
    run_row,
)

pytestmark = [pytest.mark.slow, pytest.mark.dbt, pytest.mark.timeout(400)]

# What a step may try on the host's caches: write into the packages and git objects linked into its
# project, and enter the caches themselves.
PROBE = """
try() { if sh -c "$2" 2>/dev/null; then echo "PROBE $1 yes"; else echo "PROBE $1 no"; fi; }
echo "PROBE uid $(id -u)"
try write-package-file 'echo x >> dbt_packages/bench_macros/dbt_project.yml'
try write-git-object 'f=$(find .git/objects -type f -name "[0-9a-f]*" | head -n 1); test -n "$f" && echo x >> "$f"'
try list-repository-cache 'ls "$REPOSITORIES"'
try list-package-cache 'ls "$PACKAGES"'
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every uid can enter, steps included (dbt deps reads the package there)."""
    path = directory_for_all("runplane-prep-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _log(db: Conn, run_id: int) -> str:
    return "".join(
        r["text"] for r in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,))
    )


def _finished(db: Conn, run_id: int) -> dict[str, object]:
    wait_for(lambda: run_row(db, run_id)["status"] >= RunStatus.SUCCESS, timeout=240, what=f"run {run_id} to end")
    return run_row(db, run_id)


def _probe(log: str) -> dict[str, str]:
    return dict(re.findall(r"^PROBE (\S+) (\S+)$", log, flags=re.M))


def test_runs_of_different_uids_share_the_hosts_caches_and_cannot_write_them(
    db: Conn, services: Services, shared_dir: Path, tmp_path: Path
) -> None:
    assert os.geteuid() == 0, "the dispatcher must be root to give runs uids of their own"
    del services.env["RUNPLANE_RUNNER__LOCAL_UID"]  # the default: a uid per run
    # One directory shared by every run of the host, as configured, where the cache's own uid (git's) can reach it.
    caches = directory_for_all("runplane-caches-")
    services.env.update(
        RUNPLANE_RUNNER__DBT_VERSIONS=json.dumps({"test": str(DBT_BIN)}),
        RUNPLANE_RUNNER__REPOSITORY_CACHE=str(caches / "repositories"),
        RUNPLANE_RUNNER__PACKAGE_CACHE=str(caches / "dbt-packages"),
        RUNPLANE_REPOSITORIES__LOCAL_ROOTS=json.dumps([str(shared_dir)]),  # the project's repository is there
    )
    (shared_dir / "git").mkdir()
    pinned = macro_package(shared_dir / "git")  # a commit: without a lock, a branch is never cached
    package = shared_dir / "git" / "bench_macros"
    project = shared_dir / "jaffle"
    shutil.copytree(EXAMPLE, project)
    (project / "packages.yml").write_text(f"packages:\n  - git: file://{package}\n    revision: {pinned}\n")
    # dbt renders a model's Jinja when it parses the project: a missing package fails the parse.
    (project / "models" / "uses_package.sql").write_text("select {{ bench_macros.bench_macros_0(41) }} as answer\n")
    commit_all(project, "jaffle with a package")
    account = create_account(db, run_slots=4)
    database = str(db.info.dbname)
    # dbt parse needs no warehouse: one on a port nothing serves (the fence keeps runs off the control plane's)
    environment = create_dbt_environment(
        db, account, str(project), database, "test", variables=trusting(package), port=free_port()
    )
    job = create_job(db, account, steps=["dbt parse", PROBE])
    db.execute("UPDATE jobs SET environment_id = %s WHERE id = %s", (environment, job))
    db.execute(
        "UPDATE jobs SET environment = %s WHERE id = %s",
        (json.dumps({"REPOSITORIES": str(caches / "repositories"), "PACKAGES": str(caches / "dbt-packages")}), job),
    )
    services.start("scheduler")
    services.start("dispatcher")

    logs = []
    for change in ("", "", "  # the same packages, another lock\n"):
        if change:
            with (project / "packages.yml").open("a") as packages:
                packages.write(change)
            commit_all(project, "packages.yml changed")
        run_id = queue_run(db, job)
        run = _finished(db, run_id)
        log = _log(db, run_id)
        assert run["status"] == RunStatus.SUCCESS, f"{run['status_message']}\n{log[-3000:]}"
        logs.append(log)

    first, second, changed = logs
    assert ", cloned)" in first and "runplane: dbt deps\n" in first
    assert "dbt packages kept by this host for the next runs" in first, first[-3000:]
    # The second run has another uid, and gets both caches: no clone, no dbt deps.
    assert _probe(first)["uid"] != _probe(second)["uid"]
    assert "from this host's cache)" in second, second[-3000:]
    assert "dbt deps skipped" in second and "runplane: dbt deps\n" not in second, second[-3000:]
    # A changed lock is a new entry: dbt deps runs again.
    assert "from this host's cache)" in changed and "runplane: dbt deps\n" in changed, changed[-3000:]
    # Whatever the run, the host's caches stay out of its reach; the packages it got from the cache
    # are read-only to it (those its own dbt deps installed are its own).
    for log, linked in zip(logs, (False, True, False), strict=True):
        assert _probe(log) | {"uid": ""} == {
            "uid": "",
            "write-package-file": "no" if linked else "yes",
            # The clone's objects are its own copies on the run's size-capped disk, not the mirror's.
            "write-git-object": "yes",
            "list-repository-cache": "no",
            "list-package-cache": "no",
        }, log[-3000:]


def test_a_run_directory_closed_to_run_users_fails_the_run_with_the_reason(
    db: Conn, services: Services, tmp_path: Path
) -> None:
    assert os.geteuid() == 0, "the dispatcher must be root to give runs uids of their own"
    del services.env["RUNPLANE_RUNNER__LOCAL_UID"]
    closed = tmp_path / "runs"  # root's alone
    closed.mkdir(mode=0o700)
    services.env["RUNPLANE_RUNNER__WORK_DIR"] = str(closed)
    account = create_account(db)
    run_id = queue_run(db, create_job(db, account, steps=["echo never"]))
    services.start("scheduler")
    services.start("dispatcher")

    run = _finished(db, run_id)
    assert run["status"] == RunStatus.ERROR
    message = str(run["status_message"])
    assert message.startswith("the run's directory cannot be made: Permission denied"), message
    assert f"runplane: {message}" in _log(db, run_id)
