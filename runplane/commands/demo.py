"""The demo that ``make run`` shows: an account, a token and a few jobs (made by ``api.demo``).

With dbt installed (``make run`` makes ``.venv-dbt`` and names it in ``RUNPLANE_RUNNER__DBT_VERSIONS``)
the demo also gets the example dbt project (``examples/jaffle_shop``) in a local git repository of
its own install (updated with a new commit only when the example changed), an environment whose
warehouse is a Postgres cluster of the install's own (``runplane.commands.demo_warehouse``: never
the control plane's server, which a run may not reach), and three dbt jobs: a scheduled build, a
CI job and a job chained to the build.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from runplane.basics.settings import Settings
from runplane.commands.demo_warehouse import DemoWarehouse

DEMO_ACCOUNT = "demo"
EXAMPLE_PROJECT = Path(__file__).resolve().parents[2] / "examples" / "jaffle_shop"


def control_plane_database(settings: Settings) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(settings.database_url).get("dbname") or "runplane")


def demo_repository_path(settings: Settings, install: Path = EXAMPLE_PROJECT) -> Path:
    """Where this install's demo repository lives: where every user can read it (runs execute as uids
    of their own, a root dispatcher's default, and a home directory is usually closed to them), and
    apart from every other install on the machine (its directory and its database name it)."""
    key = f"{install}\0{control_plane_database(settings)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"runplane-demo-{digest}" / "jaffle_shop"


def with_demo_repository(settings: Settings) -> Settings:
    """``settings`` whose local repository roots include this install's demo repository (the demo's
    project names it, and every repository is checked against those roots when a run clones it)."""
    if not settings.runner.dbt_versions:
        return settings  # no dbt: the demo has no project
    path = str(demo_repository_path(settings))
    roots = settings.repositories.local_roots
    if path in roots:
        return settings
    repositories = settings.repositories.model_copy(update={"local_roots": [*roots, path]})
    return settings.model_copy(update={"repositories": repositories})


def demo_repository(path: Path, source: Path = EXAMPLE_PROJECT) -> str:
    """``source`` as the head of ``main`` of the local repository at ``path`` (made once; a new commit
    only when ``source`` changed, so runs and their pinned commits survive a restart); its URL."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not (path / ".git").is_dir():
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o755)
        _git(path, "init", "--quiet", "--initial-branch=main")
    for entry in path.iterdir():
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    shutil.copytree(source, path, ignore=shutil.ignore_patterns("target", "logs", "dbt_packages"), dirs_exist_ok=True)
    _git(path, "add", "-A")
    if _git(path, "status", "--porcelain").strip():
        identity = ["-c", "user.name=runplane demo", "-c", "user.email=demo@runplane.invalid"]
        _git(path, *identity, "commit", "--quiet", "-m", "jaffle_shop")
    return f"file://{path}"


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True).stdout


def seed_demo(settings: Settings) -> tuple[list[str], DemoWarehouse | None]:
    """Create the demo account (once), a fresh token and the demo jobs; what to print, and the
    warehouse started for the dbt jobs (to stop at the end)."""
    from api.demo import DemoProject
    from api.demo import seed_demo as seed

    dbt_versions = sorted(settings.runner.dbt_versions)
    project = None
    warehouse = DemoWarehouse.for_install(settings) if dbt_versions else None
    try:
        if warehouse is not None:
            fields, password = warehouse.start()
            project = DemoProject(
                demo_repository(demo_repository_path(settings)), fields, dbt_versions[-1], {"password": password}
            )
        account_id, token, job_ids = asyncio.run(seed(settings, DEMO_ACCOUNT, project))
    except BaseException:
        if warehouse is not None:  # nobody else knows it was started
            warehouse.stop()
        raise
    address = f"{settings.api.host}:{settings.api.port}"
    dbt_lines = (
        [
            f"dbt project {project.repository_url} (dbt {project.dbt_version}), warehouse: a Postgres of its "
            f"own on port {project.warehouse['port']}: jobs jaffle-build (every 10 minutes), jaffle-ci, "
            f"jaffle-after-build = {job_ids[-3:]}",
            f"  RUNPLANE_TOKEN={token} .venv/bin/python -m client trigger {job_ids[-3]} --follow",
        ]
        if project is not None
        else ["(no dbt installed: RUNPLANE_RUNNER__DBT_VERSIONS is empty, so the demo has no dbt jobs)"]
    )
    return [
        "",
        f"demo account {account_id}, jobs {job_ids}",
        *dbt_lines,
        f"demo token: {token}",
        "",
        "try (with grpcurl, or any gRPC client using server reflection):",
        f"  grpcurl -plaintext -H 'authorization: Bearer {token}' {address} list",
        f"  grpcurl -plaintext -H 'authorization: Bearer {token}' -d '{{\"job_id\": {job_ids[0]}}}' "
        f"{address} runplane.v1.RunService/TriggerRun",
        f"  grpcurl -plaintext -H 'authorization: Bearer {token}' -d '{{\"run_id\": 1}}' "
        f"{address} runplane.v1.RunService/GetRun",
        "or the bundled client:",
        f"  RUNPLANE_TOKEN={token} .venv/bin/python -m client trigger {job_ids[0]} --follow",
        "",
        "Ctrl-C stops everything.",
    ], warehouse
