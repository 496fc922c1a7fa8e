"""`runplane status --once --json` agrees with the database."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import psycopg

from runplane.commands.status import snapshot

Conn = psycopg.Connection[tuple[object, ...]]


def _arrange(db: Conn) -> None:
    db.execute("INSERT INTO accounts (id, name, run_slots) VALUES (1, 'a', 3), (2, 'b', 2)")
    db.execute(
        "INSERT INTO jobs (id, account_id, name, job_type, steps) VALUES (1, 1, 'j1', 'deploy', ARRAY['true']),"
        " (2, 2, 'j2', 'ci', ARRAY['true'])"
    )
    # Started runs with run delays of 5, 10, 30 and 90 seconds: two on time, one 25-60 s, one late.
    for i, delay in enumerate([5, 10, 30, 90]):
        db.execute(
            """INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
                   scheduled_at, queued_at, dispatched_at, started_at, finished_at)
               VALUES (1, 1, 'deploy', 10, 'schedule', %s, true,
                   now() - make_interval(secs => 200), now() - make_interval(secs => 199.5),
                   now() - make_interval(secs => 200 - %s + 1), now() - make_interval(secs => 200 - %s), now())""",
            (f"k{i}", delay, delay),
        )
    db.execute(
        """INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
               scheduled_at, queued_at, dispatched_at, started_at)
           VALUES (1, 1, 'deploy', 3, 'api', 'r1', true, now(), now(), now(), now())"""
    )
    db.execute(
        """INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
               scheduled_at, queued_at, waiting_reason)
           VALUES (1, 1, 'deploy', 1, 'api', 'q1', true, now() - interval '1 minute', now() - interval '40 s',
                   'job_already_running'),
                  (2, 2, 'ci', 1, 'ci', 'q2', false, now() + interval '1 hour', now(), '')"""
    )
    db.execute("INSERT INTO queuer_workers (worker_id, last_heartbeat_at) VALUES ('w1', now() - interval '3 s')")
    db.execute(
        "INSERT INTO job_ownership (job_id, worker_id, state, term, clock, version, fires_after)"
        " VALUES (1, 'w1', 'claimed', 4, 9, 1, 0)"
    )
    db.execute("UPDATE orchestrator_term SET term = 4, leader = 'o1', elected_at = now()")
    db.execute(
        "INSERT INTO dispatchers (dispatcher_id, cluster, launcher, dispatched) VALUES ('d1', 'local', 'local', 7)"
    )


def test_status_json_agrees_with_the_database(db: Conn, database_url: str) -> None:
    _arrange(db)
    out = subprocess.run(
        [sys.executable, "-m", "runplane", "status", "--once", "--json"],
        env={"RUNPLANE_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    snap = json.loads(out)
    assert snap["queue"]["queued"] == 2
    assert snap["queue"]["queued_due"] == 1
    assert 39 <= snap["queue"]["oldest_queued_age_seconds"] <= 60
    assert snap["queue"]["running"] == 1
    assert snap["queue"]["slots_in_use"] == 1
    assert snap["queue"]["slots_total"] == 5
    assert snap["on_time"] == {"started": 5, "le_25s": 0.6, "25s_to_60s": 0.2, "gt_60s": 0.2}
    assert snap["delays_seconds"]["prep_time_p50"] == 1.0  # four runs prepared in 1 s, one in 0 s
    assert snap["finished"] == {"success": 4}
    assert snap["orchestrator"]["term"] == 4
    assert [(w["worker_id"], w["jobs_owned"]) for w in snap["workers"]] == [("w1", 1)]
    assert 2.5 <= snap["workers"][0]["heartbeat_age_seconds"] < 30
    assert [(d["dispatcher_id"], d["dispatched"]) for d in snap["dispatchers"]] == [("d1", 7)]
    waiting = {(w["account_id"], w["waiting_reason"]): w["runs"] for w in snap["waiting"]}
    assert waiting == {(1, "job_already_running"): 1, (2, None): 1}


def test_run_delay_percentiles_follow_the_rows(db: Conn, database_url: str) -> None:
    _arrange(db)
    delays = snapshot(database_url)["delays_seconds"]
    # Run delays 5, 10, 30, 90 and ~0 (the running run): median 10.
    assert abs(delays["run_delay_p50"] - 10) < 0.5
    assert 85 < delays["run_delay_p99"] <= 90


async def test_status_shows_the_dead_letter_queue(database_url: str, prefix: str, _cleanup_bus: None) -> None:
    from runplane.adapters.bus import AmqpBus, Topology
    from runplane.basics.settings import Settings
    from runplane.v1 import bus_pb2

    bus = await AmqpBus.connect(Settings().amqp_url)
    try:
        await bus.publish(Topology(prefix).dead_letter, bus_pb2.Pickup(account_id=1))
        await bus.publish(Topology(prefix).dead_letter, bus_pb2.Pickup(account_id=2))
    finally:
        await bus.close()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runplane", "status", "--once", "--json",
        env={"RUNPLANE_DATABASE_URL": database_url, "RUNPLANE_BUS_PREFIX": prefix, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    assert json.loads(out)["dead_letters"] == {"queue": f"{prefix}.dead-letter", "messages": 2}


def test_status_sets_the_forecast_beside_the_runs_that_were_due_and_the_pools(db: Conn, database_url: str) -> None:
    _arrange(db)  # four cron runs due 200 s ago, all started
    current = int(time.time()) // 60 * 60
    row = db.execute("SELECT extract(epoch FROM min(scheduled_at))::bigint FROM runs WHERE trigger = 'schedule'")
    due_minute = int(str((row.fetchone() or (0,))[0])) // 60 * 60
    db.execute(
        "INSERT INTO demand_forecast (worker_id, dbt_version, memory_mb, minute, fires) VALUES"
        " ('w1', '', 1024, %s, 4), ('w1', '', 1024, %s, 9), ('w2', '1.10', 4096, %s, 3)",
        (due_minute, current + 120, current + 120),
    )
    db.execute(
        "INSERT INTO pool_runners (name, cluster, pool, token_hash, assigned_at) VALUES"
        " ('p1', 'east', 'small', 'a', NULL), ('p2', 'east', 'small', 'b', NULL), ('p3', 'east', 'small', 'c', now())"
    )
    snap = snapshot(database_url)
    by_minute = {row["minute"]: row for row in snap["demand"]}
    text = time.strftime("%H:%M", time.gmtime(due_minute))
    assert by_minute[text] == {"minute": text, "forecast": 4, "due": 4, "started": 4}
    ahead = time.strftime("%H:%M", time.gmtime(current + 120))
    assert by_minute[ahead] == {"minute": ahead, "forecast": 12, "due": 0, "started": 0}
    assert len(snap["demand"]) == 5 + 5  # five minutes back, the current one and four ahead
    assert snap["pools"] == [{"cluster": "east", "pool": "small", "idle": 2, "given": 1}]
