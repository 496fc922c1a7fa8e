"""A run's limits on one machine, through the real local launcher as root: what a step may write and
where, how much disk, CPU, processes and open files it gets, and what the run's record says when it
goes past them.

Each run is a real run started by a real dispatcher on a uid of this test's own; the figures are read
from the kernel (the run's cgroup files, statvfs) and from what the step reported.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.run_user import DISK, SCRATCH
from runplane.adapters import cgroups
from runplane.basics.settings import RunnerSettings
from runplane.basics.types import RunStatus
from tests.isolation.conftest import UID_BASE, UID_COUNT, hostile, reported, run_log, wait_until_ended
from tests.support.polling import wait_for
from tests.support.processes import Services
from tests.support.records import Conn, create_account, create_job, queue_run, run_row

pytestmark = pytest.mark.slow

PLACES = ["/run/lock", "/run/user", "/dev/shm", "/var/tmp"]  # /tmp is /var/tmp in a run


@pytest.fixture
def marker() -> Iterator[str]:
    """A name of this test's own; whatever a run on unfixed code left under it on the host is removed."""
    name = f"rp-left-{secrets.token_hex(4)}"
    yield name
    for place in PLACES:
        for left in (Path(place) / name, Path(place) / f"{name}.sock", Path(place) / f"{name}.fill"):
            with contextlib.suppress(FileNotFoundError):
                left.unlink()


def test_a_file_and_a_socket_left_in_run_lock_are_not_there_for_the_next_run_of_the_uid(
    db: Conn, system: Services, marker: str
) -> None:
    system.env["RUNPLANE_RUNNER__LOCAL_UID_COUNT"] = "1"  # both runs get the same uid
    first = queue_run(db, create_job(db, create_account(db, name="a"), steps=[hostile("leave", marker, *PLACES)]))
    system.start("scheduler")
    system.start("dispatcher")
    assert wait_until_ended(db, first)["status"] == RunStatus.SUCCESS, run_log(db, first)

    second = queue_run(db, create_job(db, create_account(db, name="b"), steps=[hostile("find", marker, *PLACES)]))
    assert wait_until_ended(db, second)["status"] == RunStatus.SUCCESS, run_log(db, second)
    found = reported(db, second)
    for place in PLACES:
        assert str(found[f"{place} file"]).startswith("gone"), found
        assert str(found[f"{place} socket"]).startswith("refused"), found
        # Nothing was written to the machine's own places either.
        assert not (Path(place) / marker).exists() and not (Path(place) / f"{marker}.sock").exists()
    # Every shared place was writable by the first run: it was the run's own.
    assert reported(db, first) == dict.fromkeys(PLACES, "left")


def test_a_run_writing_past_its_scratch_quota_ends_with_disk_quota_exceeded(
    db: Conn, system: Services, marker: str
) -> None:
    system.env["RUNPLANE_RUNNER__LOCAL_SCRATCH_MB"] = "64"
    # 40 MiB in /dev/shm, then up to 2 GiB in /tmp: one quota over every place.
    fill = (
        f"head -c 41943040 /dev/zero > /dev/shm/{marker}.fill && "
        f"dd if=/dev/zero of=/tmp/{marker}.fill bs=1M count=2048 2>&1; status=$?; "
        f"ls -l /dev/shm/{marker}.fill /tmp/{marker}.fill; exit $status"
    )
    run_id = queue_run(db, create_job(db, create_account(db), steps=[fill, "echo never"]))
    scratch = Path(RunnerSettings().local_run_root) / str(UID_BASE + run_id % 2) / SCRATCH
    system.start("scheduler")
    system.start("dispatcher")
    wait_for(scratch.is_mount, timeout=60, what="the run's scratch space")
    run = wait_until_ended(db, run_id)
    log = run_log(db, run_id)
    assert run["status"] == RunStatus.ERROR, log
    assert str(run["status_message"]).startswith("disk quota exceeded"), (run["status_message"], log)
    assert "No space left on device" in log and "never" not in log.replace("echo never", ""), log
    written = [int(n) for n in re.findall(r"^(\d+) bytes", log, re.MULTILINE)]
    assert written and written[0] <= 24 * 1024 * 1024, log  # what was left of 64 MiB after 40
    print(f"dd wrote {written[0]} bytes to /tmp after 40 MiB to /dev/shm, against a 64 MiB quota")
    # Its pages are memory: given back when the runner ends, not held until the uid's next lease.
    wait_for(lambda: not scratch.is_mount(), timeout=30, what="the scratch space to be unmounted")


