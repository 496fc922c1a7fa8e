"""The local launcher on its own: runners forked from the fork server, or fresh processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psutil
import pytest

from dispatcher.launcher import LaunchRequest
from dispatcher.local_launcher import LocalLauncher
from runplane.types import AccountId, JobId, RunId, RunStatus
from tests.support.records import Conn, create_account, create_job, queue_run, rows, run_row

pytestmark = pytest.mark.usefixtures("_cleanup_bus")


@pytest.fixture(autouse=True)
def _runner_environment(monkeypatch: pytest.MonkeyPatch, service_env: dict[str, str]) -> None:
    """Runners read the test's database and prefixes from the environment, as in production."""
    for name, value in service_env.items():
        if name.startswith("RUNPLANE_"):
            monkeypatch.setenv(name, value)


def starting_run(db: Conn, steps: list[str]) -> LaunchRequest:
    account = create_account(db)
    job = create_job(db, account, steps=steps)
    run_id = queue_run(db, job)
    db.execute(
        "UPDATE runs SET status = 2, dispatched_at = clock_timestamp(), launch_attempts = 1 WHERE id = %s", (run_id,)
    )
    return LaunchRequest(RunId(run_id), JobId(job), AccountId(account), attempt=1, memory_mb=1024, timeout_seconds=0)


async def ended(db: Conn, run_id: int, timeout: float = 30) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while (row := run_row(db, run_id))["status"] < RunStatus.SUCCESS:
        assert time.monotonic() < deadline, f"run {run_id} still {row['status']}"
        await asyncio.sleep(0.05)
    return row


async def gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        assert time.monotonic() < deadline, f"process {pid} still there"
        await asyncio.sleep(0.05)


async def test_forked_runners_run_a_duplicate_changes_nothing_and_a_dead_server_is_replaced(db: Conn) -> None:
    launcher = LocalLauncher("local")
    try:
        await launcher.start()
        request = starting_run(db, ["echo from a forked runner"])
        result = await launcher.launch(request)
        assert result.cluster == "local" and result.pod_name.startswith("pid:")
        first = await ended(db, request.run_id)
        assert first["status"] == RunStatus.SUCCESS
        assert first["started_at"] - first["dispatched_at"] < first["finished_at"] - first["dispatched_at"]

        duplicate = await launcher.launch(request)  # a second launch of the same run
        await gone(int(duplicate.pod_name.removeprefix("pid:")))
        assert run_row(db, request.run_id) == first
        assert len(rows(db, "SELECT 1 FROM run_log_chunks WHERE run_id = %s", (request.run_id,))) == 1

        server = psutil.Process(os.getpid()).children()
        [fork_server] = [p for p in server if "runner.fork_server" in " ".join(p.cmdline())]
        fork_server.send_signal(signal.SIGKILL)
        await gone(fork_server.pid)
        again = starting_run(db, ["echo after the fork server died"])
        await launcher.launch(again)
        assert (await ended(db, again.run_id))["status"] == RunStatus.SUCCESS
    finally:
        await launcher.close()


async def test_a_fresh_runner_process_per_run(db: Conn) -> None:
    launcher = LocalLauncher("local", fork_server=False)
    try:
        request = starting_run(db, ["echo from a fresh process"])
        result = await launcher.launch(request)
        row = await ended(db, request.run_id, timeout=60)
        assert row["status"] == RunStatus.SUCCESS
        assert row["pod_name"] == "" and result.pod_name.startswith("pid:")  # recording it is the dispatcher's job
        text = rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s", (request.run_id,))
        assert text == [{"text": "from a fresh process\n"}]
    finally:
        await launcher.close()
