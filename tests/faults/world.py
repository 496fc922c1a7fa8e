"""The fault suite: the whole system on private servers that the tests stop, restart and freeze.

One world per test module (servers, schema, services); each test injects one fault and checks the
invariants of ``tests.faults.invariants`` across it. Run alone with ``pytest -m faults``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from runplane.basics.cron import fires_between
from runplane.commands.migrate import migrate
from tests.faults.invariants import Db, Report, check
from tests.faults.servers import OwnPostgres, OwnRabbit, OwnRedis
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.processes import Services
from tests.support.queuer import scalar

EVERY_MINUTE = "* * * * *"
FAST = {
    "RUNPLANE_ORCHESTRATOR__HEARTBEAT_INTERVAL": "1.0",
    "RUNPLANE_ORCHESTRATOR__RECONCILE_INTERVAL": "2",
    "RUNPLANE_ORCHESTRATOR__CLAIM_TIMEOUT": "5",
    "RUNPLANE_DRAIN_SECONDS": "5",
    "RUNPLANE_DISPATCHER__LAUNCHER": "noop",
    "RUNPLANE_LOG_FORMAT": "text",
}


@dataclass
class World:
    postgres: OwnPostgres
    redis: OwnRedis
    rabbit: OwnRabbit
    services: Services
    database_url: str
    jobs: list[int]
    since: float  # cron fires after this must each have one run
    probes: dict[str, int] = field(default_factory=dict)  # service name -> probe port
    services_started: list[tuple[str, str]] = field(default_factory=list)

    def db(self) -> Db:
        return psycopg.connect(self.database_url, autocommit=True)

    def start(self, command: str, name: str) -> None:
        if (command, name) not in self.services_started:
            self.services_started.append((command, name))
        port = free_port()
        self.probes[name] = port
        self.services.start(command, name, RUNPLANE_PROBE_PORT=str(port))

    def exited(self) -> list[str]:
        """Services that exited and were not restarted."""
        latest = dict(self.services.processes)
        return [name for name, process in latest.items() if process.poll() is not None]

    def process(self, name: str) -> subprocess.Popen[bytes]:
        return dict(self.services.processes)[name]

    def restart(self, name: str) -> None:
        """Start a service again under its name, as ``runplane up`` does after it exits."""
        command = next(c for c, n in self.services_started if n == name)
        self.start(command, name)

    def ready(self, name: str) -> tuple[bool, list[str]]:
        """(ready, dependencies down) from the service's /ready."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.probes[name]}/ready", timeout=5) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
        except (urllib.error.URLError, OSError):
            return False, ["(no answer)"]
        return bool(body["ready"]), list(body["down"])

    def expected_fires(self, until: float) -> dict[int, list[int]]:
        return {job_id: fires_between(EVERY_MINUTE, "UTC", self.since, until) for job_id in self.jobs}

    def invariants(self, until: float) -> Report:
        with self.db() as conn:
            return check(conn, fires=self.expected_fires(until), until=until)

    def logs(self) -> str:
        return "\n".join(f"== {name}\n{self.services.log_text(name)[-3000:]}" for name, _ in self.services.processes)


def fire_queued(world: World, fire_ts: int) -> bool:
    """Every job has a run of ``fire_ts``, whatever its status."""
    with world.db() as conn:
        row = conn.execute(
            "SELECT count(DISTINCT job_id) FROM runs WHERE trigger = 'schedule' AND scheduled_at = to_timestamp(%s)",
            (fire_ts,),
        ).fetchone()
    return row is not None and int(row[0]) == len(world.jobs)


def fire_done(world: World, fire_ts: int) -> bool:
    """Every job's run of ``fire_ts`` exists and has finished."""
    with world.db() as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE trigger = 'schedule' AND scheduled_at = to_timestamp(%s)"
            " AND status IN (10, 20, 30)",
            (fire_ts,),
        ).fetchone()
    return row is not None and int(row[0]) == len(world.jobs)


def run_delay_p99(world: World, at: float) -> float | None:
    """p99 run delay (started − scheduled, or now − scheduled for a run not started yet) of the runs
    scheduled in the minute around ``at``; runs cancelled before they started count neither way."""
    with world.db() as conn:
        row = conn.execute(
            "SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM"
            " coalesce(started_at, clock_timestamp()) - scheduled_at)) FROM runs"
            " WHERE scheduled_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)"
            " AND NOT (status = 30 AND started_at IS NULL)",
            (at - 30, at + 30),
        ).fetchone()
    return None if row is None or row[0] is None else round(float(row[0]), 2)