def test_a_run_writing_past_its_home_and_checkout_quota_ends_with_disk_quota_exceeded(
    db: Conn, system: Services, marker: str
) -> None:
    system.env["RUNPLANE_RUNNER__LOCAL_DISK_MB"] = "64"
    # Up to 2 GiB in HOME, and in the step's own directory (the run's, where its checkout is made).
    fills = {
        "home": f'dd if=/dev/zero of="$HOME/{marker}.fill" bs=1M count=2048 2>&1',
        "checkout": f"dd if=/dev/zero of=./{marker}.fill bs=1M count=2048 2>&1",
    }
    runs = {
        place: queue_run(db, create_job(db, create_account(db, name=place), steps=[fill, "echo never"]))
        for place, fill in fills.items()
    }
    system.start("scheduler")
    system.start("dispatcher")
    for place, run_id in runs.items():
        run = wait_until_ended(db, run_id)
        log = run_log(db, run_id)
        assert run["status"] == RunStatus.ERROR, (place, log)
        message = str(run["status_message"])
        assert message.startswith("disk quota exceeded") and "HOME and checkout" in message, (place, message, log)
        assert "No space left on device" in log and "never" not in log.replace("echo never", ""), (place, log)
        written = [int(n) for n in re.findall(r"^(\d+) bytes", log, re.MULTILINE)]
        assert written and written[0] <= 64 * 1024 * 1024, (place, log)
        print(f"dd wrote {written[0]} bytes to the run's {place} against a 64 MiB quota")
    # Its pages are memory: given back when the runner ends, not held until the uid's next lease.
    for uid in range(UID_BASE, UID_BASE + UID_COUNT):
        disk = Path(RunnerSettings().local_run_root) / str(uid) / DISK
        wait_for(functools.partial(unmounted, disk), timeout=30, what=f"{disk} to be unmounted")


def unmounted(path: Path) -> bool:
    return not path.is_mount()


def _run_cgroup(controller: str, uid: int) -> Path:
    for hierarchy in cgroups.hierarchies():
        if controller in hierarchy.offered():
            return hierarchy.base / f"uid-{uid}"
    pytest.fail(f"this machine offers no {controller} cgroup controller (runplane up says so)")


