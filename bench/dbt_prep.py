"""Prep time of a dbt run on the local launcher: queued and dispatched → first dbt step started.

``python -m bench.dbt_prep [--runs 50] [--packages]`` starts the scheduler loop and a dispatcher
(local launcher, fork server; as root every run executes as a uid of its own) on a fresh database,
makes the example project a local git repository and an environment on the local Postgres, then
runs a job whose only step is ``dbt --version`` once (the first run: it fills the host's caches)
and ``--runs`` times measured, one after the other. Per run: prep time = the first step's
``started_at`` − the run's ``dispatched_at``, queued → first dbt command = that ``started_at`` − the
run's ``queued_at``, and the runner's own split (checkout, profile, deps) from its "prepared in" log
line. ``--packages`` gives the project two dbt packages as real projects have them: one from a git
repository (a local one standing in for a git host, which a run's network fence keeps it from
reaching on loopback) pinned in ``package-lock.yml``, and a local one. Prints JSON and a table, with
the load average before and after.

``--node-cache keeper`` gets the packages as a run Pod does with a node cache: from a keeper
(``runplane node-cache``, started here) over its socket, asked with the run's token; ``--node-cache
absent`` names a socket no keeper serves, as a Pod without one, so every run pays ``dbt deps``. Both
keep the dispatcher's uid for every run (``runner.local_uid`` -1): runs with uids of their own get
the host's keeper instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from bench.sandbox import REPO_ROOT, temporary_database, wait_until
from bench.services import RunplaneServices
from runplane.basics.settings import RunnerSettings
from tests.support.files import directory_for_all
from tests.support.git_servers import commit_all, macro_package, trusting
from tests.support.ports import free_port
from tests.support.records import create_dbt_environment

EXAMPLE = REPO_ROOT / "examples" / "jaffle_shop"
DBT_BIN = REPO_ROOT / ".venv-dbt" / "bin"
PREPARED = re.compile(r"prepared in ([\d.]+) s \(checkout ([\d.]+) s, profile ([\d.]+) s, deps ([\d.]+) s\)")


def repository(path: Path, package: Path | None) -> str:
    """The example project as a git repository; with ``package``, it and a local package, locked."""
    shutil.copytree(EXAMPLE, path)
    if package is not None:
        (path / "local_package").mkdir()
        (path / "local_package" / "dbt_project.yml").write_text(
            "name: local_package\nversion: '1.0'\nconfig-version: 2\n"
        )
        (path / "packages.yml").write_text(
            f"packages:\n  - git: file://{package}\n    revision: main\n  - local: local_package\n"
        )
        lock = subprocess.run(
            [str(DBT_BIN / "dbt"), "deps", "--lock"], cwd=path, capture_output=True, text=True, check=False,
            env={**os.environ, "DBT_SEND_ANONYMOUS_USAGE_STATS": "false"},
        )  # fmt: skip
        if lock.returncode != 0 or not (path / "package-lock.yml").is_file():
            raise RuntimeError(f"dbt deps --lock failed: {lock.stdout[-2000:]}")
    commit_all(path, "jaffle")
    return str(path)


def arrange(conn: psycopg.Connection[Any], repo: str, dbname: str, package: Path | None) -> int:
    """Account, project, environment and the job; its id."""
    account = conn.execute("INSERT INTO accounts (name, run_slots) VALUES ('bench', 10) RETURNING id").fetchone()
    assert account is not None
    variables = trusting(package) if package is not None else {}
    # `dbt --version` needs no warehouse: one on a port nothing serves (a fenced run may not reach the
    # control plane's own Postgres)
    environment = create_dbt_environment(conn, account[0], repo, dbname, "bench", variables=variables, port=free_port())
    job = conn.execute(
        """INSERT INTO jobs (account_id, name, job_type, steps, environment_id)
           VALUES (%s, 'prep', 'deploy', ARRAY['dbt --version'], %s) RETURNING id""",
        (account[0], environment),
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
        """SELECT r.status, r.status_message, extract(epoch FROM s.started_at - r.dispatched_at),
                  extract(epoch FROM s.started_at - r.queued_at)
             FROM runs r JOIN run_steps s ON s.run_id = r.id AND s.command = 'dbt --version' WHERE r.id = %s""",
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
    return {
        "queued_to_dbt": float(timing[3]),
        "prep": float(timing[2]),
        "prepared": total,
        "checkout": checkout,
        "profile": profile,
        "deps": deps,
    }


def host_caches(root: Path) -> dict[str, str]:
    """The host's caches inside the bench's directory (removed with it), where this checkout's runner
    has a package cache; a checkout without one keeps its runs' defaults (each run uid's own home)."""
    if "package_cache" not in RunnerSettings.model_fields:
        return {}
    return {
        "RUNPLANE_RUNNER__REPOSITORY_CACHE": str(root / "repositories"),
        "RUNPLANE_RUNNER__PACKAGE_CACHE": str(root / "dbt-packages"),
    }


PARTS = ("queued_to_dbt", "prep", "checkout", "profile", "deps")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def node_cache(root: Path, mode: str) -> dict[str, str]:
    """The runner's settings for ``--node-cache``: none (off), or a socket under ``root``."""
    if mode == "off":
        return {}
    return {"RUNPLANE_RUNNER__LOCAL_UID": "-1", "RUNPLANE_RUNNER__NODE_CACHE_SOCKET": str(root / "cache.sock")}


