"""The uid a local run executes as: leased for the run's lifetime, cleared of what came before.

A root launcher gives every run one of ``runner.local_uid_count`` uids from ``runner.local_uid``.
Uids are fewer than runs, so a uid is *leased*: an exclusive ``flock`` on
``/run/runplane-uids/<uid>`` (machine-wide, shared by every runplane install on the host), taken
by the runner before it switches and held until it exits. The search starts at run id modulo the
count and takes the first free uid, so two runs never hold one uid at once.

Taking a lease clears the uid of what an earlier holder left behind, because that holder was
another account's run: every process still running as that uid is killed (a step that
daemonised itself would otherwise watch the next run), and the uid's HOME is emptied (caches,
dotfiles a step planted). A run therefore shares nothing with any other run through its uid.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runplane.basics.settings import RunnerSettings

LEASES = Path("/run/runplane-uids")


class NoFreeUid(RuntimeError):
    """Every uid of the range is leased by a running run."""


@dataclass(frozen=True)
class RunUser:
    uid: int
    home: Path
    lease_fd: int  # held open (close-on-exec) for the runner's lifetime: the lease


def become_run_user(runner: RunnerSettings, run_id: int) -> RunUser | None:
    """Lease a uid for the run and switch to it (only as root; None otherwise, or with ``local_uid`` -1).

    After the switch the kernel marks this process non-dumpable, so even its own steps cannot read
    its memory, environment or open files; the control plane's processes (root) and other runs
    (other uids) are out of reach. HOME becomes the uid's own, emptied for this run.
    """
    if runner.local_uid < 0 or os.geteuid() != 0:
        return None
    user = lease_run_user(runner, run_id)
    os.setgroups([])
    os.setgid(user.uid)
    os.setuid(user.uid)
    os.environ["HOME"] = str(user.home)
    return user


def lease_run_user(runner: RunnerSettings, run_id: int, leases: Path = LEASES) -> RunUser:
    """As root: the first free uid from ``run_id`` modulo the count, cleared and with an empty HOME."""
    directory = _private_directory(leases)
    count = runner.local_uid_count
    for offset in range(count):
        uid = runner.local_uid + (run_id + offset) % count
        fd = os.open(directory / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        kill_processes_of(uid)
        return RunUser(uid, fresh_home(uid), fd)
    raise NoFreeUid(f"all {count} run uids from {runner.local_uid} are in use; raise runner.local_uid_count")


def kill_processes_of(uid: int) -> None:
    """SIGKILL every process running as ``uid``: a shell started as that uid signals -1, which
    reaches exactly the processes the uid may signal (its own), in one pass over the process table
    that a fork cannot slip past. Started by ``subprocess`` (no Python fork: the caller may already
    run gRPC's threads); ``/bin/sh`` is one program every uid can execute."""
    subprocess.run(
        ["/bin/sh", "-c", "kill -9 -1"],
        user=uid,
        group=uid,
        extra_groups=[],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # "No such process" when nothing of that uid runs
        env={},
        cwd="/",
        check=False,
        timeout=10,
    )


def fresh_home(uid: int) -> Path:
    """``$TMPDIR/runplane-home-<uid>``, empty, owned by ``uid`` and private to it (made as root).

    Made with ``exist_ok=False``: anything another uid puts there between the removal and the
    ``mkdir`` (a symlink to follow) fails the run, which is relaunched."""
    home = Path(tempfile.gettempdir()) / f"runplane-home-{uid}"
    return _private_directory(home, uid, empty=True)


def _private_directory(path: Path, uid: int = 0, *, empty: bool = False) -> Path:
    """``path`` as a directory ``uid`` owns and only it enters: whatever else is there (or anything
    at all, when ``empty``) is removed first and the directory made again."""
    try:
        found = path.lstat()
    except FileNotFoundError:
        found = None
    if found is not None and (
        empty or not (stat.S_ISDIR(found.st_mode) and found.st_uid == uid and stat.S_IMODE(found.st_mode) == 0o700)
    ):
        if stat.S_ISDIR(found.st_mode):
            shutil.rmtree(path)
        else:
            path.unlink()
        found = None
    if found is None:
        path.mkdir(mode=0o700, parents=not empty, exist_ok=not empty)
        os.chown(path, uid, uid)
        path.chmod(0o700)
    return path
