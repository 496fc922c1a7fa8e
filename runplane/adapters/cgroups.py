"""The cgroup hierarchies of this machine that a local run is limited and killed with, as mounted here.

Read from the mounts and ``/proc/self/cgroup``: cgroup v2 (one hierarchy, whose
``cgroup.controllers`` say what it offers), or v1 hierarchies for memory and pids, with or
without a cgroup2 hierarchy beside them (the hybrid layout, where only ``cgroup.kill`` comes from
cgroup2). Used by the runner to make a run's cgroup and by the dispatcher and ``runplane up`` to
say, at start, what the machine cannot offer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PARENT = "runplane-runs"  # the runs' cgroups, under the cgroup the runner started in
CONTROL = "runplane-control"  # v2: where the processes of that cgroup move, so it can hand controllers down
LIMITED = frozenset({"memory", "pids"})  # needed for a run's cgroup at all
CPU = "cpu"  # a run's share of the CPUs and its cap, when the machine offers it
CONTROLLED = LIMITED | {CPU}


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy, and where this process sits in it."""

    mount: Path
    own: str  # this process's cgroup in it, from /proc/self/cgroup
    controllers: frozenset[str]  # v1: the limiting controllers it holds; v2: empty (see ``offered``)
    v2: bool

    @property
    def own_directory(self) -> Path:
        return self.mount / self.own.lstrip("/")

    @property
    def base(self) -> Path:
        return self.own_directory / PARENT

    def offered(self) -> frozenset[str]:
        """The limiting controllers a cgroup made under ours can have."""
        if not self.v2:
            return self.controllers
        return CONTROLLED & controllers_of(self.own_directory)


def controllers_of(directory: Path) -> frozenset[str]:
    """A v2 cgroup's available controllers."""
    try:
        return frozenset((directory / "cgroup.controllers").read_text().split())
    except OSError:
        return frozenset()


def hierarchies() -> list[Hierarchy]:
    """The hierarchies that count for a run: v1 memory, pids and cpu, and the cgroup2 one."""
    cgroup2: Path | None = None
    v1: dict[frozenset[str], Path] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2" and cgroup2 is None:
            cgroup2 = Path(fields[1])
        elif fields[2] == "cgroup" and (held := CONTROLLED & frozenset(fields[3].split(","))):
            v1[held] = Path(fields[1])
    found: list[Hierarchy] = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if names == "":
            if cgroup2 is not None:
                # Processes moved out of the way for the runs' controllers count from where they were.
                found.append(Hierarchy(cgroup2, path.removesuffix(f"/{CONTROL}"), frozenset(), True))
            continue
        held = CONTROLLED & frozenset(names.split(","))
        if held and held in v1:
            found.append(Hierarchy(v1[held], path, held, False))
    return found


def unavailable() -> str | None:
    """Why a local run gets no cgroup with memory and pids limits here, or None when it does."""
    if os.geteuid() != 0:
        return "not root"
    missing = LIMITED - {c for h in hierarchies() for c in h.offered()}
    return f"no {' or '.join(sorted(missing))} cgroup controller" if missing else None


def cpu_unavailable() -> str | None:
    """Why a local run's cgroup gets no CPU weight or cap here, or None when it does."""
    if (why := unavailable()) is not None:
        return why
    return None if any(CPU in h.offered() for h in hierarchies()) else "no cpu cgroup controller"
