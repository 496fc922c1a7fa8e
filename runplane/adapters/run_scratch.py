"""A local run's scratch space: one size-capped tmpfs holding every place a step may write outside its
checkout and HOME, private to the run and emptied before its uid is leased again.

A machine has shared places any uid may write: ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``,
and whatever else is world-writable on it. Shared, they let one run leave a file or a listening
socket for the next run of its uid to read or answer, and fill the root file system. So every one of
them becomes, for the run's steps, a directory of the run's own scratch tmpfs (``runner.sandbox``
binds it over the place): ``/tmp`` and ``/var/tmp`` its temporary directory (its ``TMPDIR`` too),
each other place a directory of its own. The tmpfs has ``runner.local_scratch_mb`` of room: a
step that writes past it gets ENOSPC, and the run ends with "disk quota exceeded". Its pages are
memory charged to the run's cgroup, as a Pod's memory-backed emptyDir is.

The places are found once per process (``places``): the fixed ones above and ``/run/user``, and
every world-writable directory at the top two levels of the root and the top level of every other
mounted file system (kernel file systems left out; ``/dev`` is the run's own already). The
dispatcher and ``runplane up`` say at start which they are.

The mount is root's, made when the uid is leased (``mount``) and taken away at the next lease of
the uid (``unmount``): a mount(2) and a umount2(2) through ``ctypes``, no command run.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
from pathlib import Path

# Always given to a run when they exist: the shared places of a Linux machine (FHS), world-writable
# or meant for per-user runtime files.
FIXED = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/run/user")
TEMPORARY = ("/tmp", "/var/tmp")  # the run's temporary directory; every other place, a directory of its own
# File systems that are the kernel's views, not storage a run could fill or share files through.
_KERNEL_FILE_SYSTEMS = frozenset(
    {
        "proc", "sysfs", "cgroup", "cgroup2", "devpts", "devtmpfs", "mqueue", "debugfs", "tracefs",
        "securityfs", "pstore", "bpf", "configfs", "fusectl", "hugetlbfs", "binfmt_misc", "autofs", "nsfs",
        "efivarfs", "rpc_pipefs", "selinuxfs",
    }
)  # fmt: skip
# The run's own already: bubblewrap gives a step a /dev, /proc and /sys of its namespaces' (or read-only).
_NOT_SHARED = ("/proc", "/sys", "/dev")
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MNT_DETACH = 0x2
TEMPORARY_NAME = "tmp"


def _mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) of this process's mounts."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3:
            found.append((fields[1].replace("\\040", " "), fields[2]))
    return found


def _world_writable(path: str) -> bool:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISDIR(mode) and bool(mode & stat.S_IWOTH)


def _children(directory: str) -> list[str]:
    try:
        return [entry.path for entry in os.scandir(directory) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _covered(path: str, by: list[str]) -> bool:
    return any(path == other or path.startswith(other.rstrip("/") + "/") for other in by)


@functools.cache
def places() -> tuple[str, ...]:
    """The places a run's steps get as directories of its scratch space, found once: the fixed
    ones that exist, and the machine's world-writable directories (not those inside another place)."""
    kernel = [point for point, kind in _mounts() if kind in _KERNEL_FILE_SYSTEMS and point != "/"]
    skip = [*_NOT_SHARED, *kernel]
    candidates = [p for p in FIXED if os.path.isdir(p) and not os.path.islink(p)]
    for top in _children("/"):
        candidates += [top, *_children(top)]
    for point, kind in _mounts():
        if kind not in _KERNEL_FILE_SYSTEMS and point != "/":
            candidates += [point, *_children(point)]
    found: list[str] = []
    for path in sorted(set(candidates), key=lambda p: (p.count("/"), p)):  # parents first
        if _covered(path, found) or (_covered(path, skip) and path != "/dev/shm"):
            continue
        if path in FIXED or _world_writable(path):
            found.append(path)
    return tuple(found)


def directory_name(place: str) -> str:
    """The directory of the scratch space that stands for ``place`` in a step (``/run/lock`` → ``run-lock``)."""
    return TEMPORARY_NAME if place in TEMPORARY else place.strip("/").replace("/", "-")


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def mount(target: Path, uid: int, size_bytes: int) -> None:
    """As root: a tmpfs of ``size_bytes`` at ``target`` (an empty directory), the uid's own and
    closed to others, with a directory of the uid's for every place (``places``)."""
    mount_tmpfs(target, uid, size_bytes)
    make_directories(target, uid)


def mount_tmpfs(target: Path, uid: int, size_bytes: int, what: str = "scratch space") -> None:
    """As root: an empty tmpfs of ``size_bytes`` at ``target`` (an empty directory), the uid's own
    and closed to others; also a run's HOME and checkout (``runner.run_user``)."""
    options = f"size={size_bytes},mode=0700,uid={uid},gid={uid}".encode()
    if _libc().mount(b"runplane-scratch", str(target).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mounting the run's {what}: {os.strerror(code)}", str(target))


def make_directories(target: Path, uid: int) -> None:
    """As root: in the scratch space at ``target``, a directory of the uid's for every place."""
    for name in sorted({directory_name(place) for place in places()} | {TEMPORARY_NAME}):
        path = target / name
        path.mkdir(mode=0o700)
        os.chown(path, uid, uid)


def unmount(target: Path) -> None:
    """As root: take away the scratch tmpfs at ``target`` (with what is in it); nothing when there is none."""
    if not target.is_mount():
        return
    if _libc().umount2(str(target).encode(), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):
            raise OSError(code, f"unmounting a run's scratch space: {os.strerror(code)}", str(target))


def full(target: Path) -> bool:
    """Whether the scratch space at ``target`` has no room or no inode left: a write there failed."""
    try:
        found = os.statvfs(target)
    except OSError:
        return False
    return found.f_bavail == 0 or found.f_favail == 0


def unavailable() -> str | None:
    """Why a run's scratch space cannot be mounted here (mounting needs root's CAP_SYS_ADMIN), or None."""
    if os.geteuid() != 0:
        return "not root"
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:") and not int(line.split()[1], 16) & (1 << 21):
            return "no CAP_SYS_ADMIN to mount a tmpfs"
    return None
