"""A run's cgroup on a pure cgroup v2 machine: one hierarchy at /sys/fs/cgroup, nothing of v1.

Whatever the host's layout, the runner's code runs here in a mount namespace of its own where
``/sys/fs/cgroup`` is the cgroup2 hierarchy alone (the host's mounts stay as they are). It reads
the layout, makes the run's cgroup, joins it with a keeper and a daemon-like child, and exits; the
keeper must then kill the cgroup whole with ``cgroup.kill`` and remove it. The limits are checked
when this kernel's cgroup2 hierarchy offers memory and pids; on a hybrid host those controllers are
bound to the v1 hierarchies (a controller serves one hierarchy at a time), and the runner must say
so instead: the v2 limits and their delegation through ``cgroup.subtree_control`` are then not
exercised.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from runner import run_cgroup
from runplane.adapters import cgroups
from tests.support.polling import wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="a mount namespace and cgroups need root"
)

UID = 700_000 + os.getpid() % 100_000  # this test process's own, named in the cgroup only
MEMORY = 300 * 1024 * 1024
PIDS = 77

# Only cgroup2 at /sys/fs/cgroup in this mount namespace (private: the host's mounts are untouched).
_PURE_V2 = 'umount -R /sys/fs/cgroup 2>/dev/null; mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$0" "$@"'
_RUNNER = """
import json, subprocess, sys
from runner import run_cgroup
from runplane.adapters import cgroups
uid, memory, pids = map(int, sys.argv[1:])
found = cgroups.hierarchies()
cgroup = run_cgroup.create(uid, memory_bytes=memory, pids_max=pids)
run_cgroup.join(cgroup)  # the pipe's write end is held until this process exits
daemon = subprocess.Popen(["sleep", "300"], start_new_session=True)
[leaf] = cgroup.directories
limits = {}
for name in ("memory.max", "pids.max"):
    if (leaf / name).exists():
        limits[name] = (leaf / name).read_text().strip()
print(json.dumps({
    "hierarchies": [[str(h.mount), h.v2, sorted(h.offered())] for h in found],
    "unavailable": cgroups.unavailable(),
    "leaf": str(leaf.relative_to(found[0].mount)),
    "procs": (leaf / "cgroup.procs").read_text().split(),
    "daemon": daemon.pid,
    "limits": limits,
}))
"""


def host_cgroup2() -> Path:
    """Where the host mounts its cgroup2 hierarchy (``/sys/fs/cgroup`` or ``…/unified``)."""
    [mount] = [h.mount for h in cgroups.hierarchies() if h.v2]
    return mount


def test_a_runs_cgroup_on_a_pure_v2_layout_is_limited_when_it_can_be_and_killed_whole_when_the_runner_ends() -> None:
    pure_v2 = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _PURE_V2]
    done = subprocess.run(
        [*pure_v2, sys.executable, "-c", _RUNNER, str(UID), str(MEMORY), str(PIDS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    leaf = host_cgroup2() / seen["leaf"]
    try:
        [(mount, v2, offered)] = seen["hierarchies"]
        assert (mount, v2) == ("/sys/fs/cgroup", True), seen
        assert seen["leaf"].endswith(f"{cgroups.PARENT}/uid-{UID}"), seen
        assert str(seen["daemon"]) in seen["procs"], seen
        if offered == ["memory", "pids"]:
            assert seen["unavailable"] is None
            assert seen["limits"] == {"memory.max": str(MEMORY), "pids.max": str(PIDS)}, seen
        else:
            # This host's memory and pids controllers serve its v1 hierarchies: the runner says so.
            missing = sorted(cgroups.LIMITED - set(offered))
            assert seen["unavailable"] == f"no {' or '.join(missing)} cgroup controller", seen
            assert seen["limits"] == {}, seen
        # The runner is gone: its keeper kills what the run left and removes the cgroup.
        wait_for(lambda: not psutil.pid_exists(seen["daemon"]), timeout=20, what="the run's daemon to be killed")
        wait_for(lambda: not leaf.exists(), timeout=20, what=f"{leaf} to be removed")
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(seen["daemon"]).kill()
        cgroups.kill(leaf, time.monotonic() + run_cgroup.KILL_TIMEOUT)
        with contextlib.suppress(OSError):
            leaf.parent.rmdir()  # runplane-runs, unless another run's cgroup is in it
