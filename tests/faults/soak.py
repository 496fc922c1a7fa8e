"""The soak: the system on private servers under mixed load, a random fault every 30 s.

    python -m tests.faults.soak [--minutes 10] [--seed N]      (or: make soak)

Load: 300 cron jobs firing every minute over two accounts, and API-style runs queued at 5/s. Faults,
one at a time, drawn from: kill -9 and SIGSTOP (5 s) of each service type (a killed service is
started again after 1 s, as ``runplane up`` does), a restart of Postgres, Redis and RabbitMQ, and
poison messages. At the end it prints, per fault, the recovery time (fault to the first run queued
after it that succeeded) and the run-delay p99 of the minute around it, then the invariant counts
and the run-delay on-time split. Bounded; not part of ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import aio_pika
import psycopg

from runplane.adapters.bus import Topology
from tests.faults.world import WITH_STANDBYS, World, make_world

FAULT_EVERY = 30.0
TRIGGERS_PER_SECOND = 5
CRON_JOBS = 300


@dataclass
class Fault:
    name: str
    at: float
    recovery_s: float | None = None
    run_delay_p99_s: float | None = None


def restart_redis(world: World) -> None:
    world.redis.kill()
    time.sleep(2)  # the outage itself
    world.redis.start()


def _kill9(world: World, name: str) -> None:
    process = world.process(name)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    time.sleep(1)
    world.restart(name)


def _sigstop(world: World, name: str) -> None:
    process = world.process(name)
    process.send_signal(signal.SIGSTOP)
    time.sleep(5)
    process.send_signal(signal.SIGCONT)


def _poison(world: World) -> None:
    topology = Topology("runplane")

    async def publish() -> None:
        connection = await aio_pika.connect(world.rabbit.url)
        async with connection:
            channel = await connection.channel()
            for queue in (topology.assign, topology.pickup, topology.orchestrator):
                await channel.default_exchange.publish(aio_pika.Message(b"\xff\x00", type="Assign"), routing_key=queue)

    asyncio.run(publish())


def faults(world: World) -> dict[str, Callable[[], object]]:
    kinds: dict[str, Callable[[], object]] = {}
    for service in ("orchestrator", "queuer-worker-1", "scheduler", "dispatcher"):
        kinds[f"kill -9 {service}"] = functools.partial(_kill9, world, service)
        kinds[f"SIGSTOP {service}"] = functools.partial(_sigstop, world, service)
    kinds["restart postgres"] = lambda: world.postgres.restart(2)
    kinds["restart redis"] = lambda: restart_redis(world)
    kinds["restart rabbitmq"] = lambda: world.rabbit.restart(2)
    kinds["poison messages"] = lambda: _poison(world)
    return kinds


def _trigger_load(world: World, stop: threading.Event) -> None:
    """API-style runs at TRIGGERS_PER_SECOND, each with its own idempotency key (retried on failure)."""
    n = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            with psycopg.connect(world.database_url, autocommit=True, connect_timeout=2) as conn:
                while not stop.is_set():
                    n += 1
                    conn.execute(
                        "INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot,"
                        " scheduled_at) SELECT account_id, id, job_type, 'api', %s, true, now() FROM jobs"
                        " WHERE id = %s ON CONFLICT (idempotency_key) DO NOTHING",
                        (f"soak:{n}", world.jobs[n % len(world.jobs)]),
                    )
                    time.sleep(max(0.0, 1 / TRIGGERS_PER_SECOND - (time.monotonic() - started)))
                    started = time.monotonic()
        except psycopg.OperationalError:
            n -= 1  # the same key again once Postgres is back
            time.sleep(0.5)


def _measure(world: World, fault: Fault) -> None:
    with world.db() as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM min(finished_at)) FROM runs WHERE queued_at >= to_timestamp(%s) AND status = 10",
            (fault.at,),
        ).fetchone()
        if row and row[0] is not None:
            fault.recovery_s = round(float(row[0]) - fault.at, 2)
        delays = [
            float(r[0])
            for r in conn.execute(
                "SELECT extract(epoch FROM started_at - scheduled_at) FROM runs WHERE started_at IS NOT NULL"
                " AND scheduled_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
                (fault.at - 30, fault.at + 30),
            )
        ]
    if len(delays) >= 2:
        fault.run_delay_p99_s = round(statistics.quantiles(delays, n=100)[98], 2)


def summary(world: World, until: float) -> dict[str, object]:
    result = world.invariants(until=until)
    with world.db() as conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE d <= 25), count(*) FILTER (WHERE d > 25 AND d <= 60),"
            " count(*) FILTER (WHERE d > 60) FROM (SELECT extract(epoch FROM started_at - scheduled_at) AS d"
            " FROM runs WHERE started_at IS NOT NULL) s"
        ).fetchone()
        statuses: dict[int, int] = dict(conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
        superseded: dict[str, int] = dict(
            conn.execute("SELECT left(status_message, 120), count(*) FROM runs WHERE status = 30 GROUP BY 1").fetchall()
        )
    started = int(row[0]) if row else 0
    return {
        "invariants": {
            "missing_occurrences": len(result.missing),
            "duplicated_occurrences": len(result.duplicated),
            "not_terminal": len(result.not_terminal),
            "over_slots": len(result.over_slots),
            "two_running_of_one_job": len(result.job_overlap),
            "duplicate_keys": result.key_duplicates,
        },
        "runs_by_status": {str(k): v for k, v in statuses.items()},
        "cancelled_by_message": superseded,
        "on_time": {
            "started": started,
            "le_25s": round(row[1] / started, 4) if started and row else None,
            "25s_to_60s": round(row[2] / started, 4) if started and row else None,
            "gt_60s": round(row[3] / started, 4) if started and row else None,
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with make_world(WITH_STANDBYS, cron_jobs=CRON_JOBS) as world:
        kinds = faults(world)
        stop = threading.Event()
        load = threading.Thread(target=_trigger_load, args=(world, stop), daemon=True)
        load.start()
        end = time.time() + args.minutes * 60
        done: list[Fault] = []
        try:
            next_fault = time.time() + FAULT_EVERY
            while time.time() < end:
                time.sleep(max(0.0, min(next_fault, end) - time.time()))
                if time.time() >= end:
                    break
                name = rng.choice(sorted(kinds))
                fault = Fault(name, time.time())
                print(f"{time.strftime('%X')} fault: {name}", flush=True)
                kinds[name]()
                done.append(fault)
                next_fault = fault.at + FAULT_EVERY
            time.sleep(5)
        finally:
            stop.set()
            load.join(10)
        settle = time.time() + 90
        while time.time() < settle and world.invariants(until=end - 60).not_terminal:
            time.sleep(2)
        for fault in done:
            _measure(world, fault)
        report = {
            "seed": args.seed,
            "minutes": args.minutes,
            "faults": [fault.__dict__ for fault in done],
            **summary(world, until=end - 60),
            "services_exited": world.exited(),
        }
        print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
