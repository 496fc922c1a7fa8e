"""Processes held by a pidfd: only a provable child is held, what exits is let go, and stopping a
set of them never fails over one that is gone."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from runplane.basics import held_processes
from tests.support.polling import wait_for

# A parent that starts a child of its own and says its pid.
PARENT = "import subprocess, sys, time; c = subprocess.Popen(['sleep', '600']); print(c.pid, flush=True); c.wait()"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; all killed and reaped afterwards, also when it fails."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _start(started: list[subprocess.Popen[str]], *argv: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    started.append(process)
    return process


def test_a_process_that_is_not_the_parents_child_is_not_held(started: list[subprocess.Popen[str]]) -> None:
    parent = held_processes.hold(_start(started, "sleep", "600").pid)
    unrelated = _start(started, "sleep", "600")
    assert parent is not None
    assert held_processes.hold_child(unrelated.pid, parent) is None
    assert unrelated.poll() is None


def test_descendants_are_held_from_first_sight_until_they_exit(started: list[subprocess.Popen[str]]) -> None:
    parent = _start(started, sys.executable, "-c", PARENT)
    assert parent.stdout is not None
    grandchild = int(parent.stdout.readline())
    root = held_processes.hold(parent.pid)
    assert root is not None
    descendants = held_processes.Descendants()
    descendants.follow([root])
    assert descendants.pids() == {grandchild}
    subprocess.run(["kill", "-9", str(grandchild)], check=True)  # still held: the pidfd names it

    def held_after_a_look() -> int:
        descendants.follow([root])
        return len(descendants)

    wait_for(held_after_a_look, 10, until=lambda held: held == 0, what="the exited one to be let go")
    root.close()


def test_stopping_skips_a_process_that_is_gone_and_stops_the_rest(started: list[subprocess.Popen[str]]) -> None:
    gone = _start(started, "sleep", "600")
    alive = _start(started, "sleep", "600")
    held = [held_processes.hold(gone.pid), held_processes.hold(alive.pid)]
    gone.kill()
    gone.wait()  # reaped: its number is free for any program now
    held_processes.stop([process for process in held if process is not None], grace_seconds=5.0)
    assert alive.poll() is not None, "the live one was not stopped"
