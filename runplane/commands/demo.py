"""The demo that ``make run`` shows: an account, a token and a few jobs (made by ``api.admin``).

With dbt installed (``make run`` makes ``.venv-dbt`` and names it in ``RUNPLANE_RUNNER__DBT_VERSIONS``)
the demo also gets the example dbt project (``examples/jaffle_shop``), committed afresh at every start
into a local git repository, an environment whose warehouse is a database of the local Postgres, and
three dbt jobs: a scheduled build, a CI job and a job chained to the build.
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
EXAMPLE_PROJECT = Path(__file__).resolve().parents[1] / "examples" / "jaffle_shop"
# Where every user can read it: runs execute as uids of their own (a root dispatcher's default), and
# a home directory is usually closed to them. One per home, so two demos on one machine stay apart.
DEMO_REPOSITORY = (
    Path(tempfile.gettempdir())
    / f"runplane-demo-{hashlib.sha256(str(Path.home()).encode()).hexdigest()[:10]}"
    / "jaffle_shop"
)
WAREHOUSE_DATABASE = "runplane_demo_warehouse"


def demo_repository(source: Path = EXAMPLE_PROJECT, path: Path = DEMO_REPOSITORY) -> str:
    """``source`` committed on ``main`` of a new local repository at ``path``; its URL."""
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    shutil.copytree(source, path, ignore=shutil.ignore_patterns("target", "logs", "dbt_packages"))
    identity = ["-c", "user.name=runplane demo", "-c", "user.email=demo@runplane.invalid"]
    for args in (
        ["init", "--quiet", "--initial-branch=main"],
        ["add", "-A"],
        [*identity, "commit", "--quiet", "-m", "jaffle_shop"],
    ):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)
    return f"file://{path}"


def warehouse_fields(settings: Settings) -> dict[str, str]:
    """The profile fields of the demo's warehouse: a database of runplane's own Postgres."""
    url = psycopg.conninfo.make_conninfo(settings.database_url, dbname=WAREHOUSE_DATABASE)
    ensure_database(url)
    info = psycopg.conninfo.conninfo_to_dict(url)
    return {
        "host": str(info.get("host") or "127.0.0.1"),
        "port": str(info.get("port") or "5432"),
        "user": str(info.get("user") or "postgres"),
        "dbname": WAREHOUSE_DATABASE,
    }


def seed_demo(settings: Settings) -> list[str]:
    """Create the demo account (once), a fresh token and the demo jobs; returns what to print."""
    from api.admin import DemoProject
    from api.admin import seed_demo as seed

    dbt_versions = sorted(settings.runner.dbt_versions)
    project = None
    if dbt_versions:
        project = DemoProject(demo_repository(), warehouse_fields(settings), dbt_versions[-1])
    account_id, token, job_ids = asyncio.run(seed(settings, DEMO_ACCOUNT, project))
    address = f"{settings.api.host}:{settings.api.port}"
    dbt_lines = (
        [
            f"dbt project {project.repository_url} (dbt {project.dbt_version}), warehouse database "
            f"{WAREHOUSE_DATABASE}: jobs jaffle-build (every 10 minutes), jaffle-ci, jaffle-after-build "
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
