"""The namespaces a local run's steps execute in (bubblewrap): a private /proc, /tmp and IPC.

A step of a run with a uid of its own starts as ``bwrap … -- /bin/sh -c <command>`` with:

- a PID namespace with its own ``/proc``: the step sees its own processes only, so it can neither
  read other tenants' command lines nor name its runner to signal or trace it; when the step's
  shell ends, the kernel kills whatever it left in the namespace (a daemon that double-forked and
  called setsid included);
- a mount namespace where ``/tmp`` and ``/var/tmp`` are the run's own temporary directory, and
  ``/dev/shm``, ``/run/lock``, ``/run/user`` and every other world-writable place of the machine a
  directory of the run's own, all in its size-capped scratch space (``runplane.run_scratch``: made by
  root for the run, taken away before its uid is leased again), an IPC namespace of its own, and the
  control plane's Unix sockets (``runner.local_hidden_paths``: Postgres's
  ``/run/postgresql`` and the like) covered by empty directories;
- no new privileges, no capabilities.

bwrap runs unprivileged (a user namespace mapping the run's uid to itself), so the runner, already
the run's uid, starts it. The network is left to the nftables fence keyed by that uid
(``runplane.network_fence``), and abstract Unix sockets to the run's Landlock scope, entered by the
runner before the step (``runplane.landlock``). bwrap's own process ignores SIGINT and SIGTERM (``env
--ignore-signal``), so a cancel reaches the step (dbt cancels its queries) without ending the
sandbox under it; the step gets them back at their defaults (``env --default-signal``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from runplane.adapters import run_scratch


def confinement(scratch: Path, hidden: Sequence[str], shown: Sequence[str] = ()) -> tuple[str, ...]:
    """The argv that runs a command (appended to it) in the run's namespaces. ``scratch``: the run's
    scratch space (``runplane.run_scratch``), whose directories cover every shared place a step could
    write; ``shown``: directories the steps need (the dbt installs), seen read-only even when they live
    under one of those places."""
    bwrap = shutil.which("bwrap") or "bwrap"
    places = run_scratch.places()
    argv = [
        "env", "--ignore-signal=INT,TERM", bwrap,
        "--bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent",
    ]  # fmt: skip
    for place in places:
        argv += ["--bind", str(scratch / run_scratch.directory_name(place)), place]
    if "/dev/shm" not in places:
        argv += ["--tmpfs", "/dev/shm"]
    for path in shown:
        real = os.path.realpath(path)
        if os.path.isdir(real) and any(Path(real).is_relative_to(covered) for covered in places):
            argv += ["--ro-bind", real, real]
    seen: set[str] = set()
    for path in hidden:
        real = os.path.realpath(path)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        argv += ["--tmpfs", real]
    return (*argv, "--", "env", "--default-signal=INT,TERM")
