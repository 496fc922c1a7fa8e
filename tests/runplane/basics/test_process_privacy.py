"""A control-plane process that is not dumpable keeps its environment from processes of its own user.

What a step of a non-root dispatcher's runner could try: both processes run as the same
unprivileged user; the reader is refused ``/proc/<pid>/environ`` of the process that called
``make_undumpable``, and reads that of one that did not.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import runplane.basics.process_privacy
from tests.support.files import readable_by_all

NOBODY = 65534
# Readable by any user (an interpreter under /root may not be), as for the probe of a run step.
SYSTEM_PYTHON = "/usr/bin/python3"
MODULE = readable_by_all(Path(runplane.basics.process_privacy.__file__))
# The holder: a secret in its environment, undumpable or not as told, then it waits for stdin to close.
HOLDER = f"""
import runpy, sys
if sys.argv[1] == "private":
    runpy.run_path({str(MODULE)!r})["make_undumpable"]()
print("ready", flush=True)
sys.stdin.read()
"""
READER = """
import sys
try:
    data = open(f"/proc/{sys.argv[1]}/environ", "rb").read()
    print("found" if b"RUNPLANE_DATABASE_URL=postgresql://secret" in data else "read")
except PermissionError:
    print("Permission denied")
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs two processes as another user")


@contextmanager
def holder(mode: str) -> Iterator[int]:
    with subprocess.Popen(
        [SYSTEM_PYTHON, "-I", "-c", HOLDER, mode],
        env={"RUNPLANE_DATABASE_URL": "postgresql://secret@db/runplane"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield proc.pid  # leaving the block closes its stdin: it exits, and is waited for


def read_as_same_user(pid: int) -> str:
    done = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", READER, str(pid)],
        env={},
        capture_output=True,
        text=True,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        check=True,
        timeout=10,
    )
    return done.stdout.strip()


def test_an_undumpable_process_keeps_its_environment_from_its_own_user() -> None:
    with holder("private") as pid:
        assert read_as_same_user(pid) == "Permission denied"


def test_without_it_the_same_user_reads_the_environment() -> None:
    with holder("plain") as pid:
        assert read_as_same_user(pid) == "found"
