"""The runner in this process, through the runner API on the real Postgres: steps, logs, artifacts
and every outcome."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from runner.service import run as run_with_token
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from tests.support.polling import eventually
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run, rows, run_row

pytestmark = pytest.mark.usefixtures("_cleanup_bus", "runner_api")

TOKENS: dict[int, str] = {}


def starting(db: Conn, run_id: int) -> None:
    TOKENS[run_id] = make_starting(db, run_id)


async def run(settings: Settings, run_id: int) -> int:
    return await run_with_token(settings, run_id, TOKENS[run_id])


async def test_run_with_steps_logs_artifacts_and_timestamps(db: Conn, settings: Settings) -> None:
    account = create_account(db)
    job = create_job(
        db,
        account,
        steps=[
            'echo "first $RUNPLANE_RUN_ID $RUNPLANE_THREADS $GREETING"; mkdir -p target; '
            "printf '{\"ok\": true}' > target/run_results.json",
            "echo second >&2",
        ],
        environment={"GREETING": "hi"},
        threads=8,
    )
    run_id = queue_run(db, job)
    starting(db, run_id)

    assert await run(settings, run_id) == 0

    row = run_row(db, run_id)
    assert row["status"] == RunStatus.SUCCESS
    assert row["scheduled_at"] <= row["queued_at"] <= row["dispatched_at"] <= row["started_at"] <= row["finished_at"]
    steps = rows(db, "SELECT * FROM run_steps WHERE run_id = %s ORDER BY step_index", (run_id,))
    assert [(s["step_index"], s["status"], s["exit_code"]) for s in steps] == [(0, 10, 0), (1, 10, 0)]
    chunks = rows(db, "SELECT seq, step_index, text FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,))
    assert [c["seq"] for c in chunks] == list(range(1, len(chunks) + 1))
    by_step = {i: "".join(c["text"] for c in chunks if c["step_index"] == i) for i in (0, 1)}
    assert by_step == {0: f"first {run_id} 8 hi\n", 1: "second\n"}
    artifacts = rows(db, "SELECT path, step_index, content FROM artifacts WHERE run_id = %s", (run_id,))
    assert [(a["path"], a["step_index"], bytes(a["content"])) for a in artifacts] == [
        ("target/run_results.json", 0, b'{"ok": true}')
    ]


async def test_a_duplicate_runner_changes_nothing(db: Conn, settings: Settings) -> None:
    account = create_account(db)
    run_id = queue_run(db, create_job(db, account, steps=["echo once"]))
    starting(db, run_id)
    assert await run(settings, run_id) == 0
    before = run_row(db, run_id)
    assert await run(settings, run_id) == 0
    assert run_row(db, run_id) == before
    assert len(rows(db, "SELECT 1 FROM run_log_chunks WHERE run_id = %s", (run_id,))) == 1


async def test_failing_step_skips_the_rest(db: Conn, settings: Settings) -> None:
    account = create_account(db)
    run_id = queue_run(db, create_job(db, account, steps=["echo a", "exit 3", "echo never"]))
    starting(db, run_id)
    assert await run(settings, run_id) == 0
    row = run_row(db, run_id)
    assert (row["status"], row["status_message"]) == (RunStatus.ERROR, "step 2 failed with exit code 3: exit 3")
    steps = rows(db, "SELECT step_index, status, exit_code, skipped FROM run_steps WHERE run_id = %s", (run_id,))
    assert sorted((s["step_index"], s["status"], s["exit_code"], s["skipped"]) for s in steps) == [
        (0, 10, 0, False),
        (1, 20, 3, False),
        (2, 1, None, True),  # skipped: never started, not cancelled
    ]
    assert not any(
        "never" in r["text"] for r in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s", (run_id,))
    )


async def test_a_runner_started_with_sigint_ignored_still_interrupts_its_steps(db: Conn, settings: Settings) -> None:
    # nohup, or `&` in a script, starts a process with SIGINT ignored, and exec passes that on.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        job = create_job(db, create_account(db), steps=["sleep 30"], timeout_seconds=1)
        run_id = queue_run(db, job)
        starting(db, run_id)
        assert await run(settings, run_id) == 0
    finally:
        signal.signal(signal.SIGINT, previous)
    steps = rows(db, "SELECT end_reason FROM run_steps WHERE run_id = %s", (run_id,))
    assert [s["end_reason"] for s in steps] == ["SIGINT"]


async def test_overridden_steps_and_timeout(db: Conn, settings: Settings) -> None:
    account = create_account(db)
    job = create_job(db, account, steps=["echo job steps"])
    run_id = queue_run(db, job, overrides={"steps": ["echo overridden", "sleep 30"], "timeout_seconds": 1})
    starting(db, run_id)
    assert await run(settings, run_id) == 0
    row = run_row(db, run_id)
    assert (row["status"], row["status_message"]) == (RunStatus.ERROR, "timed out after 1 s")
    text = "".join(r["text"] for r in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s", (run_id,)))
    # The timeout interrupts first, as dbt needs: sleep dies of the SIGINT, and the step says so.
    assert text == "overridden\n\nrunplane: step 2 ended: SIGINT\n"
    steps = rows(db, "SELECT end_reason FROM run_steps WHERE run_id = %s ORDER BY step_index", (run_id,))
    assert [s["end_reason"] for s in steps] == ["", "SIGINT"]


async def test_memory_limit_error(db: Conn, settings: Settings) -> None:
    account = create_account(db, memory_mb=64)
    hog = f"{sys.executable} -c \"x = 'x' * (256 * 1024 * 1024); import time; time.sleep(30)\""
    run_id = queue_run(db, create_job(db, account, steps=[hog]))
    starting(db, run_id)
    assert await run(settings, run_id) == 0  # the hog sleeps 30 s more when nothing stops it
    row = run_row(db, run_id)
    assert (row["status"], row["status_message"]) == (RunStatus.ERROR, "memory limit error")


async def test_cancel_a_running_run(db: Conn, settings: Settings, tmp_path: Path) -> None:
    # The background sleep ignores SIGINT (as sh makes background jobs do): SIGTERM after the grace.
    runner_settings = settings.runner.model_copy(update={"interrupt_grace": 1.0, "cancel_grace": 1.0})
    settings = settings.model_copy(update={"runner": runner_settings})
    pid_file = tmp_path / "pid"
    account = create_account(db)
    run_id = queue_run(db, create_job(db, account, steps=[f"echo $$ > {pid_file}; sleep 60 & wait", "echo never"]))
    starting(db, run_id)
    runner = asyncio.create_task(run(settings, run_id))
    try:
        await eventually(lambda: pid_file.exists() and pid_file.read_text().strip(), 20, what="step started")
        step_pid = int(pid_file.read_text())
        db.execute("UPDATE runs SET cancel_requested_at = now() WHERE id = %s", (run_id,))
        assert await asyncio.wait_for(runner, timeout=10) == 0  # the step's sleep had a minute left
    finally:
        if not runner.done():
            runner.cancel()
    row = run_row(db, run_id)
    assert row["status"] == RunStatus.CANCELLED
    steps = rows(
        db, "SELECT status, skipped, end_reason FROM run_steps WHERE run_id = %s ORDER BY step_index", (run_id,)
    )
    assert (steps[0]["status"], steps[1]["skipped"]) == (RunStatus.CANCELLED, True)
    assert "SIGINT" in steps[0]["end_reason"]
    assert live_in_group(step_pid) == []  # the whole group, the background sleep included, is gone


def live_in_group(pgid: int) -> list[int]:
    """Processes of the group that still run (zombies waiting for their reaper do not count)."""
    live = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                live.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return live


async def test_artifacts_are_kept_per_step_and_a_file_over_the_limit_is_skipped_with_a_line_in_the_log(
    db: Conn, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("runner.artifacts.ARTIFACT_MAX_BYTES", 1000)
    account = create_account(db)
    write = "mkdir -p target && printf '{\"step\": %s}' > target/run_results.json"
    steps = [write % 1, write % 2 + " && head -c 2000 /dev/zero | tr '\\0' x > target/manifest.json"]
    run_id = queue_run(db, create_job(db, account, steps=steps))
    starting(db, run_id)
    assert await run(settings, run_id) == 0
    kept = rows(db, "SELECT path, step_index, content FROM artifacts WHERE run_id = %s ORDER BY 1, 2", (run_id,))
    assert [(a["path"], a["step_index"], bytes(a["content"])) for a in kept] == [
        ("target/run_results.json", 0, b'{"step": 1}'),
        ("target/run_results.json", 1, b'{"step": 2}'),
    ]
    text = "".join(r["text"] for r in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s", (run_id,)))
    assert "runplane: target/manifest.json not kept: 2000 bytes is over the 1000 bytes limit of an artifact" in text
