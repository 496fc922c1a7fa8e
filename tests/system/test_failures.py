"""Things dying on purpose, as real processes: dispatchers, runners, Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from runplane.basics import redis_keys
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from tests.support.polling import wait_for
from tests.support.processes import OwnRedis, Services, publish_pickup
from tests.support.records import Conn, all_terminal, create_account, create_job, queue_run, rows, run_row

pytestmark = pytest.mark.slow

LOCK_TTL_MS = 2000


def recording_jobs(db: Conn, account: int, record: Path, count: int) -> list[int]:
    """Runs whose one step appends the run id to ``record``: a run started twice shows up twice."""
    return [
        queue_run(db, create_job(db, account, name=f"job {i}", steps=[f"echo $RUNPLANE_RUN_ID >> {record}"]))
        for i in range(count)
    ]


def started_once(record: Path, runs: list[int]) -> bool:
    lines = record.read_text().split() if record.exists() else []
    return sorted(int(line) for line in lines) == sorted(runs)


@pytest.fixture
def row_holder(settings: Settings) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """The test's own transaction, to hold an account row ``FOR UPDATE``."""
    conn = psycopg.connect(settings.database_url)
    try:
        yield conn
    finally:
        conn.close()


def waiting_for_a_row_lock(database_url: str) -> bool:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return row is not None and row[0] > 0


def hold_dispatcher_in_the_lock(
    settings: Settings, services: Services, row_holder: psycopg.Connection[tuple[object, ...]], account: int
) -> tuple[subprocess.Popen[bytes], float]:
    """Start a dispatcher and catch it holding the account's Redis lock, waiting for the account row.

    ``row_holder`` keeps the row locked, so the dispatcher stays inside its pass (lock taken,
    transaction open, waiting in Postgres for the row) until the test rolls back. Returns the
    process and when its Redis lock expires.
    """
    key = redis_keys.account_lock(settings.redis_prefix, account)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        row_holder.execute("SELECT id FROM accounts WHERE id = %s FOR UPDATE", (account,))
        dispatcher = services.start("dispatcher", name="dispatcher-a")
        publish_pickup(settings.amqp_url, settings.bus_prefix, account)
        wait_for(lambda: client.exists(key), timeout=30, interval=0.01, what="the dispatcher to take the lock")
        expires_at = time.time() + client.pttl(key) / 1000
        wait_for(
            lambda: waiting_for_a_row_lock(settings.database_url),
            timeout=30,
            interval=0.01,
            what="the dispatcher's transaction to wait for the account row",
        )
        return dispatcher, expires_at
    finally:
        client.close()


def test_kill_9_a_dispatcher_holding_the_lock(
    db: Conn, settings: Settings, services: Services, tmp_path: Path, row_holder: psycopg.Connection[tuple[object, ...]]
) -> None:
    services.env["RUNPLANE_DISPATCHER__LOCK_TTL_MS"] = str(LOCK_TTL_MS)
    account = create_account(db, run_slots=3)
    record = tmp_path / "started"
    runs = recording_jobs(db, account, record, 3)
    dispatcher, expires_at = hold_dispatcher_in_the_lock(settings, services, row_holder, account)
    dispatcher.kill()
    dispatcher.wait()
    row_holder.rollback()
    services.start("scheduler")
    services.start("dispatcher", name="dispatcher-b")
    wait_for(lambda: all_terminal(db, runs), timeout=60, what="runs to finish")
    finished = [run_row(db, r) for r in runs]
    assert [r["status"] for r in finished] == [RunStatus.SUCCESS] * 3
    assert min(r["dispatched_at"].timestamp() for r in finished) >= expires_at - 0.05  # only after the expiry
    assert all(r["launch_attempts"] == 1 for r in finished)
    assert started_once(record, runs)


def test_a_dispatcher_stopped_past_its_lock_expiry_changes_nothing_when_resumed(
    db: Conn, settings: Settings, services: Services, tmp_path: Path, row_holder: psycopg.Connection[tuple[object, ...]]
) -> None:
    services.env["RUNPLANE_DISPATCHER__LOCK_TTL_MS"] = str(LOCK_TTL_MS)
    account = create_account(db, run_slots=3)
    record = tmp_path / "started"
    runs = recording_jobs(db, account, record, 3)
    dispatcher, expires_at = hold_dispatcher_in_the_lock(settings, services, row_holder, account)
    stopped = dispatcher.pid
    os.kill(stopped, signal.SIGSTOP)
    try:
        row_holder.rollback()  # the stopped dispatcher now holds the row inside a transaction it cannot finish
        services.start("scheduler")
        services.start("dispatcher", name="dispatcher-b")
        wait_for(lambda: all_terminal(db, runs), timeout=60, what="runs to finish")
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_for(
        lambda: "dispatch pass aborted" in services.log_text("dispatcher-a"),
        timeout=30,
        what="the resumed dispatcher to find its transaction gone",
    )
    assert dispatcher.poll() is None  # it carries on, no crash
    finished = [run_row(db, r) for r in runs]
    assert [r["status"] for r in finished] == [RunStatus.SUCCESS] * 3
    assert min(r["dispatched_at"].timestamp() for r in finished) >= expires_at - 0.05
    assert all(r["launch_attempts"] == 1 for r in finished)
    assert started_once(record, runs)