def _stat(path: Path) -> dict[str, int]:
    """A cgroup's ``cpu.stat``; empty while the cgroup is not made yet."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    return {key: int(value) for key, value in (line.split() for line in text.splitlines())}


def test_a_cpu_hog_is_throttled_at_its_cap_weighted_and_its_pids_scaled_to_the_machine(
    db: Conn, system: Services
) -> None:
    capacity = 64
    system.env.update(
        RUNPLANE_RUNNER__LOCAL_CPU_MAX="1.5",  # the operator's, which the account's settings override
        RUNPLANE_RUNNER__LOCAL_PIDS_MAX="4096",
        RUNPLANE_DISPATCHER__LOCAL_CAPACITY=str(capacity),
    )
    spin = 4.0
    account = create_account(db)
    db.execute("UPDATE accounts SET cpu_weight = 50, cpu_max = 0.2 WHERE id = %s", (account,))
    run_id = queue_run(db, create_job(db, account, steps=[hostile("spin", str(spin))]))
    uid = UID_BASE + run_id % 2
    cpu = _run_cgroup(cgroups.CPU, uid)
    pids = _run_cgroup("pids", uid)
    system.start("scheduler")
    system.start("dispatcher")
    wait_for(lambda: run_row(db, run_id)["status"] >= RunStatus.RUNNING, timeout=60, what="the run to start")
    throttled = wait_for(
        lambda: _stat(cpu / "cpu.stat"),
        timeout=30,
        until=lambda stat: stat.get("nr_throttled", 0) > 0,
        what="the hog to be throttled",
    )
    v2 = (cpu / "cpu.max").exists()
    if v2:
        assert (cpu / "cpu.max").read_text().split() == ["20000", "100000"]
        assert (cpu / "cpu.weight").read_text().strip() == "50"
    else:
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "20000"
        assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
        assert (cpu / "cpu.shares").read_text().strip() == "512"  # half of a default sibling's 1024
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert int((pids / "pids.max").read_text()) == pid_max // 2 // capacity
    assert wait_until_ended(db, run_id)["status"] == RunStatus.SUCCESS, run_log(db, run_id)
    got = reported(db, run_id)
    # An upper bound only: a busy machine gives the hog less, never more than its cap.
    assert float(str(got["cpu"])) <= spin * 0.2 * 1.25 + 0.3, got
    assert "held back at the run's CPU cap" in run_log(db, run_id)  # said in the run's record
    print(f"hog: {got['cpu']} s of CPU in {spin} s; cpu.stat while it ran: {throttled}")


def test_steps_have_the_open_files_limit_of_the_setting_not_the_dispatchers(db: Conn, system: Services) -> None:
    system.env["RUNPLANE_RUNNER__LOCAL_OPEN_FILES"] = "777"
    run_id = queue_run(db, create_job(db, create_account(db), steps=['echo "nofile $(ulimit -Sn) $(ulimit -Hn)"']))
    system.start("scheduler")
    system.start("dispatcher")
    assert wait_until_ended(db, run_id)["status"] == RunStatus.SUCCESS, run_log(db, run_id)
    assert "nofile 777 777" in run_log(db, run_id)


def test_a_step_starting_more_processes_than_its_share_is_refused_and_the_run_says_so(
    db: Conn, system: Services
) -> None:
    system.env["RUNPLANE_DISPATCHER__LOCAL_CAPACITY"] = "64"  # 32768 // 2 // 64 = 256 on a default pid_max
    bomb = "i=0; while [ $i -lt 2000 ]; do sleep 2 & i=$((i+1)); done; wait"
    run_id = queue_run(db, create_job(db, create_account(db), steps=[bomb]))
    system.start("scheduler")
    system.start("dispatcher")
    run = wait_until_ended(db, run_id)
    log = run_log(db, run_id)
    assert run["status"] == RunStatus.ERROR, log
    assert "refused at the run's limit (pids.max)" in log, log


def _cpu_seconds(cgroup: Path) -> float:
    """CPU time so far of the processes in a run's cgroup (``/proc/<pid>/stat`` utime + stime)."""
    ticks = 0
    for pid in (cgroup / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def test_a_run_of_four_busy_loops_beside_a_run_of_one_leaves_it_its_share(db: Conn, system: Services) -> None:
    # No cap: only the weight. Each run's cgroup weighs the same however many processes it has. On
    # two CPUs the four loops take one CPU whole and half of the lone loop's (a group's weight is
    # spread over the CPUs its load is on): 1/2 of the hog's CPU time for the lone loop, against 1/4
    # (one loop of five) without a cgroup per run. Both runs' CPU time is read over one window,
    # which a busy machine shortens for both alike.
    system.env["RUNPLANE_RUNNER__LOCAL_CPU_WEIGHT"] = "100"
    hog = queue_run(db, create_job(db, create_account(db, name="hog"), steps=[hostile("spin", "60", "4")]))
    other = queue_run(db, create_job(db, create_account(db, name="other"), steps=[hostile("spin", "60")]))
    cpu = {run_id: _run_cgroup(cgroups.CPU, UID_BASE + run_id % 2) for run_id in (hog, other)}
    system.start("scheduler")
    system.start("dispatcher")
    weight = wait_for(
        lambda: [name for name in ("cpu.weight", "cpu.shares") if all((d / name).exists() for d in cpu.values())],
        timeout=60,
        what="both runs' cgroups",
    )[0]
    assert (cpu[hog] / weight).read_text() == (cpu[other] / weight).read_text()
    # The lone loop is spinning once it has had some CPU beyond its start.
    wait_for(lambda: _cpu_seconds(cpu[other]), timeout=60, until=lambda used: used > 1.0, what="the lone loop")
    start = {run_id: _cpu_seconds(directory) for run_id, directory in cpu.items()}
    used = wait_for(
        lambda: {run_id: _cpu_seconds(directory) - start[run_id] for run_id, directory in cpu.items()},
        timeout=40,
        until=lambda used: sum(used.values()) >= 3.0,
        what="3 s of CPU between both runs",
    )
    # The runs spin on; the system fixture kills what is left of them.
    print(f"CPU seconds over one window: the four loops' run {used[hog]:.2f}, the lone loop's run {used[other]:.2f}")
    assert used[other] >= 0.35 * used[hog], used