def measure(runs: int, packages: bool, node_cache_mode: str = "off") -> dict[str, Any]:
    if not (DBT_BIN / "dbt").is_file():
        raise SystemExit(f"dbt is not installed in {DBT_BIN}: run `make .venv-dbt`")
    # dbt deps reads the package as each run's own uid, whose steps see a /tmp of their own
    with temporary_database() as url, contextlib.ExitStack() as cleanup:
        work = directory_for_all("rp-bench-dbt-")
        cleanup.callback(shutil.rmtree, work, True)
        (work / "logs").mkdir()
        package = None
        if packages:
            (work / "git").mkdir()
            macro_package(work / "git")
            package = work / "git" / "bench_macros"
        repo = repository(work / "jaffle", package)
        dbname = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
        api_port, runner_port, rest_port = free_port(), free_port(), free_port()
        with psycopg.connect(url, autocommit=True) as conn:
            job_id = arrange(conn, repo, dbname, package)
            with RunplaneServices(
                url,
                work / "logs",
                RUNPLANE_DISPATCHER__LAUNCHER="local",
                RUNPLANE_RUNNER__DBT_VERSIONS=json.dumps({"bench": str(DBT_BIN)}),
                RUNPLANE_RUNNER__WORK_DIR="",
                **host_caches(work / "cache"),
                **node_cache(work / "node-socket", node_cache_mode),
                # Runners reach the control plane through the runner API only: an API on free ports.
                RUNPLANE_API__PORT=str(api_port),
                RUNPLANE_API__RUNNER_PORT=str(runner_port),
                RUNPLANE_API__REST_PORT=str(rest_port),
                RUNPLANE_RUNNER__API_ADDRESS=f"127.0.0.1:{runner_port}",
            ) as services:
                services.start("api", "api")
                if node_cache_mode == "keeper":
                    socket = work / "node-socket" / "cache.sock"
                    services.start("node-cache", "node-cache", "--socket", str(socket), "--root", str(work / "node"))
                    if not wait_until(socket.exists, timeout=30):
                        services.check_alive()
                        raise RuntimeError("the node cache keeper did not start")
                services.start("scheduler", "scheduler")
                services.start("dispatcher", "dispatcher")
                load_before = os.getloadavg()
                first = one_run(conn, job_id, services)  # fills the host's caches
                samples = [one_run(conn, job_id, services) for _ in range(runs)]
                load_after = os.getloadavg()
    parts = PARTS
    return {
        "runs": runs,
        "packages": packages,
        "node_cache": node_cache_mode,
        "uid_per_run": os.geteuid() == 0,
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in load_after],
        "first_run": first,
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
    parser.add_argument("--packages", action="store_true", help="a git and a local dbt package, locked")
    parser.add_argument(
        "--node-cache",
        choices=("off", "keeper", "absent"),
        default="off",
        help="packages from a node cache keeper as in a run Pod (keeper), or a Pod's socket with none (absent)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = measure(args.runs, args.packages, args.node_cache)
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    first = result["first_run"]
    print(
        f"\n{'part':<14} {'first s':>8} {'p50 s':>8} {'p99 s':>8} {'max s':>8}   "
        f"(later runs: {args.runs}; load average {result['load_average_before']} -> {result['load_average_after']})"
    )
    for part in PARTS:
        row = result[part]
        print(f"{part:<14} {first[part]:>8.3f} {row['p50']:>8.3f} {row['p99']:>8.3f} {row['max']:>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
