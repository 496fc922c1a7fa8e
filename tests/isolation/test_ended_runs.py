"""A run the reaper ends, or a cancel, is killed whole on its machine, and its uid is free only once nothing of
it lives.

The runner is frozen (SIGSTOP), as one starved of CPU or stuck is: it never learns from the runner
API that its run ended, so only the machine's side can end what the run started.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from runner.run_user import LEASES
from runplane.basics.types import RUNNER_LOST, RunStatus
from tests.isolation.conftest import UID_BASE, UID_COUNT
from tests.support.polling import wait_for
from tests.support.processes import Services
from tests.support.records import Conn, create_account, create_job, queue_run, run_row

pytestmark = pytest.mark.slow

STEP_SLEEP, BACKGROUND_SLEEP = "3141", "3142"  # how the step's processes are told apart


@dataclass(frozen=True)
class LeaseFreed:
    after: float  # seconds from the run's end in Postgres
    left_in_cgroup: list[str]  # the cgroup's processes read while the lease was ours


def processes_of_run(uid: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["uids"]):
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.info["uids"] is not None and process.info["uids"].real == uid:
                found.append(process)
    return found


def sleeping(argument: str) -> psutil.Process | None:
    for process in psutil.process_iter(["cmdline", "uids"]):
        uids = process.info["uids"]
        if process.info["cmdline"] == ["sleep", argument] and uids and UID_BASE <= uids.real < UID_BASE + UID_COUNT:
            return process
    return None


def run_cgroup_directories(pid: int) -> list[Path]:
    """The run cgroups (``runplane-runs/uid-N``) ``pid`` is in, in the memory, pids and cgroup2 hierarchies."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mount, kind, options, *_ = line.split()
        if kind == "cgroup2":
            mounts.setdefault("", Path(mount))
        elif kind == "cgroup":
            mounts.update({c: Path(mount) for c in options.split(",") if c in ("memory", "pids")})
    found = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            if name in mounts and "/runplane-runs/uid-" in path:
                found.append(mounts[name] / path.lstrip("/"))
    return found


def lease_taken_when_free(uid: int, directories: list[Path]) -> list[str] | None:
    """Take the uid's lease if nobody holds it, read what its run cgroup still holds, give it back;
    None while it is held."""
    fd = os.open(LEASES / str(uid), os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        left = []
        for directory in directories:
            with contextlib.suppress(FileNotFoundError):
                left += (directory / "cgroup.procs").read_text().split()
        return left
    finally:
        os.close(fd)  # the lock, if taken, goes with it


def test_a_run_the_reaper_ends_is_killed_whole_and_its_uid_freed_only_after(db: Conn, system: Services) -> None:
    step = f"sleep {BACKGROUND_SLEEP} & sleep {STEP_SLEEP}"
    run_id = queue_run(db, create_job(db, create_account(db), steps=[step]))
    system.start("scheduler")
    system.start("dispatcher")
    background = wait_for(lambda: sleeping(BACKGROUND_SLEEP), 60, what="the step's background process")
    assert background is not None
    uid = background.uids().real
    directories = run_cgroup_directories(background.pid)
    assert directories, "the run has no cgroup on this machine"
    runners = [p for p in processes_of_run(uid) if any("fork_server" in part for part in p.cmdline())]
    assert len(runners) == 1, runners
    runner = runners[0]
    assert run_row(db, run_id)["status"] == RunStatus.RUNNING

    runner.send_signal(signal.SIGSTOP)  # it renews its lease no more and hears nothing
    db.execute("UPDATE runs SET lease_expires_at = clock_timestamp() - interval '1 minute' WHERE id = %s", (run_id,))
    ended = wait_for(lambda: run_row(db, run_id), 30, until=lambda r: r["status"] >= 10, what="the reaper")
    ended_at = time.monotonic()
    assert (ended["status"], ended["status_message"]) == (RunStatus.ERROR, RUNNER_LOST)

    left = wait_for(
        lambda: lease_taken_when_free(uid, directories),
        30,
        until=lambda found: found is not None,
        interval=0.01,
        what=f"uid {uid}'s lease to be released",
    )
    freed = LeaseFreed(time.monotonic() - ended_at, left or [])
    print(f"uid lease released {freed.after:.2f} s after the reaper ended the run")
    assert freed.left_in_cgroup == [], freed
    assert sleeping(STEP_SLEEP) is None and sleeping(BACKGROUND_SLEEP) is None
    assert not runner.is_running()
    assert not any(directory.exists() for directory in directories)


def test_a_cancelled_run_is_killed_whole_and_its_uid_freed_only_after(db: Conn, system: Services) -> None:
    # The background process leaves the step's session: only the run's cgroup holds it to the run.
    step = f"setsid sleep {BACKGROUND_SLEEP} & sleep {STEP_SLEEP}"
    run_id = queue_run(db, create_job(db, create_account(db), steps=[step]))
    system.start("scheduler")
    system.start("dispatcher")
    background = wait_for(lambda: sleeping(BACKGROUND_SLEEP), 60, what="the step's background process")
    assert background is not None
    uid = background.uids().real
    directories = run_cgroup_directories(background.pid)
    assert directories, "the run has no cgroup on this machine"
    assert lease_taken_when_free(uid, directories) is None  # held while the run runs

    db.execute("UPDATE runs SET cancel_requested_at = now() WHERE id = %s", (run_id,))  # what every door does
    ended = wait_for(lambda: run_row(db, run_id), 60, until=lambda r: r["status"] >= 10, what="the cancel")
    assert ended["status"] == RunStatus.CANCELLED, ended

    left = wait_for(
        lambda: lease_taken_when_free(uid, directories),
        30,
        until=lambda found: found is not None,
        interval=0.01,
        what=f"uid {uid}'s lease to be released",
    )
    assert left == [], left  # the cgroup was empty when the lease came free
    assert sleeping(STEP_SLEEP) is None and sleeping(BACKGROUND_SLEEP) is None
    assert not background.is_running()
    assert not any(directory.exists() for directory in directories)
