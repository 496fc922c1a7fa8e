"""Arranging queuer scenarios: jobs inserted in bulk with SQL, services started as OS processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aio_pika
import psycopg

from runplane.adapters.bus import Topology
from runplane.basics.ownership import job_digest
from runplane.basics.settings import Settings
from tests.support.polling import eventually
from tests.support.wall_clock import FakeClock

Db = psycopg.Connection[tuple[Any, ...]]

# Fast heartbeats keep failover scenarios short; every bound in the tests is stated in intervals.
# One second, not less: on a loaded 2-core machine a live process can stall past 3 shorter intervals.
FAST = {
    "RUNPLANE_ORCHESTRATOR__HEARTBEAT_INTERVAL": "1.0",
    "RUNPLANE_ORCHESTRATOR__RECONCILE_INTERVAL": "2",
    "RUNPLANE_ORCHESTRATOR__CLAIM_TIMEOUT": "5",
    "RUNPLANE_DRAIN_SECONDS": "5",
}


def insert_accounts(db: Db, n: int, run_slots: int = 5) -> list[int]:
    rows = db.execute(
        "INSERT INTO accounts (name, run_slots) SELECT 'acct-' || g, %s FROM generate_series(1, %s) g RETURNING id",
        (run_slots, n),
    ).fetchall()
    return [int(r[0]) for r in rows]


def insert_jobs(
    db: Db,
    n: int,
    *,
    cron: str | None,
    timezone: str = "UTC",
    accounts: list[int] | None = None,
    grace: int = 300,
    job_type: str = "deploy",
) -> list[int]:
    """``n`` jobs spread round robin over ``accounts`` (one new account when none), in one statement."""
    accounts = accounts or insert_accounts(db, 1)
    rows = db.execute(
        """
        INSERT INTO jobs (account_id, name, job_type, steps, cron, timezone, missed_run_grace_seconds)
        SELECT (%(accounts)s::bigint[])[1 + (g %% cardinality(%(accounts)s::bigint[]))], 'job-' || g, %(job_type)s,
               ARRAY['true'], %(cron)s, %(tz)s, %(grace)s
        FROM generate_series(1, %(n)s) g
        ORDER BY g
        RETURNING id
        """,
        {"accounts": accounts, "job_type": job_type, "cron": cron, "tz": timezone, "grace": grace, "n": n},
    ).fetchall()
    return [int(r[0]) for r in rows]


def update_job(db: Db, job_id: int, *, at: float | None = None, **changes: Any) -> None:
    """Change scheduling fields the way the API does: bump the version in the same statement.

    ``at``: the instant the change takes effect in the schedule's history, for a test whose services
    run on a wall clock of its own (a FakeClock in the database's past); by default the database's."""
    sets = ", ".join(f"{column} = %({column})s" for column in changes)
    with db.transaction():
        db.execute(f"UPDATE jobs SET {sets}, version = version + 1 WHERE id = %(id)s", {**changes, "id": job_id})
        if at is not None:
            db.execute(
                "UPDATE job_schedules SET valid_from = to_timestamp(%s) WHERE job_id = %s AND valid_from = now()",
                (at, job_id),
            )


def scalar(db: Db, sql: str, params: tuple[object, ...] = ()) -> Any:
    """The first column of the first row of ``sql``; fails when there is no row."""
    row = db.execute(sql, params).fetchone()
    assert row is not None, f"no row for {sql}"
    return row[0]


def ownership(db: Db) -> dict[int, tuple[str | None, str]]:
    return {int(r[0]): (r[1], str(r[2])) for r in db.execute("SELECT job_id, worker_id, state FROM job_ownership")}


def claimed_counts(db: Db) -> dict[str, int]:
    rows = db.execute(
        "SELECT o.worker_id, count(*) FROM job_ownership o JOIN queuer_workers w USING (worker_id)"
        " WHERE o.state = 'claimed' AND w.state = 'alive' GROUP BY o.worker_id"
    ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def runs_at(db: Db, fire: float) -> dict[int, int]:
    """job_id -> cron runs queued for the fire at ``fire``."""
    rows = db.execute(
        "SELECT job_id, count(*) FROM runs WHERE trigger = 'schedule' AND scheduled_at = to_timestamp(%s)"
        " GROUP BY job_id",
        (fire,),
    )
    return {int(job_id): int(n) for job_id, n in rows}


async def fire_minute(clock: FakeClock, db: Db, minute: float, *, workers: int, expected: set[int]) -> dict[int, int]:
    """Move ``clock`` onto ``minute``: first just before it, until ``workers`` wait for it with nothing
    queued yet (not before its minute), then onto it. The runs queued for it, once ``expected`` have one."""
    clock.advance_to(minute - 0.2)
    await eventually(lambda: clock.sleepers_until(minute) == workers, 10, what="the workers to wait for the minute")
    assert runs_at(db, minute) == {}, "queued before its minute"
    clock.advance_to(minute)
    return await eventually(
        lambda: runs_at(db, minute), 10, until=lambda fired: set(fired) >= expected, what="the runs of the minute"
    )


def duplicate_keys(db: Db) -> int:
    """Runs per (job, scheduled_at) beyond the first: must always be 0."""
    row = db.execute(
        "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM runs WHERE trigger = 'schedule'"
        " GROUP BY job_id, scheduled_at) c"
    ).fetchone()
    assert row is not None
    return int(row[0])


class Cluster:
    """Orchestrators and queuer workers as OS processes; everything is killed and cleaned on exit."""

    def __init__(self, settings: Settings, env: dict[str, str], **overrides: str) -> None:
        self.settings = settings
        self.env = {**env, **FAST, **overrides}
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs = Path(tempfile.mkdtemp(prefix="rp-queuer-"))

    def start(self, command: str) -> subprocess.Popen[bytes]:
        with (self._logs / f"{command}-{len(self.procs)}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "runplane", command], env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        return proc

    def orchestrator(self) -> subprocess.Popen[bytes]:
        return self.start("orchestrator")

    def worker(self) -> subprocess.Popen[bytes]:
        return self.start("queuer-worker")

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in sorted(self._logs.iterdir()))

    @staticmethod
    def kill9(proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait(timeout=10)

    async def cleanup(self, db: Db, *, print_logs: bool = False) -> None:
        """Kill every process, then delete the scenario's queues (per-worker ones included); with
        ``print_logs`` (the test failed) print each process's log tail first."""
        self.stop_all()
        if print_logs or os.environ.get("RUNPLANE_TEST_LOGS"):
            print(self.logs())
        worker_ids = [str(r[0]) for r in db.execute("SELECT worker_id FROM queuer_workers")]
        await delete_queues(self.settings.bus_prefix, worker_ids)
        for path in self._logs.iterdir():
            path.unlink()
        os.rmdir(self._logs)


async def delete_queues(prefix: str, worker_ids: list[str]) -> None:
    topo = Topology(prefix)
    names = [topo.assign, topo.orchestrator, topo.pickup, topo.dead_letter, *(topo.worker(w) for w in worker_ids)]
    connection = await aio_pika.connect(Settings().amqp_url)
    try:
        for name in names:
            channel = await connection.channel()
            with contextlib.suppress(aio_pika.exceptions.AMQPError):  # never declared
                await channel.queue_delete(name)
            if not channel.is_closed:
                await channel.close()
    finally:
        await connection.close()


# A schedule that fires once a year: for scenarios about ownership, not firing.
NEVER_SOON = "0 0 1 1 *"


def workers_agree(db: Db) -> bool:
    """Every alive worker reports holding exactly the (job, version) pairs Postgres says it owns."""
    expected: dict[str, int] = {}
    counts: dict[str, int] = {}
    for worker_id, job_id, version in db.execute(
        "SELECT o.worker_id, o.job_id, j.version FROM job_ownership o JOIN jobs j ON j.id = o.job_id"
        " WHERE o.state = 'claimed'"
    ):
        expected[worker_id] = expected.get(worker_id, 0) ^ job_digest(job_id, version)
        counts[worker_id] = counts.get(worker_id, 0) + 1
    reported = db.execute("SELECT worker_id, jobs_owned, owned_digest FROM queuer_workers WHERE state = 'alive'")
    return all(counts.get(w, 0) == n and expected.get(w, 0) == digest for w, n, digest in reported)


def all_claimed(db: Db, n: int) -> bool:
    owners = ownership(db)
    return len(owners) == n and all(state == "claimed" for _, state in owners.values())


def within(counts: dict[str, int], mean: float, tolerance: float = 0.10) -> bool:
    return bool(counts) and all(abs(c - mean) <= mean * tolerance for c in counts.values())