def test_kill_9_a_runner_the_run_fails_runner_lost_and_is_retried(db: Conn, services: Services, tmp_path: Path) -> None:
    services.env.update(
        RUNPLANE_RUNNER__LEASE_SECONDS="2",
        RUNPLANE_RUNNER__HEARTBEAT_INTERVAL="0.5",
        RUNPLANE_RUNNER__RETRY_BACKOFF_BASE="0.2",
        RUNPLANE_RUNNER__RETRY_BACKOFF_CAP="0.5",
    )
    account = create_account(db)
    marker, step_pid = tmp_path / "first-attempt", tmp_path / "step-pid"
    step = f"if [ ! -f {marker} ]; then touch {marker}; echo $$ > {step_pid}; sleep 60; fi; echo finished"
    job = create_job(db, account, steps=[step], retry_max_attempts=1)
    run_id = queue_run(db, job)
    services.start("scheduler")
    services.start("dispatcher")
    wait_for(lambda: step_pid.exists() and step_pid.read_text().strip(), timeout=60, what="the step to start")
    step_process = int(step_pid.read_text())
    services.forget_pid_later(step_process)  # killed at the end should this test fail
    runner_pid = int(run_row(db, run_id)["pod_name"].removeprefix("pid:"))
    os.kill(runner_pid, signal.SIGKILL)
    # The step dies with its runner (its guard kills the group), not 60 s later or never.
    wait_for(lambda: not _alive(step_process), timeout=5, what="the step to die with its runner")

    # Reaped once its 2 s lease expired: nothing else ends a run whose runner is gone.
    wait_for(lambda: run_row(db, run_id)["status"] == RunStatus.ERROR, timeout=30, what="the reaper")
    lost = run_row(db, run_id)
    assert lost["status_message"] == "runner lost"
    step_row = rows(db, "SELECT status, end_reason, finished_at FROM run_steps WHERE run_id = %s", (run_id,))[0]
    assert (step_row["status"], step_row["end_reason"]) == (RunStatus.ERROR, "runner lost")
    assert step_row["finished_at"] is not None
    retry = wait_for(
        lambda: rows(db, "SELECT * FROM runs WHERE parent_run_id = %s AND status = 10", (run_id,)),
        timeout=60,
        what="the retry to succeed",
    )[0]
    assert (retry["trigger"], retry["attempt"]) == ("retry", 2)
    text = "".join(r["text"] for r in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s", (retry["id"],)))
    assert text == "finished\n"


def test_redis_stopped_and_restarted_during_dispatch(db: Conn, services: Services, tmp_path: Path) -> None:
    own = OwnRedis()
    own.start()
    try:
        services.env["RUNPLANE_REDIS_URL"] = own.url
        account = create_account(db, run_slots=10)
        record = tmp_path / "started"
        before = recording_jobs(db, account, record, 2)
        services.start("scheduler")
        dispatchers = [services.start("dispatcher", name=f"dispatcher-{i}") for i in range(2)]
        wait_for(lambda: all_terminal(db, before), timeout=60, what="runs before the outage")

        own.kill()
        # Runs of an account no dispatch pass can have locked before Redis died: a pass that took the
        # first account's lock just before may still start that account's new runs (its lock is held).
        during = recording_jobs(db, create_account(db, run_slots=10), record, 4)
        wait_for(
            lambda: all("redis unavailable" in services.log_text(f"dispatcher-{i}") for i in range(2)),
            timeout=30,
            what="both dispatchers to notice",
        )
        time.sleep(1.0)  # the outage lasts: nothing may dispatch meanwhile
        assert {run_row(db, r)["status"] for r in during} == {RunStatus.QUEUED}
        assert all(d.poll() is None for d in dispatchers)  # paused, not crashed

        own.start()
        wait_for(lambda: all_terminal(db, during), timeout=60, what="runs after Redis is back")
        assert all(d.poll() is None for d in dispatchers)
        finished = [run_row(db, r) for r in before + during]
        assert [r["status"] for r in finished] == [RunStatus.SUCCESS] * 6
        assert all(r["launch_attempts"] == 1 for r in finished)
        assert started_once(record, before + during)
        for i in range(2):  # warnings are rate limited: no crash loop, no log flood
            assert services.log_text(f"dispatcher-{i}").count("redis unavailable") <= 5
    finally:
        own.kill()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
