"""Processes held by a pidfd: the only way a process of ours is signalled or watched by its pid.

A pid number is a name the kernel hands out again once its process is reaped (after 32,768 new
processes here), so a pid remembered from earlier may by now be another program's. A pidfd
(``pidfd_open(2)``) names one process for as long as it is open: a signal sent through it reaches
that process or nobody, never a process that got its number later. Each pidfd is opened while the
process is provably the one meant — a child not yet reaped, or a process whose parent is held and
alive both before and after it is read to be the parent — and closed once the process has exited,
so what is held is what is alive.

Used by the local launcher (how many of its runners are alive) and by ``runplane up`` (everything
its services started, stopped at the end).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None when no process has that pid any more.

    Only safe for a pid that cannot have been reused yet: a child of the caller not yet reaped, or a
    pid checked afterwards (:func:`hold_child`)."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def exited(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has exited (its pidfd turns readable then)."""
    poller = select.poll()  # not select(): a dispatcher's pidfds go past its 1,024 descriptors
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


@dataclass(frozen=True)
class HeldProcess:
    """One process, named by a pidfd opened while it was provably the one meant."""

    pid: int
    pidfd: int

    def exited(self) -> bool:
        return exited(self.pidfd)

    def send(self, signum: int) -> None:
        """Signal the process; nothing happens when it has exited (its pid may be another's now)."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signum)

    def reap(self) -> None:
        """Collect its exit status when it is a child of this process (a zombie otherwise lingers)."""
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.pidfd)


def hold(pid: int) -> HeldProcess | None:
    """Hold a child of this process that has not been reaped yet (its pid cannot be another's)."""
    pidfd = open_pidfd(pid)
    return None if pidfd is None else HeldProcess(pid, pidfd)


def _parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` from ``/proc/<pid>/stat`` (after the command name, which may hold spaces)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def hold_child(pid: int, parent: HeldProcess) -> HeldProcess | None:
    """Hold ``pid`` if it is a child of the held ``parent``, else None (it exited, or is another's).

    The pidfd is opened first, then the parent read from ``/proc``: when both the process and the
    parent are still alive after that read, the read was of the process the pidfd names, and its
    parent was ``parent`` — so the pidfd names a child of ``parent``, whatever happened to the
    number before."""
    pidfd = open_pidfd(pid)
    if pidfd is None:
        return None
    held = HeldProcess(pid, pidfd)
    if _parent_of(pid) == parent.pid and not held.exited() and not parent.exited():
        return held
    held.close()
    return None


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process on the machine now (a snapshot; only a hint)."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (parent := _parent_of(int(entry.name))) is not None:
            found[int(entry.name)] = parent
    return found


class Descendants:
    """Every process under some held roots, each held from when it is first seen until it exits."""

    def __init__(self) -> None:
        self._held: dict[int, HeldProcess] = {}

    def __len__(self) -> int:
        return len(self._held)

    def pids(self) -> set[int]:
        return set(self._held)

    def follow(self, roots: Iterable[HeldProcess]) -> None:
        """Drop (and reap) what has exited, then hold every new descendant of ``roots`` and of
        what is held, parents before children."""
        for pid, process in list(self._held.items()):
            if process.exited():
                process.reap()
                process.close()
                del self._held[pid]
        known = {root.pid: root for root in roots if not root.exited()} | self._held
        children: dict[int, list[int]] = {}
        for pid, parent_pid in _parents().items():
            children.setdefault(parent_pid, []).append(pid)
        frontier = list(known.values())
        while frontier:
            parent = frontier.pop()
            for pid in children.get(parent.pid, []):
                if pid not in known and (child := hold_child(pid, parent)) is not None:
                    self._held[pid] = known[pid] = child
                    frontier.append(child)

    def stop(self, grace_seconds: float) -> None:
        """SIGTERM everything held, SIGKILL what is left after ``grace_seconds``; then let go of it all.
        A process that is gone already is skipped: nothing here raises for one."""
        stop(list(self._held.values()), grace_seconds)
        self._held.clear()


def wait(processes: Iterable[HeldProcess], timeout: float) -> list[HeldProcess]:
    """Wait up to ``timeout`` for ``processes`` to exit; the ones that have not."""
    deadline = time.monotonic() + timeout
    left = [p for p in processes if not p.exited()]
    while left and (remaining := deadline - time.monotonic()) > 0:
        poller = select.poll()
        for process in left:
            poller.register(process.pidfd, select.POLLIN)
        poller.poll(min(remaining, 0.5) * 1000)
        left = [p for p in left if not p.exited()]
    return left


def stop(processes: list[HeldProcess], grace_seconds: float) -> None:
    """SIGTERM ``processes``, SIGKILL those alive after ``grace_seconds``, reap our children among
    them and close every pidfd."""
    try:
        for process in processes:
            process.send(signal.SIGTERM)
        for process in wait(processes, grace_seconds):
            process.send(signal.SIGKILL)
        wait(processes, 5.0)
    finally:
        for process in processes:
            if process.exited():
                process.reap()
            process.close()
