"""A project's dbt packages from git, with the host's package cache: a package that follows a branch
is installed as the branch is now, and a local package repository that another user owns installs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from runplane.basics.settings import Settings
from tests.dbt.conftest import (
    OK,
    Client,
    Db,
    commit,
    dbt_job,
    dbt_run_marks,
    environment,
    git,
    make_repository,
    run_job,
    run_log,
)

pytestmark = dbt_run_marks(timeout=400)

NOBODY = 65534


def moving_package(path: Path, version: int) -> None:
    """The package ``moving`` whose macro ``version()`` answers ``version``, committed on its branch main."""
    (path / "macros").mkdir(parents=True, exist_ok=True)
    (path / "dbt_project.yml").write_text("name: moving\nversion: '1.0.0'\nconfig-version: 2\n")
    (path / "macros" / "version.sql").write_text(f"{{% macro version() %}}{version}{{% endmacro %}}\n")
    if not (path / ".git").exists():
        git(path, "init", "--quiet", "--initial-branch=main")
    commit(path, f"version {version}")


def project_using(repo: Path, package_url: str) -> None:
    """The example project with ``moving`` at branch main, no lock, and a model of what it answers."""
    (repo / "packages.yml").write_text(f"packages:\n  - git: {package_url}\n    revision: main\n")
    (repo / "models" / "package_version.sql").write_text(
        "{{ config(materialized='table') }}\nselect {{ moving.version() }} as version\n"
    )
    commit(repo, "a package on a branch")


def cached(settings: Settings, tmp_path: Path) -> Settings:
    """``settings`` with the host's package cache of the test's own."""
    runner = settings.runner.model_copy(update={"package_cache": str(tmp_path / "package-cache")})
    return settings.model_copy(update={"runner": runner})


async def test_a_package_on_a_branch_is_installed_as_the_branch_is_now(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    settings = cached(dbt_settings, tmp_path)
    package = tmp_path / "git" / "moving"
    moving_package(package, 1)
    repo = make_repository(tmp_path / "jaffle")
    project_using(repo, f"file://{package}")
    env = await environment(client, database_url, str(repo))
    job = await dbt_job(client, env.id, ["dbt run --select package_version"])

    def built() -> int:
        row = db.execute("SELECT version FROM analytics.package_version").fetchone()
        assert row is not None
        return int(row[0])

    first = await run_job(client, settings, db, job.id)
    assert first.status == OK, (await run_log(client, first.id))[-3000:]
    assert built() == 1
    moving_package(package, 2)  # the branch moves on
    second = await run_job(client, settings, db, job.id)
    log = await run_log(client, second.id)
    assert second.status == OK, log[-3000:]
    assert built() == 2, log[-3000:]
    assert "dbt packages not cached by this host: no package-lock.yml" in log
    assert "dbt deps skipped" not in log


def owned_by(path: Path, uid: int) -> None:
    for root, directories, files in os.walk(path):
        for name in [*directories, *files]:
            os.lchown(Path(root) / name, uid, uid)
    os.lchown(path, uid, uid)


async def test_a_local_package_repository_another_user_owns_installs(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    package = tmp_path / "git" / "moving"
    moving_package(package, 7)
    repo = make_repository(tmp_path / "jaffle")
    project_using(repo, f"file://{package}")
    # Another user's repository, as a root-owned one is to a run's uid: git calls that dubious ownership.
    owned_by(package, NOBODY if os.getuid() != NOBODY else 0)
    try:
        env = await environment(client, database_url, str(repo))
        job = await dbt_job(client, env.id, ["dbt run --select package_version"])
        run = await run_job(client, cached(dbt_settings, tmp_path), db, job.id)
        log = await run_log(client, run.id)
        assert run.status == OK, f"{run.status_message}\n{log[-3000:]}"
        assert "dubious ownership" not in log
        row = db.execute("SELECT version FROM analytics.package_version").fetchone()
        assert row is not None and int(row[0]) == 7
    finally:
        owned_by(package, os.getuid())
        shutil.rmtree(tmp_path / "git", ignore_errors=True)
