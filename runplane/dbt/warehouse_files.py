"""Where a local warehouse file (DuckDB's ``path``) may live: somewhere every run of its environment
finds what the last one wrote.

A run sees a host of its own making: its checkout is new each time, and a runner whose run has a uid
of its own gets private temporary directories that are emptied when that uid is leased again. A
database file in any of them is written, reported a success, and gone for the next run. So a path
is refused, when the environment is saved (every door checks a connection through
:func:`runplane.dbt.connections.typed_profile_fields`) and again when the runner writes the profile,
when it is relative (to the run's checkout) or under a directory that does not outlive a run.
"""

from __future__ import annotations

import posixpath

# Temporary or per-boot file systems: a run's private /tmp and /var/tmp, shared memory, /run.
NOT_KEPT = ("/tmp", "/var/tmp", "/run", "/var/run", "/dev/shm", "/dev", "/proc", "/sys")
# DuckDB's own names that are no file on this host: in memory (nothing kept, by its very name) and
# MotherDuck's service.
NOT_FILES = (":memory:",)
SERVICE_PREFIXES = ("md:", "motherduck:")


def unkept_reason(path: str) -> str | None:
    """Why a run could not keep a database at ``path`` for the next run; None when it can."""
    if path in NOT_FILES or path.startswith(SERVICE_PREFIXES):
        return None
    if not path.startswith("/"):
        return "must be an absolute path: a relative one is inside the run's checkout, which the next run does not have"
    normal = posixpath.normpath(path)
    for root in NOT_KEPT:
        if normal == root or normal.startswith(f"{root}/"):
            return f"is under {root}, which a run does not keep: the next run would not find the database"
    return None
