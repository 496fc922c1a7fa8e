"""A real system with a root dispatcher and the local launcher, its runs on uids of this test's own."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from runner import run_cgroup
from runner.run_user import DISK, SCRATCH, remove_files_of
from runplane.adapters import run_scratch
from runplane.basics.settings import RunnerSettings, Settings
from runplane.basics.types import RunStatus
from tests.support.files import readable_by_all
from tests.support.polling import wait_for
from tests.support.processes import Services
from tests.support.records import Conn, create_account, create_job, queue_run, rows, run_row

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a fenced run needs a root dispatcher")

HOSTILE = readable_by_all(Path(__file__).with_name("hostile.py"))  # the run's uid executes it
# Uids of this test process's own, far from the default range and from other test processes'.
UID_BASE = 500_000 + (os.getpid() % 1000) * 8
UID_COUNT = 2
LOG_TAIL_LINES = 60


def hostile(attack: str, *arguments: str) -> str:
    return " ".join(["/usr/bin/python3", "-I", str(HOSTILE), attack, *arguments])


@pytest.fixture
def system(service_env: dict[str, str], tmp_path: Path, database_url: str, _cleanup_bus: None) -> Iterator[Services]:
    """Services as ``make run`` starts them as root (a uid per run), on this test's uid range."""
    env = dict(service_env)
    env.update(
        RUNPLANE_SCHEDULER__INTERVAL="0.2",
        RUNPLANE_DISPATCHER__LAUNCHER="local",
        RUNPLANE_DRAIN_SECONDS="5",
        RUNPLANE_LOG_LEVEL="INFO",
        RUNPLANE_RUNNER__LOCAL_UID=str(UID_BASE),
        RUNPLANE_RUNNER__LOCAL_UID_COUNT=str(UID_COUNT),
    )
    running = Services(env, tmp_path, database_url)
    try:
        yield running
    finally:
        running.stop_all()
        for uid in range(UID_BASE, UID_BASE + UID_COUNT):
            kill_processes_of_uid(uid)
            run_cgroup.clear(uid)
            remove_files_of(uid)
            private = Path(RunnerSettings().local_run_root) / str(uid)
            for mounted in (SCRATCH, DISK):
                run_scratch.unmount(private / mounted)
            shutil.rmtree(private, ignore_errors=True)
        for name, _ in running.processes:
            lines = running.log_text(name).splitlines()[-LOG_TAIL_LINES:]
            print(f"---- {name}.log (last {len(lines)} lines) ----", *lines, sep="\n")


def run_temporary_directory(uid: int) -> Path:
    """The temporary directory of the run on ``uid`` (its steps' /tmp), seen from the host."""
    return Path(RunnerSettings().local_run_root) / str(uid) / SCRATCH / run_scratch.TEMPORARY_NAME


def kill_processes_of_uid(uid: int) -> None:
    for process in psutil.process_iter(["uids"]):
        if process.info["uids"] is not None and process.info["uids"].real == uid:
            process.kill()


def run_log(db: Conn, run_id: int) -> str:
    return "".join(
        r["text"] for r in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,))
    )


def reported(db: Conn, run_id: int) -> dict[str, object]:
    """What the hostile step reported (its ``HOSTILE`` line)."""
    text = run_log(db, run_id)
    lines = [line for line in text.splitlines() if line.startswith("HOSTILE ")]
    assert lines, f"the step reported nothing; its log:\n{text}"
    result: dict[str, object] = json.loads(lines[-1].removeprefix("HOSTILE "))
    return result


def wait_until_ended(db: Conn, run_id: int, timeout: float = 90) -> dict[str, Any]:
    wait_for(lambda: run_row(db, run_id)["status"] >= 10, timeout=timeout, what=f"run {run_id} to end")
    return run_row(db, run_id)


def connect_from_a_step(db: Conn, system: Services, settings: Settings, targets: list[str]) -> dict[str, object]:
    """What a step got connecting to ``targets`` (``connect``), once it reached the runner API."""
    job = create_job(db, create_account(db), steps=[hostile("connect", settings.runner.api_address, *targets)])
    run_id = queue_run(db, job)
    system.start("scheduler")
    system.start("dispatcher")
    run = wait_until_ended(db, run_id)
    assert run["status"] == RunStatus.SUCCESS, run_log(db, run_id)
    outcome = reported(db, run_id)
    assert outcome[settings.runner.api_address] == "connected", outcome
    return outcome
