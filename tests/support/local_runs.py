"""Runs for the local launcher's tests: one made starting (with its run token), and waiting for its end."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import psutil

from dispatcher.launcher import LaunchRequest
from runplane.basics.types import AccountId, JobId, RunId, RunStatus
from tests.support.polling import eventually
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run, run_row


def starting_run(db: Conn, steps: list[str]) -> LaunchRequest:
    account = create_account(db)
    job = create_job(db, account, steps=steps)
    run_id = queue_run(db, job)
    token = make_starting(db, run_id)
    return LaunchRequest(
        RunId(run_id), JobId(job), AccountId(account), attempt=1, memory_mb=1024, timeout_seconds=0, token=token
    )


async def ended(db: Conn, run_id: int, timeout: float = 30) -> dict[str, Any]:
    def row_if_ended() -> dict[str, Any] | None:
        row = run_row(db, run_id)
        return row if row["status"] >= RunStatus.SUCCESS else None

    row = await eventually(row_if_ended, timeout, what=f"run {run_id} to end")
    assert row is not None
    return row


def _command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return ""


def _connected_to(process: psutil.Process, port: int) -> bool:
    try:
        return any(c.raddr and c.raddr.port == port for c in process.net_connections(kind="tcp"))
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def fork_server_of_this_process() -> psutil.Process:
    [server] = [p for p in psutil.Process(os.getpid()).children() if "runner.fork_server" in _command(p)]
    return server


def waiting_spares(server: psutil.Process, runner_api_address: str) -> list[psutil.Process]:
    """The fork server's children connected to the runner API: its started runners. (A root server
    also keeps a cache keeper beside each, which never connects.)"""
    port = int(runner_api_address.rpartition(":")[2])
    return [child for child in server.children() if _connected_to(child, port)]


def spares_said_ready(server: psutil.Process) -> int:
    """How many of the fork server's spares have said they are connected (a byte waits on the
    server's end of their socket pair; ``ss`` shows its receive queue)."""
    listing = subprocess.run(["ss", "-x", "-p", "-n", "-H"], capture_output=True, text=True, timeout=10, check=True)
    return sum(
        1
        for line in listing.stdout.splitlines()
        if f"pid={server.pid}," in line and line.split()[:3] == ["u_str", "ESTAB", "1"]
    )
