"""Prep time of a dbt run on the local launcher: dispatch → first dbt step started.

``python -m bench.dbt_prep [--runs 50] [--packages]`` starts the scheduler loop and a dispatcher
(local launcher, fork server) on a fresh database, makes the example project a local git
repository and an environment on the local Postgres, then runs a job whose only step is
``dbt --version`` once to warm the host's repository cache and ``--runs`` times measured, one after
the other. Per run: prep time = the first step's ``started_at`` − the run's ``dispatched_at``, and
the runner's own split of it (checkout, profile, deps) from its "prepared in" log line.
``--packages`` adds a local dbt package, so every run also runs ``dbt deps``. Prints JSON and a table.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from bench.sandbox import REPO_ROOT, temporary_database, wait_until
from bench.services import RunplaneServices
from tests.support.ports import free_port

EXAMPLE = REPO_ROOT / "examples" / "jaffle_shop"
DBT_BIN = REPO_ROOT / ".venv-dbt" / "bin"
PREPARED = re.compile(r"prepared in ([\d.]+) s \(checkout ([\d.]+) s, profile ([\d.]+) s, deps ([\d.]+) s\)")


def repository(path: Path, packages: bool) -> str:
    shutil.copytree(EXAMPLE, path)
    if packages:
        (path / "local_package").mkdir()
        (path / "local_package" / "dbt_project.yml").write_text(
            "name: local_package\nversion: '1.0'\nconfig-version: 2\n"
        )
        (path / "packages.yml").write_text("packages:\n  - local: local_package\n")
    identity = ["-c", "user.name=bench", "-c", "user.email=bench@runplane.invalid"]
    for args in (["init", "-q", "--initial-branch=main"], ["add", "-A"], [*identity, "commit", "-q", "-m", "jaffle"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)
    return str(path)


def arrange(conn: psycopg.Connection[Any], repo: str, dbname: str) -> int:
    """Account, project, environment and the job; its id."""
    account = conn.execute("INSERT INTO accounts (name, run_slots) VALUES ('bench', 10) RETURNING id").fetchone()
    assert account is not None
    project = conn.execute(
        "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'jaffle', %s) RETURNING id",
        (account[0], repo),
    ).fetchone()
    assert project is not None
    connection = json.dumps({"host": "127.0.0.1", "port": "5432", "user": "postgres", "dbname": dbname})
    environment = conn.execute(
        """INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, git_branch,
                                     adapter_type, connection, schema_name)
           VALUES (%s, %s, 'prod', 'deployment', 'bench', 'main', 'postgres', %s, 'analytics') RETURNING id""",
        (account[0], project[0], connection),
    ).fetchone()
    assert environment is not None
    job = conn.execute(
        """INSERT INTO jobs (account_id, name, job_type, steps, environment_id)
           VALUES (%s, 'prep', 'deploy', ARRAY['dbt --version'], %s) RETURNING id""",
        (account[0], environment[0]),
    ).fetchone()
    assert job is not None
    return int(job[0])


def one_run(conn: psycopg.Connection[Any], job_id: int, services: RunplaneServices) -> dict[str, float]:
    row = conn.execute(
        """INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at)
           SELECT account_id, id, job_type, 'api', %s, true, clock_timestamp() FROM jobs WHERE id = %s RETURNING id""",
        (f"bench:{uuid.uuid4().hex}", job_id),
    ).fetchone()
    assert row is not None
    run_id = int(row[0])

    def finished() -> bool:
        services.check_alive()
        status = conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,)).fetchone()
        return status is not None and status[0] in (10, 20, 30)

    if not wait_until(finished, timeout=180, interval=0.1):
        raise RuntimeError(f"run {run_id} did not finish")
    timing = conn.execute(
        """SELECT r.status, r.status_message, extract(epoch FROM s.started_at - r.dispatched_at)
             FROM runs r JOIN run_steps s ON s.run_id = r.id AND s.step_index = 0 WHERE r.id = %s""",
        (run_id,),
    ).fetchone()
    assert timing is not None
    if timing[0] != 10:
        raise RuntimeError(f"run {run_id} failed: {timing[1]}")
    log = "".join(
        r[0] for r in conn.execute("SELECT text FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,))
    )
    prepared = PREPARED.search(log)
    assert prepared is not None, log
    total, checkout, profile, deps = (float(v) for v in prepared.groups())
    return {"prep": float(timing[2]), "prepared": total, "checkout": checkout, "profile": profile, "deps": deps}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def measure(runs: int, packages: bool) -> dict[str, Any]:
    if not (DBT_BIN / "dbt").is_file():
        raise SystemExit(f"dbt is not installed in {DBT_BIN}: run `make .venv-dbt`")
    with temporary_database() as url, tempfile.TemporaryDirectory(prefix="rp-bench-dbt-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # the project is cloned by each run's own uid (a root dispatcher's default)
        (work / "logs").mkdir()
        repo = repository(work / "jaffle", packages)
        dbname = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
        api_port, runner_port, rest_port = free_port(), free_port(), free_port()
        with psycopg.connect(url, autocommit=True) as conn:
            job_id = arrange(conn, repo, dbname)
            with RunplaneServices(
                url,
                work / "logs",
                RUNPLANE_DISPATCHER__LAUNCHER="local",
                RUNPLANE_RUNNER__DBT_VERSIONS=json.dumps({"bench": str(DBT_BIN)}),
                RUNPLANE_RUNNER__WORK_DIR="",
                # Runners reach the control plane through the runner API only: an API on free ports.
                RUNPLANE_API__PORT=str(api_port),
                RUNPLANE_API__RUNNER_PORT=str(runner_port),
                RUNPLANE_API__REST_PORT=str(rest_port),
                RUNPLANE_RUNNER__API_ADDRESS=f"127.0.0.1:{runner_port}",
            ) as services:
                services.start("api", "api")
                services.start("scheduler", "scheduler")
                services.start("dispatcher", "dispatcher")
                first = one_run(conn, job_id, services)  # clones into the host's cache
                samples = [one_run(conn, job_id, services) for _ in range(runs)]
    parts = ("prep", "checkout", "profile", "deps")
    return {
        "runs": runs,
        "packages": packages,
        "first_run_clone": first,
        "samples": samples,
        **{
            part: {
                "p50": round(statistics.median(s[part] for s in samples), 4),
                "p90": round(percentile([s[part] for s in samples], 0.90), 4),
                "p99": round(percentile([s[part] for s in samples], 0.99), 4),
                "max": round(max(s[part] for s in samples), 4),
            }
            for part in parts
        },
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dbt_prep", description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--packages", action="store_true", help="a local dbt package: every run runs dbt deps")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = measure(args.runs, args.packages)
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    print(f"\n{'part':<10} {'p50 s':>8} {'p99 s':>8} {'max s':>8}   (cached repository, {args.runs} runs)")
    for part in ("prep", "checkout", "profile", "deps"):
        print(f"{part:<10} {result[part]['p50']:>8.3f} {result[part]['p99']:>8.3f} {result[part]['max']:>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
