"""What this machine can fence a local run with, said at start by the dispatcher and ``runplane up``.

A run on one machine is fenced like a Pod (``runner.fence``) only with what the kernel and the
machine offer: root (uids of their own), nftables (the network), cgroup memory and pids
controllers (limits, and killing the run whole), bubblewrap (namespaces for its steps), and
Landlock scopes (abstract Unix sockets, which nftables does not see). Each
thing missing is said loudly, with what it leaves open.
"""

from __future__ import annotations

import os
import shutil

from runplane.adapters import cgroups, landlock, network_fence, run_scratch
from runplane.basics.local_capacity import local_capacity, pids_per_run
from runplane.basics.settings import Settings


def sandbox_unavailable() -> str | None:
    """Why steps cannot be put in namespaces here, or None."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (the `bwrap` command; apt-get install bubblewrap)"
    return None


def problems(settings: Settings) -> list[str]:
    """What this machine cannot fence local runs with, each with what it means; empty when it can."""
    if os.geteuid() != 0:
        return [
            "not root: runs keep the dispatcher's user and are not fenced: a step can connect to the control "
            "plane's Postgres, Redis and RabbitMQ on this machine, signal the dispatcher's user's processes "
            "and read its files (one trusted tenant only)"
        ]
    if settings.runner.local_uid < 0:
        return ["runner.local_uid is -1: runs keep the dispatcher's user and are not fenced (one trusted tenant)"]
    if not settings.runner.local_fence:
        return ["runner.local_fence is off: runs get uids of their own but no network fence, cgroup or namespaces"]
    found = []
    if (why := network_fence.unavailable()) is not None:
        found.append(
            f"runs are not fenced from the network ({why}): a step can connect to the control plane's Postgres, "
            "Redis and RabbitMQ on this machine"
        )
    elif not settings.runner.local_resolver and (here := network_fence.local_resolvers(allowed=True)):
        found.append(
            f"the DNS resolver /etc/resolv.conf names is on this machine ({', '.join(map(str, here))}) and runs may "
            "not reach it: they resolve no names (a warehouse must be named by address); set runner.local_resolver "
            "to let them"
        )
    if (why := cgroups.unavailable()) is not None:
        found.append(
            f"runs get no cgroup ({why}): no kernel memory or pids limit over a run, and what a step leaves "
            "outside its namespaces may outlive the run until its uid is leased again"
        )
    if (why := cgroups.cpu_unavailable()) is not None and cgroups.unavailable() is None:
        found.append(f"runs get no CPU weight or cap ({why}): one run's busy loops slow every other run")
    if (why := run_scratch.unavailable()) is not None:
        found.append(
            f"runs get no scratch space of their own ({why}): /tmp, /run/lock and the other shared places of a run "
            "are directories on this machine's disk, with no quota"
        )
    if (why := sandbox_unavailable()) is not None:
        found.append(
            f"steps get no namespaces ({why}): a step shares /tmp and /proc with the machine, sees other "
            "runs' command lines, can signal its own runner and outlive its run as a daemon"
        )
    if (why := landlock.unavailable()) is not None:
        found.append(
            f"abstract Unix sockets are not fenced ({why}): a step can connect to any on this machine, the "
            "control plane's processes' and other runs' included"
        )
    return found


def limits(settings: Settings) -> str:
    """What every run is given and limited to on this machine, said at start beside the problems."""
    runner = settings.runner
    cpu = f"at most {runner.local_cpu_max:g} CPUs, " if runner.local_cpu_max > 0 else ""
    return (
        f"each run gets a scratch space of {runner.local_scratch_mb} MiB of its own for "
        f"{', '.join(run_scratch.places())}; {pids_per_run(settings)} processes (of kernel.pid_max for "
        f"{local_capacity(settings)} runs at once), CPU weight {runner.local_cpu_weight}, {cpu}"
        f"{runner.local_open_files} open files"
    )
