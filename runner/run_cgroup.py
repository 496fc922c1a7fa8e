"""A cgroup per local run: memory, pids and CPU limits over everything the run starts, killed whole at its end.

Made as root when the run starts, under the cgroup the runner was started in (a machine's own
processes may already sit in a limited one), named after the run's uid (``runplane-runs/uid-N``:
a uid is leased to one run at a time, so the name is the run's while it runs). Both layouts are
read from ``/proc/self/cgroup`` and the mounts:

- cgroup v2 (one hierarchy): ``memory.max``, ``pids.max``, ``cpu.weight``, ``cpu.max`` and
  ``cgroup.kill`` in one directory;
- hybrid or v1: ``memory.limit_in_bytes`` in the v1 memory hierarchy, ``pids.max`` in the v1 pids
  hierarchy, ``cpu.shares`` and ``cpu.cfs_quota_us`` in the v1 cpu hierarchy (when there is one),
  and ``cgroup.kill`` from the cgroup2 hierarchy mounted beside them (``unified``)
  when there is one; without it the processes listed in ``cgroup.procs`` are killed until none is
  left (a process cannot leave its cgroup without root, and ``pids.max`` bounds what it may start).

The runner joins the cgroup before it switches to the run's uid, so every process of the run is
in it, daemons included. A *keeper* started just before (root, outside the cgroup, its stdin the
read end of a pipe only the runner holds) kills and removes the cgroup when the runner ends, however
it ends; the next lease of the uid does the same for a keeper that did not get to. The keeper also
holds the uid's lease (a duplicate of the runner's locked descriptor): the uid is free for another
run only once the keeper has emptied the cgroup and exited, never while a process of the run lives.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from runplane.adapters.cgroups import CONTROL, CPU, Hierarchy, controllers_of, hierarchies, kill

RUNNER_ALLOWANCE = 256 * 1024 * 1024  # the runner's own memory, on top of the run's memory limit
KILL_TIMEOUT = 10.0
CPU_PERIOD_US = 100_000  # the period a run's CPU cap is counted over

# Waits for EOF on stdin (the runner is gone), then kills every process of the cgroups named in
# its arguments and removes them, and takes away the run's scratch space and disk ($SCRATCH, $DISK, when set: their
# pages are memory, not to be held until the uid's next lease); the uid's lease (its descriptor 4,
# when given) is released as it exits, after that. It ignores the signals a terminal or a shutdown
# would send.
_KEEPER = """trap '' INT TERM HUP
read -r _
for d in "$@"; do [ -e "$d/cgroup.kill" ] && echo 1 > "$d/cgroup.kill"; done
i=0
for d in "$@"; do
  while read -r p < "$d/cgroup.procs" && [ "$i" -lt 400 ]; do
    xargs -r kill -9 < "$d/cgroup.procs" 2>/dev/null; sleep 0.025; i=$((i + 1))
  done
  rmdir "$d" "${d%/*}" 2>/dev/null