def first_run_after(world: World, at: float) -> float | None:
    """Seconds from ``at`` to the first run queued after it that has finished (recovery time)."""
    with world.db() as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM min(finished_at)) FROM runs WHERE queued_at >= to_timestamp(%s) AND status = 10",
            (at,),
        ).fetchone()
    return None if row is None or row[0] is None else float(row[0]) - at


# The services every world runs; a module may ask for more (a standby orchestrator, two dispatchers).
BASIC = [
    ("orchestrator", "orchestrator"),
    ("queuer-worker", "queuer-worker-1"),
    ("queuer-worker", "queuer-worker-2"),
    ("scheduler", "scheduler"),
    ("dispatcher", "dispatcher"),
]
# BASIC with a standby orchestrator and a second dispatcher: what a process fault is survived with.
WITH_STANDBYS = [*BASIC, ("orchestrator", "orchestrator-standby"), ("dispatcher", "dispatcher-2")]


def probe_run(world: World, fault_at: float, *, timeout: float = 60) -> float:
    """Queue an API run as soon as Postgres takes writes; seconds from ``fault_at`` to its success."""
    key = f"probe:{fault_at}"

    def queued() -> bool:
        try:
            with world.db() as conn:
                conn.execute(
                    "INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot,"
                    " scheduled_at) SELECT account_id, id, job_type, 'api', %s, true, now() FROM jobs WHERE id = %s"
                    " ON CONFLICT (idempotency_key) DO NOTHING",
                    (key, world.jobs[0]),
                )
        except psycopg.OperationalError:
            return False
        return True

    wait_for(queued, timeout, what="Postgres to take the probe run", interval=0.3)

    def finished() -> float | None:
        with world.db() as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM finished_at) FROM runs WHERE idempotency_key = %s AND status = 10", (key,)
            ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    try:
        done = wait_for(finished, timeout, what="the probe run to succeed", interval=0.1)
    except AssertionError:
        print(world.logs())
        raise
    assert done is not None
    return done - fault_at


@contextlib.contextmanager
def make_world(services_to_start: list[tuple[str, str]], *, cron_jobs: int = 12) -> Iterator[World]:
    """Private servers, a migrated schema with ``cron_jobs`` every-minute jobs over two accounts, and
    the services."""
    base = Path(tempfile.mkdtemp(prefix="rp-faults-"))
    postgres = OwnPostgres(base / "pg")
    rabbit = OwnRabbit(base / "rabbit")
    redis = OwnRedis()
    services: Services | None = None
    try:
        postgres.init()
        redis.start()
        rabbit.start()
        database_url = postgres.url("runplane")
        with psycopg.connect(postgres.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE runplane")
        migrate(database_url)
        with psycopg.connect(database_url, autocommit=True) as conn:
            accounts = [
                int(r[0])
                for r in conn.execute(
                    "INSERT INTO accounts (name, run_slots) VALUES ('a', 4), ('b', 4) RETURNING id"
                ).fetchall()
            ]
            jobs = [
                int(r[0])
                for r in conn.execute(
                    "INSERT INTO jobs (account_id, name, job_type, steps, cron) SELECT"
                    " (%s::bigint[])[1 + g %% 2], 'job-' || g, 'deploy', ARRAY['true'], %s"
                    " FROM generate_series(1, %s) g RETURNING id",
                    (accounts, EVERY_MINUTE, cron_jobs),
                ).fetchall()
            ]
        env = {
            **__import__("os").environ,
            **FAST,
            "RUNPLANE_DATABASE_URL": database_url,
            "RUNPLANE_REDIS_URL": redis.url,
            "RUNPLANE_AMQP_URL": rabbit.url,
        }
        logs = base / "logs"
        logs.mkdir()
        services = Services(env, logs, database_url)
        services.with_api = False  # the noop launcher starts no runner, so no runner API is needed
        w = World(postgres, redis, rabbit, services, database_url, jobs, since=0.0)
        for command, name in services_to_start:
            w.start(command, name)
        # Every job is owned before the first minute counted.
        with w.db() as conn:
            wait_for(
                lambda: scalar(conn, "SELECT count(*) FROM job_ownership WHERE state = 'claimed'") == len(jobs),
                60,
                what="every job claimed",
            )
        w.since = time.time()
        yield w
    finally:
        if services is not None:
            services.stop_all()
        redis.kill()
        rabbit.destroy()
        postgres.destroy()
        shutil.rmtree(base, ignore_errors=True)
