"""How many runs one machine holds at once, and what each may take of what the machine has for all.

A local dispatcher keeps at most ``dispatcher.local_capacity`` runners given a run alive (default 16
per CPU: a run's runner mostly waits, on the API, its step, its logs). The kernel's process table is
one for the machine (``kernel.pid_max``), so a run's ``pids.max`` is lowered until a full machine's
runs together hold at most half of it: the other half stays for the machine itself, the control
plane and the runners waiting as spares, so no set of runs can leave them unable to fork.
"""

from __future__ import annotations

import os
from pathlib import Path

from runplane.basics.settings import Settings

RUNNERS_PER_CPU = 16
RUNS_SHARE_OF_PIDS = 0.5  # of kernel.pid_max, for every run of a full machine together
PID_MAX = Path("/proc/sys/kernel/pid_max")


def local_capacity(settings: Settings) -> int:
    """Runners given a run that one local dispatcher keeps alive at once (``dispatcher.local_capacity``)."""
    return settings.dispatcher.local_capacity or RUNNERS_PER_CPU * len(os.sched_getaffinity(0))


def pids_per_run(settings: Settings, pid_max: int | None = None) -> int:
    """A run's ``pids.max``: ``runner.local_pids_max``, lowered so capacity × it is at most half of
    ``pid_max`` (this machine's, by default), and never below 16 (a runner and a shell step)."""
    if pid_max is None:
        pid_max = int(PID_MAX.read_text())
    room = int(pid_max * RUNS_SHARE_OF_PIDS) // local_capacity(settings)
    return max(16, min(settings.runner.local_pids_max, room))