done
[ -n "$SCRATCH" ] && umount -l "$SCRATCH" 2>/dev/null
[ -n "$DISK" ] && umount -l "$DISK" 2>/dev/null
"""
# Runs the keeper ($0) in the background with this shell's stdin (an asynchronous list would get
# /dev/null), under its own name.
_DETACH = 'exec 3<&0; /bin/sh -c "$0" runplane-cgroup-keeper "$@" <&3 3<&- &'


@dataclass(frozen=True)
class RunCgroup:
    directories: tuple[Path, ...]  # one per hierarchy, the run's leaf

    def oom_kills(self) -> int:
        """How many processes of the run the kernel killed for its memory limit so far."""
        for directory in self.directories:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError):
                    for line in (directory / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
        return 0

    def _counter(self, name: str, key: str) -> int | None:
        for directory in self.directories:
            with contextlib.suppress(OSError, ValueError):
                for line in (directory / name).read_text().splitlines():
                    found, _, value = line.partition(" ")
                    if found == key:
                        return int(value)
        return None

    def limits_reached(self) -> LimitsReached:
        """How often the run met its pids and CPU limits so far (the kernel's counters)."""
        throttled_ns = self._counter("cpu.stat", "throttled_time")  # v1, nanoseconds
        if throttled_ns is None:
            throttled_ns = (self._counter("cpu.stat", "throttled_usec") or 0) * 1000
        return LimitsReached(
            forks_refused=self._counter("pids.events", "max") or 0,
            cpu_throttled=self._counter("cpu.stat", "nr_throttled") or 0,
            cpu_throttled_seconds=throttled_ns / 1e9,
        )


@dataclass(frozen=True)
class LimitsReached:
    forks_refused: int = 0  # pids.events max: a fork or clone refused for pids.max
    cpu_throttled: int = 0  # periods in which the run used its whole CPU cap
    cpu_throttled_seconds: float = 0.0

    def since(self, before: LimitsReached) -> list[str]:
        """What was reached after ``before``, each said for the step's log; empty when nothing was."""
        said = []
        if (forks := self.forks_refused - before.forks_refused) > 0:
            said.append(f"{forks} new processes or threads refused at the run's limit (pids.max)")
        if (periods := self.cpu_throttled - before.cpu_throttled) > 0:
            seconds = self.cpu_throttled_seconds - before.cpu_throttled_seconds
            said.append(f"held back at the run's CPU cap in {periods} periods of 100 ms ({seconds:.1f} s waiting)")
        return said


def _write(path: Path, value: str) -> None:
    with path.open("w") as file:
        file.write(value)


def _prepare_v2_parent(hierarchy: Hierarchy) -> None:
    """Let ``runplane-runs`` hand memory and pids down to the runs' leaves (v2's "no processes in
    inner cgroups" rule: the controllers are enabled from the top of our own subtree)."""
    own = hierarchy.own_directory
    wanted = hierarchy.offered()
    if not wanted:
        return
    enable = " ".join(f"+{c}" for c in sorted(wanted))
    base = hierarchy.base
    base.mkdir(exist_ok=True)
    for directory in (own, base):
        try:
            _write(directory / "cgroup.subtree_control", enable)
        except OSError as exc:
            if exc.errno != errno.EBUSY or directory != own:
                raise
            # Our own cgroup holds processes: they move to a leaf of their own first, as systemd's
            # delegation asks, and the controllers are enabled above them.
            leaf = own / CONTROL
            leaf.mkdir(exist_ok=True)
            for pid in (own / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    _write(leaf / "cgroup.procs", pid)
            _write(directory / "cgroup.subtree_control", enable)


def clear(uid: int) -> None:
    """As root: kill and remove what is left of the uid's last run's cgroup (its keeper did not get to it)."""
    deadline = time.monotonic() + KILL_TIMEOUT
    for hierarchy in hierarchies():
        kill(hierarchy.base / f"uid-{uid}", deadline)


def cpu_limits(weight: int, cpus: float, *, v2: bool) -> dict[str, str]:
    """The cpu controller's files for a run of ``weight`` (v2 ``cpu.weight``, 1–10000, 100 an equal
    share) capped at ``cpus`` CPUs (0: no cap), over ``CPU_PERIOD_US``, in either layout."""
    quota = round(cpus * CPU_PERIOD_US) if cpus > 0 else None
    if v2:
        return {"cpu.weight": str(weight), "cpu.max": f"{quota or 'max'} {CPU_PERIOD_US}"}
    return {
        "cpu.shares": str(max(2, weight * 1024 // 100)),
        "cpu.cfs_period_us": str(CPU_PERIOD_US),
        "cpu.cfs_quota_us": str(quota or -1),
    }


def create(uid: int, *, memory_bytes: int, pids_max: int, cpu_weight: int = 100, cpu_max: float = 0.0) -> RunCgroup:
    """As root: a fresh cgroup for the uid's run in every hierarchy, limits set (none joined yet)."""
    clear(uid)
    directories = []
    for hierarchy in hierarchies():
        leaf = hierarchy.base / f"uid-{uid}"
        for attempt in range(3):  # a keeper removes the parent when its run was the last one in it
            if hierarchy.v2:
                _prepare_v2_parent(hierarchy)
            hierarchy.base.mkdir(exist_ok=True)
            try:
                leaf.mkdir()
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        directories.append(leaf)
        if "memory" in hierarchy.controllers:
            _write(leaf / "memory.limit_in_bytes", str(memory_bytes))
        if "pids" in hierarchy.controllers:
            _write(leaf / "pids.max", str(pids_max))
        if CPU in hierarchy.controllers:
            for name, value in cpu_limits(cpu_weight, cpu_max, v2=False).items():
                _write(leaf / name, value)
        if hierarchy.v2:
            available = controllers_of(leaf)
            if "memory" in available:
                _write(leaf / "memory.max", str(memory_bytes))
                _write(leaf / "memory.swap.max", "0")
            if "pids" in available:
                _write(leaf / "pids.max", str(pids_max))
            if CPU in available:
                for name, value in cpu_limits(cpu_weight, cpu_max, v2=True).items():
                    _write(leaf / name, value)
    return RunCgroup(tuple(directories))


LEASE_FD = 4  # where the keeper holds the uid's lease


def join(cgroup: RunCgroup, lease_fd: int | None = None, scratch: Path | None = None, disk: Path | None = None) -> int:
    """Start the keeper (holding ``lease_fd``, the uid's lease, until the cgroup is empty), then move
    this process into the run's cgroups; the pipe end to hold until exit. ``scratch`` and ``disk``: the
    run's scratch space and its HOME and checkout, unmounted by the keeper once the run's processes are gone."""
    read_end, write_end = os.pipe()  # not inherited: no step holds the write end
    try:
        # Started in the background of a shell that exits at once: the keeper is nobody's child,
        # so whatever kills the runner's process tree leaves it to do its work.
        launcher = os.posix_spawn(
            "/bin/sh",
            ["/bin/sh", "-c", _DETACH, _KEEPER, *map(str, cgroup.directories)],
            {"PATH": "/usr/bin:/bin", "SCRATCH": str(scratch or ""), "DISK": str(disk or "")},
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read_end, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                *([(os.POSIX_SPAWN_DUP2, lease_fd, LEASE_FD)] if lease_fd is not None else []),
            ],
            setsid=True,
        )
        os.waitpid(launcher, 0)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    for directory in cgroup.directories:
        _write(directory / "cgroup.procs", str(os.getpid()))
    return write_end
