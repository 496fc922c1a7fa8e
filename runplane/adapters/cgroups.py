"""The cgroup hierarchies of this machine that a local run is limited and killed with, as mounted here.

Read from the mounts and ``/proc/self/cgroup``: cgroup v2 (one hierarchy, whose
``cgroup.controllers`` say what it offers), or v1 hierarchies for memory and pids, with or
without a cgroup2 hierarchy beside them (the hybrid layout, where only ``cgroup.kill`` comes from
cgroup2). Used by the runner to make a run's cgroup, by the dispatcher and ``runplane up`` to
say, at start, what the machine cannot offer, and by the dispatcher to kill the run cgroup of a
runner whose run ended without it (:func:`run_cgroups_of`, :func:`kill`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
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


def hierarchies(pid: int | None = None) -> list[Hierarchy]:
    """The hierarchies that count for a run: v1 memory, pids and cpu, and the cgroup2 one; where this
    process sits in them, or process ``pid``."""
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
    for line in Path(f"/proc/{pid or 'self'}/cgroup").read_text().splitlines():
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


def run_cgroups_of(pid: int) -> list[Path]:
    """The run cgroups (``runplane-runs/uid-N``, one per hierarchy) process ``pid`` sits in; none
    when it sits in no run's cgroup (a runner before its fence, or one without a cgroup)."""
    found = []
    for hierarchy in hierarchies(pid):
        directory = hierarchy.own_directory
        if directory.parent.name == PARENT and directory.name.startswith("uid-"):
            found.append(directory)
    return found


def open_cgroup(directory: Path) -> int:
    """A descriptor of the cgroup at ``directory``: it names that cgroup and no other made later at the
    same path (a uid's next run)."""
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def kill(directory: Path, deadline: float, opened: int | None = None) -> None:
    """Kill every process of the cgroup at ``directory`` (``cgroup.kill`` where there is one, then
    the processes it still lists) and remove it once it is empty (it may already be gone). With
    ``opened`` (from :func:`open_cgroup`), only the cgroup it names is touched, whatever is at that
    path now."""
    try:
        fd = opened if opened is not None else open_cgroup(directory)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        with contextlib.suppress(OSError):
            _write_at(fd, "cgroup.kill", "1")
        while time.monotonic() < deadline:
            try:
                pids = [int(p) for p in _read_at(fd, "cgroup.procs").split()]
            except OSError:
                return  # removed meanwhile
            if not pids:
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(directory).st_ino == os.fstat(fd).st_ino:
                        directory.rmdir()
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)  # the kernel ends the killed processes asynchronously
        raise OSError(errno.EBUSY, f"processes of {directory} did not end in time")
    finally:
        if opened is None:
            os.close(fd)


def _read_at(directory: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=directory)
    with os.fdopen(fd) as file:
        return file.read()


def _write_at(directory: int, name: str, value: str) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=directory)
    with os.fdopen(fd, "w") as file:
        file.write(value)


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
