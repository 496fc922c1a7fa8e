"""The demo that ``make run`` shows: an account, a token and a few jobs (made by ``api.demo``).

With dbt installed (``make run`` makes ``.venv-dbt`` and names it in ``RUNPLANE_RUNNER__DBT_VERSIONS``)
the demo also gets the example dbt project (``examples/jaffle_shop``) in a local git repository of
its own install (updated with a new commit only when the example changed), an environment whose
warehouse is a database of the local Postgres named after the install's own database, and three dbt
jobs: a scheduled build, a CI job and a job chained to the build.
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
from runplane.commands.migrate import ensure_database

DEMO_ACCOUNT = "demo"
EXAMPLE_PROJECT = Path(__file__).resolve().parents[2] / "examples" / "jaffle_shop"
# Postgres cuts identifiers at 63 bytes; a longer warehouse name is cut and told apart by a hash.
MAX_IDENTIFIER = 63


def demo_repository_path(settings: Settings, install: Path = EXAMPLE_PROJECT) -> Path:
    """Where this install's demo repository lives: where every user can read it (runs execute as uids
    of their own, a root dispatcher's default, and a home directory is usually closed to them), and
    apart from every other install on the machine (its directory and its database name it)."""
    key = f"{install}\0{control_plane_database(settings)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"runplane-demo-{digest}" / "jaffle_shop"


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


def control_plane_database(settings: Settings) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(settings.database_url).get("dbname") or "runplane")


def warehouse_database(settings: Settings) -> str:
    """The demo warehouse's database: named after the control plane's, so two installs that share a
    Postgres (each with a database of its own) get a warehouse each."""
    name = f"{control_plane_database(settings)}_demo_warehouse"
    if len(name.encode()) <= MAX_IDENTIFIER:
        return name
    head = name.encode()[: MAX_IDENTIFIER - 9].decode(errors="ignore")
    return f"{head}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def warehouse_fields(settings: Settings) -> dict[str, str]:
    """The profile fields of the demo's warehouse: a database of runplane's own Postgres."""
    dbname = warehouse_database(settings)
    url = psycopg.conninfo.make_conninfo(settings.database_url, dbname=dbname)
    ensure_database(url)
    info = psycopg.conninfo.conninfo_to_dict(url)
    return {
        "host": str(info.get("host") or "127.0.0.1"),
        "port": str(info.get("port") or "5432"),
        "user": str(info.get("user") or "postgres"),
        "dbname": dbname,
    }


def seed_demo(settings: Settings) -> list[str]:
    """Create the demo account (once), a fresh token and the demo jobs; returns what to print."""
    from api.demo import DemoProject
    from api.demo import seed_demo as seed

    dbt_versions = sorted(settings.runner.dbt_versions)
    project = None
    if dbt_versions:
        project = DemoProject(
            demo_repository(demo_repository_path(settings)), warehouse_fields(settings), dbt_versions[-1]
        )
    account_id, token, job_ids = asyncio.run(seed(settings, DEMO_ACCOUNT, project))
    address = f"{settings.api.host}:{settings.api.port}"
    dbt_lines = (
        [
            f"dbt project {project.repository_url} (dbt {project.dbt_version}), warehouse database "
            f"{project.warehouse['dbname']}: jobs jaffle-build (every 10 minutes), jaffle-ci, jaffle-after-build "
            f"= {job_ids[-3:]}",
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
    ]
