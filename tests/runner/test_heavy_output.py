"""A step that writes as fast as it can keeps its run: the runner, a process of its own as in
production, renews its lease while 100 MiB of output goes to the runner API, and the log holds
every byte of it, in order."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from tests.support.processes import Services
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run, rows, run_row

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("_cleanup_bus", "runner_api")]

LINE = "heavy output: a line written as fast as the pipe takes it, again and again\n"
TOTAL_BYTES = 100 * 1024 * 1024
LINES = TOTAL_BYTES // len(LINE)
LEASE_SECONDS = 6.0


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """A short lease, so a runner that stops renewing it is lost within the test."""
    runner = settings.runner.model_copy(update={"lease_seconds": LEASE_SECONDS, "heartbeat_interval": 1.0})
    return settings.model_copy(update={"runner": runner})


async def test_a_step_writing_100_mib_as_fast_as_it_can_keeps_its_run_and_its_whole_log(
    db: Conn, settings: Settings, service_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    command = f'python3 -c "import sys; sys.stdout.write({LINE!r} * {LINES}); sys.stdout.flush()"'
    run_id = queue_run(db, create_job(db, create_account(db), steps=[command], timeout_seconds=600))
    token = make_starting(db, run_id)
    env = {**service_env, "RUNPLANE_RUNNER__LOCAL_UID": "-1", "RUNPLANE_LOG_LEVEL": "WARNING"}
    reaper = Services({**env, "RUNPLANE_SCHEDULER__INTERVAL": "0.2"}, tmp_path, database_url)
    reaper.with_api = False
    reaper.start("scheduler")  # the real reaper: a run whose lease expires ends as "runner lost"
    started = time.monotonic()
    runner = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runplane", "runner", "--run-id", str(run_id), "--token-file", "-",
        env=env, stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, stderr = await asyncio.wait_for(runner.communicate(f"{token}\n".encode()), timeout=150)
    finally:
        if runner.returncode is None:
            runner.kill()
            await runner.wait()
        reaper.stop_all()
    elapsed = time.monotonic() - started

    row = run_row(db, run_id)
    assert row["status"] == RunStatus.SUCCESS, (row["status_message"], stderr.decode()[-3000:])
    assert runner.returncode == 0
    stored = rows(
        db,
        "SELECT count(*) AS chunks, coalesce(sum(octet_length(text)), 0) AS bytes,"
        " string_agg(text, '' ORDER BY seq) = repeat(%s, %s) AS whole,"
        " max(seq) = count(*) AS seq_unbroken"
        " FROM run_log_chunks WHERE run_id = %s AND step_index = 0",
        (LINE, LINES, run_id),
    )[0]
    assert stored["bytes"] == LINES * len(LINE), stored
    assert stored["whole"], stored
    assert stored["seq_unbroken"], stored
    print(f"100 MiB step: {elapsed:.1f} s from start to outcome, {stored['chunks']} chunks")
