"""The ceiling: how many run-shaped rows per second Postgres itself commits on this machine, one row
per transaction, measured with ``pgbench`` and a custom script against runplane's ``runs`` table
(with its indexes, unique idempotency_key and foreign keys) in a temporary database."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from bench.records import Measurement, Unavailable
from bench.sandbox import temporary_database

CLIENTS = 4
THREADS = 2

# One queued cron run per transaction, as a queuer inserts it; the key is unique per row.
SCRIPT = """\
INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at)
VALUES (:account_id, :job_id, 'deploy', 'schedule', 'sched:' || gen_random_uuid(), true, now());
"""

_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)


def find_pgbench() -> str | None:
    return shutil.which("pgbench") or ("/usr/bin/pgbench" if Path("/usr/bin/pgbench").exists() else None)


def require_pgbench() -> None:
    if find_pgbench() is None:
        raise Unavailable("pgbench is not installed (Debian: postgresql-client)")


def measure_ceiling(seconds: int) -> list[Measurement]:
    """One pgbench run of ``seconds``; transactions (= run rows) committed per second."""
    require_pgbench()
    pgbench = str(find_pgbench())
    with temporary_database() as url, tempfile.TemporaryDirectory(prefix="bench-pgbench-") as tmp:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "INSERT INTO accounts (name, run_slots) VALUES ('ceiling', 1000) RETURNING id"
            ).fetchone()
            assert row is not None
            account_id = row[0]
            row = conn.execute(
                "INSERT INTO jobs (account_id, name, job_type, steps)"
                " VALUES (%s, 'ceiling', 'deploy', '{true}') RETURNING id",
                (account_id,),
            ).fetchone()
            assert row is not None
            job_id = row[0]
        script = Path(tmp) / "insert_run.sql"
        script.write_text(SCRIPT)
        info = psycopg.conninfo.conninfo_to_dict(url)
        command = [
            pgbench,
            "--no-vacuum",
            "--protocol=prepared",
            f"--client={CLIENTS}",
            f"--jobs={THREADS}",
            f"--time={seconds}",
            f"--file={script}",
            f"--define=account_id={account_id}",
            f"--define=job_id={job_id}",
            f"--host={info.get('host', '127.0.0.1')}",
            f"--port={info.get('port', 5432)}",
            f"--username={info.get('user', 'postgres')}",
            str(info["dbname"]),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        match = _TPS.search(done.stdout)
        if not match:
            raise RuntimeError(f"no tps in pgbench output: {done.stdout[-500:]}")
    return [
        Measurement("run_inserts_per_s", float(match.group(1)), "1/s", note=f"pgbench, {CLIENTS} clients, 1 row/tx")
    ]
