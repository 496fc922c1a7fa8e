"""Hostile steps through the real local launcher as root (``make run``'s way): each one is refused.

Every attack is a step of a real run, started by a real dispatcher on a uid of this test's own
(``runner.local_uid``), and reports what it could do; the attacks are the ones a tenant tried on a
``make run`` system: connect to the machine's Postgres, Redis and RabbitMQ (TCP and Unix socket)
and to the public API, read what an earlier run of the same uid left, outlive the run as a
daemon, block another uid's start by making its HOME, signal its runner, and read other tenants'
command lines.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import psutil
import pytest

from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from tests.isolation.conftest import (
    UID_BASE,
    connect_from_a_step,
    hostile,
    reported,
    run_log,
    run_temporary_directory,
    wait_until_ended,
)
from tests.support.polling import wait_for
from tests.support.processes import Services
from tests.support.records import Conn, create_account, create_job, queue_run, run_row

pytestmark = pytest.mark.slow


def marked_processes(marker: str, *, named: bool = False) -> list[psutil.Process]:
    """Processes with ``marker`` in their command line (``named``: as their name, argv[0])."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or [""]
        if (cmdline[0] == marker) if named else any(marker in part for part in cmdline):
            found.append(process)
    return found


def test_a_step_reaches_the_runner_api_and_none_of_the_control_plane_servers(
    db: Conn, system: Services, settings: Settings
) -> None:
    refused = [
        "127.0.0.1:5432",  # Postgres (the control plane's, trusting local clients)
        "127.0.0.1:6379",  # Redis
        "127.0.0.1:5672",  # RabbitMQ
        "/var/run/postgresql/.s.PGSQL.5432",  # Postgres's Unix socket
        f"127.0.0.1:{settings.api.port}",  # the public gRPC API
        f"127.0.0.1:{settings.api.rest_port}",  # the public REST API and its admin pages
    ]
    outcome = connect_from_a_step(db, system, settings, refused)
    for target in refused:
        assert str(outcome[target]).startswith("refused"), (target, outcome[target])


def test_a_uid_comes_to_its_next_run_without_anything_the_last_one_left(db: Conn, system: Services) -> None:
    system.env["RUNPLANE_RUNNER__LOCAL_UID_COUNT"] = "1"  # both runs get the same uid
    marker = f"leftover-{secrets.token_hex(4)}"
    first = queue_run(db, create_job(db, create_account(db, name="a"), steps=[hostile("plant", marker)]))
    system.start("scheduler")
    system.start("dispatcher")
    assert wait_until_ended(db, first)["status"] == RunStatus.SUCCESS, run_log(db, first)
    assert set(reported(db, first).values()) == {"written"}

    second = queue_run(db, create_job(db, create_account(db, name="b"), steps=[hostile("read", marker)]))
    assert wait_until_ended(db, second)["status"] == RunStatus.SUCCESS, run_log(db, second)
    found = reported(db, second)
    assert all(str(value).startswith("gone") for value in found.values()), found
    # Nothing of the first run is left on the machine either.
    for place in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not (Path(place) / marker).exists()


def test_a_daemon_a_step_starts_does_not_outlive_its_run_and_counts_in_the_runs_cgroup(
    db: Conn, system: Services
) -> None:
    marker = f"lurker-{secrets.token_hex(4)}"
    run_id = queue_run(db, create_job(db, create_account(db), steps=[hostile("daemon", marker)]))
    uid = UID_BASE + run_id % 2
    system.start("scheduler")
    system.start("dispatcher")
    try:
        [lurker] = wait_for(
            lambda: marked_processes(marker, named=True), timeout=60, what=f"the daemon {marker} to start"
        )
        memory = [line for line in Path(f"/proc/{lurker.pid}/cgroup").read_text().splitlines() if ":memory:" in line]
        cgroups = [line for line in Path(f"/proc/{lurker.pid}/cgroup").read_text().splitlines()]
        seen = run_temporary_directory(uid) / f"{marker}.seen"
        if seen.parent.is_dir():
            seen.touch()
        assert wait_until_ended(db, run_id)["status"] == RunStatus.SUCCESS, run_log(db, run_id)
        assert reported(db, run_id)["seen"] == "True"
        # The daemon was counted in the run's cgroup, under its memory limit, like the rest of the run.
        assert all(
            line.endswith(f"/runplane-runs/uid-{uid}")
            for line in cgroups
            if ":memory:" in line or ":pids:" in line or line.startswith("0::")
        ), cgroups
        assert memory, cgroups
        wait_for(lambda: not marked_processes(marker, named=True), timeout=20, what=f"the daemon {marker} to be gone")
    finally:
        for process in marked_processes(marker, named=True):
            process.kill()


def test_a_step_cannot_make_another_uids_home_and_hold_its_runs_back(db: Conn, system: Services) -> None:
    # Run ids decide the uid: the squatter's run gets the first, the victim's the second.
    squatter_job = create_job(db, create_account(db, name="a"), steps=[hostile("squat", str(UID_BASE + 1))])
    victim_job = create_job(db, create_account(db, name="b"), steps=['ls -A "$HOME"; echo started'])
    while queue_run(db, squatter_job, status=RunStatus.CANCELLED) % 2 == 0:  # ids only, never run
        pass
    squatter = queue_run(db, squatter_job)
    system.start("scheduler")
    system.start("dispatcher")
    assert wait_until_ended(db, squatter)["status"] >= RunStatus.SUCCESS
    while queue_run(db, victim_job, status=RunStatus.CANCELLED) % 2:
        pass
    victim = queue_run(db, victim_job)
    run = wait_until_ended(db, victim, timeout=60)
    assert run["status"] == RunStatus.SUCCESS, run_log(db, victim)
    log = run_log(db, victim)
    assert "planted" not in log and "started" in log, log
    squatted = reported(db, squatter)
    assert str(squatted["made"]).startswith("failed"), squatted


def test_a_step_cannot_signal_its_runner(db: Conn, system: Services) -> None:
    run_id = queue_run(db, create_job(db, create_account(db), steps=[hostile("signal"), "echo next step"]))
    system.start("scheduler")
    system.start("dispatcher")
    run = wait_until_ended(db, run_id, timeout=60)
    log = run_log(db, run_id)
    assert run["status"] == RunStatus.SUCCESS, log
    assert "the runner survived" in log and "next step" in log
    assert "signalled" not in reported(db, run_id).values()


def test_a_step_cannot_read_another_tenants_command_lines(db: Conn, system: Services) -> None:
    password = f"--password=hunter-{secrets.token_hex(4)}"
    other = queue_run(
        db,
        create_job(db, create_account(db, name="b"), steps=[f'python3 -c "import time; time.sleep(120)" {password}']),
    )
    system.start("scheduler")
    system.start("dispatcher")
    wait_for(lambda: marked_processes(password), timeout=60, what="the other tenant's step to run")
    reader = queue_run(db, create_job(db, create_account(db, name="a"), steps=[hostile("cmdlines", password[::-1])]))
    assert wait_until_ended(db, reader)["status"] == RunStatus.SUCCESS, run_log(db, reader)
    seen = reported(db, reader)
    assert seen["found"] == [], seen
    assert run_row(db, other)["status"] == RunStatus.RUNNING
