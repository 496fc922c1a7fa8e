"""The uid a local run executes as: leased for the run's lifetime, cleared of what came before.

A root launcher gives every run one of ``runner.local_uid_count`` uids from ``runner.local_uid``.
Uids are fewer than runs, so a uid is *leased*: an exclusive ``flock`` on
``/run/runplane-uids/<uid>`` (machine-wide, shared by every runplane install on the host), taken
by the runner before it switches and held until it exits, and by its run cgroup's keeper until
the cgroup is empty (``runner.run_cgroup``): never free while a process of the run lives. The
search starts at run id modulo the count and takes the first free uid, so two runs never hold one
uid at once.

Taking a lease clears the uid of what an earlier holder left behind, because that holder was
another account's run: every process still running as that uid is killed (a step that
daemonised itself would otherwise watch the next run), what is left of its run cgroup is killed
and removed, files it owns at the top of the shared temporary directories (``/tmp``, ``/var/tmp``,
``/dev/shm``) are removed, its scratch space is unmounted, and its private directory is made again,
empty. That directory,
``/var/lib/runplane/runs/<uid>`` (``runner.local_run_root``), holds the run's disk: a tmpfs of
``runner.local_disk_mb`` holding its HOME and the directory its checkout is made in, and its scratch
space: a tmpfs of ``runner.local_scratch_mb`` holding its
temporary directory and its own copy of every world-writable place of the machine
(``runplane.run_scratch``); both bound what a run may write on the machine. Its parent is
root's and closed to listing, so no other uid can create, plant in or
block it. A run therefore shares nothing with any other run through its uid.
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

from runner import run_cgroup
from runplane.adapters import run_scratch
from runplane.basics.settings import RunnerSettings

LEASES = Path("/run/runplane-uids")


class NoFreeUid(RuntimeError):
    """Every uid of the range is leased by a running run."""


SHARED_TEMPORARY = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
SCRATCH = "scratch"  # the run's scratch space in its private directory (``runplane.run_scratch``)
DISK = "disk"  # the run's HOME and checkout, size-capped, in its private directory


@dataclass(frozen=True)
class RunUser:
    uid: int
    home: Path
    lease_fd: int  # held open (close-on-exec) for the runner's lifetime: the lease
    tmp: Path  # the run's own temporary directory (TMPDIR, and /tmp and /var/tmp of its steps)
    work: Path  # where the run's checkout is made, beside HOME
    scratch: Path | None = None  # the run's size-capped scratch tmpfs, holding ``tmp`` (None: not mounted here)
    disk: Path | None = None  # the run's size-capped tmpfs holding ``home`` and ``work`` (None: not mounted here)


def lease_for_run(runner: RunnerSettings, run_id: int) -> RunUser | None:
    """As root, a uid leased for the run, not switched to yet (None when not root, or with ``local_uid`` -1)."""
    if not runs_have_own_uids(runner):
        return None
    return lease_run_user(runner, run_id, runs=Path(runner.local_run_root))


def switch_to(user: RunUser, groups: tuple[int, ...] = ()) -> None:
    """Become the run's uid, for good. After the switch the kernel marks this process non-dumpable,
    so even its own steps cannot read its memory, environment or open files; the control plane's
    processes (root) and other runs (other uids) are out of reach. HOME and the temporary directory
    become the run's own. ``groups``: the run's supplementary groups (its environment's warehouse
    directory, ``runner.warehouse_directory``), for this run alone; the umask keeps what the run
    writes open to them (its primary group is its uid's own, which no other uid has)."""
    os.setgroups(list(groups))
    os.umask(0o007)
    os.setgid(user.uid)
    os.setuid(user.uid)
    os.environ["HOME"] = str(user.home)
    os.environ["TMPDIR"] = str(user.tmp)
    tempfile.tempdir = str(user.tmp)


def runs_have_own_uids(runner: RunnerSettings) -> bool:
    """Whether runners switch to a uid of the run's own: as root, unless ``local_uid`` is -1."""
    return runner.local_uid >= 0 and os.geteuid() == 0


def lease_run_user(runner: RunnerSettings, run_id: int, leases: Path = LEASES, runs: Path | None = None) -> RunUser:
    """As root: the first free uid from ``run_id`` modulo the count, cleared, with an empty HOME and
    temporary directory in ``runs/<uid>``."""
    runs = Path(runner.local_run_root) if runs is None else runs
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
        run_cgroup.clear(uid)
        remove_files_of(uid)
        for mounted in (SCRATCH, DISK):
            run_scratch.unmount(runs / str(uid) / mounted)
        private = fresh_private_directory(runs, uid)
        scratch = private / SCRATCH
        disk = private / DISK
        capped = run_scratch.unavailable() is None
        if capped:
            _private_directory(scratch)
            run_scratch.mount(scratch, uid, runner.local_scratch_mb * 1024 * 1024)
            _private_directory(disk)
            run_scratch.mount_tmpfs(disk, uid, runner.local_disk_mb * 1024 * 1024, "HOME and checkout")
        else:
            run_scratch.make_directories(_private_directory(scratch, uid), uid)
            _private_directory(disk, uid)
        home = _private_directory(disk / "home", uid)
        work = _private_directory(disk / "work", uid)
        return RunUser(
            uid,
            home,
            fd,
            scratch / run_scratch.TEMPORARY_NAME,
            work,
            scratch if capped else None,
            disk if capped else None,
        )
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


def remove_files_of(uid: int, places: tuple[Path, ...] = SHARED_TEMPORARY) -> None:
    """Remove what ``uid`` owns at the top of the shared temporary directories (as root: a mode
    the owner set, such as a directory made unreadable, does not stop it)."""
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            except FileNotFoundError:
                continue


def fresh_private_directory(runs: Path, uid: int) -> Path:
    """``runs/<uid>``, empty, owned by ``uid`` and private to it. ``runs`` is root's own and others
    may enter but not list or write it, so no other uid can make or hold ``runs/<uid>``."""
    runs.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    _private_directory(runs, mode=0o711)
    return _private_directory(runs / str(uid), uid, empty=True)


def _private_directory(path: Path, uid: int = 0, *, empty: bool = False, mode: int = 0o700) -> Path:
    """``path`` as a directory ``uid`` owns and only it enters (``mode``): whatever else is there (or
    anything at all, when ``empty``) is removed first and the directory made again."""
    try:
        found = path.lstat()
    except FileNotFoundError:
        found = None
    if found is not None and (
        empty or not (stat.S_ISDIR(found.st_mode) and found.st_uid == uid and stat.S_IMODE(found.st_mode) == mode)
    ):
        if stat.S_ISDIR(found.st_mode):
            shutil.rmtree(path)
        else:
            path.unlink()
        found = None
    if found is None:
        path.mkdir(mode=0o700, parents=not empty, exist_ok=not empty)
        os.chown(path, uid, uid)
        path.chmod(mode)
    return path
