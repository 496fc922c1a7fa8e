"""Where a local warehouse file (DuckDB's ``path``) may live: somewhere every run of its environment
finds what the last one wrote, and no run of any other environment can open.

A run sees a host of its own making: its checkout is new each time, and a runner whose run has a uid
of its own gets private temporary directories that are emptied when that uid is leased again. A
database file in any of them is written, reported a success, and gone for the next run. So a path
is refused, when the environment is saved (every door checks a connection through
:mod:`runplane.dbt.connections`) and again when the runner writes the profile,
when it is relative (to the run's checkout) or under a directory that does not outlive a run.

Runs of one environment execute as different uids (``runner.run_user``), so the file lives in a
directory of the environment's own under the warehouse root (``runner.local_warehouse_root``):
``<root>/<directory>/<file>``. The first directory below the root belongs to the environment that
named it first (claimed when it is saved, never given to another), and on disk it is root's, of the
environment's own group (``runner.local_warehouse_gid`` + the environment's id), mode 2770: every
run of the environment joins that group for the run alone, so it reads and writes what an earlier
run of any uid wrote there, and a run of any other environment cannot even enter it.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from runplane.basics.settings import Settings

# Temporary or per-boot file systems: a run's private /tmp and /var/tmp, shared memory, /run.
NOT_KEPT = ("/tmp", "/var/tmp", "/run", "/var/run", "/dev/shm", "/dev", "/proc", "/sys")
# DuckDB's own names that are no file on this host: in memory (nothing kept, by its very name) and
# MotherDuck's service.
NOT_FILES = (":memory:",)
SERVICE_PREFIXES = ("md:", "motherduck:")
GID_LIMIT = 2**32 - 2  # the largest gid; 2**32 - 1 is the kernel's "no group"


def is_file(path: str) -> bool:
    """Whether DuckDB's ``path`` names a file on the runner's host (not memory, not MotherDuck)."""
    return path not in NOT_FILES and not path.startswith(SERVICE_PREFIXES)


def unkept_reason(path: str) -> str | None:
    """Why a run could not keep a database at ``path`` for the next run; None when it can."""
    if not is_file(path):
        return None
    if not path.startswith("/"):
        return "must be an absolute path: a relative one is inside the run's checkout, which the next run does not have"
    normal = posixpath.normpath(path)
    for root in NOT_KEPT:
        if normal == root or normal.startswith(f"{root}/"):
            return f"is under {root}, which a run does not keep: the next run would not find the database"
    return None


@dataclass(frozen=True)
class WarehouseFiles:
    """Where runs of this installation keep warehouse files: ``root`` on the runners' host, or
    nowhere (empty: runs execute in Kubernetes Pods, whose files end with the Pod)."""

    root: str

    @classmethod
    def of(cls, settings: Settings) -> WarehouseFiles:
        """The rule of the launcher the dispatchers use: local runs keep files under the root, Pods none."""
        if settings.dispatcher.launcher == "kubernetes":
            return cls("")
        return cls.of_root(settings.runner.local_warehouse_root)

    @classmethod
    def of_root(cls, root: str) -> WarehouseFiles:
        """The rule of a runner's host: files under ``root``, none when it is empty (a Pod)."""
        return cls(posixpath.normpath(root) if root else "")

    def directory(self, path: str) -> str:
        """The environment's directory that holds ``path`` (``<root>/<directory>``); raises
        :class:`WarehousePathRefused` with the reason when a run may not keep a file there."""
        reason = unkept_reason(path)
        if reason is not None:
            raise WarehousePathRefused(reason)
        if not self.root:
            raise WarehousePathRefused(
                "is a file on the runner's host, and runs here execute in Kubernetes Pods, which keep no file: "
                "use MotherDuck (md:…) or a warehouse server"
            )
        relative = posixpath.relpath(posixpath.normpath(path), self.root)
        parts = relative.split("/")
        if parts[0] == ".." or relative == ".":
            raise WarehousePathRefused(
                f"is outside the warehouse root {self.root}: a run keeps a DuckDB file only in a directory of its "
                f"environment there ({self.root}/<directory>/<file>)"
            )
        if len(parts) < 2:
            raise WarehousePathRefused(
                f"is directly in the warehouse root {self.root}: put it in a directory of the environment's own "
                f"({self.root}/<directory>/<file>)"
            )
        return posixpath.join(self.root, parts[0])


class WarehousePathRefused(ValueError):
    """A warehouse file a run may not keep; the message says why."""


def environment_gid(base: int, environment_id: int) -> int:
    """The group of the environment's warehouse directory, joined by its runs alone."""
    gid = base + environment_id
    if not 0 < gid <= GID_LIMIT:
        raise WarehousePathRefused(f"environment {environment_id} has no group below {GID_LIMIT} from {base}")
    return gid
