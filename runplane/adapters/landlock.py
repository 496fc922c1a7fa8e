"""A local run's abstract Unix sockets: the run reaches its own only (a Landlock scope).

A step shares the host's network namespace (it needs a route out to its warehouses), and nftables
filters IP only: any abstract Unix socket on the machine (a name starting with NUL, no file, so no
file permission) would be open to it, the control plane's processes' and other runs' included.
Landlock's ``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`` (ABI 6, Linux 6.12) closes them: a process in a
Landlock domain with that scope may connect or send only to abstract sockets made inside that
domain (or one nested in it). The runner enters a domain of its own for its run, so its steps keep
their own abstract sockets and reach no one else's.

The kernel has no binding in Python's standard library; two system calls through ``ctypes`` are
enough, with numbers that are the same on every architecture.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys

_SYS_CREATE_RULESET = 444
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_ABI = 6  # the first ABI with scopes


class LandlockError(OSError):
    """The kernel refused the run's Landlock domain."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _syscall(number: int, *arguments: object) -> int:
    result: int = _libc().syscall(ctypes.c_long(number), *arguments)
    if result < 0:
        code = ctypes.get_errno()
        raise LandlockError(code, os.strerror(code))
    return result


def abi() -> int:
    """The Landlock ABI this kernel offers; 0 when it has none or it is disabled."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        return _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except LandlockError as exc:
        if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
            return 0
        raise


def unavailable() -> str | None:
    """Why a run's abstract Unix sockets cannot be fenced here, or None when they can."""
    found = abi()
    if found == 0:
        return "the kernel has no Landlock (Linux 5.13+, with landlock in its lsm= list)"
    if found < SCOPE_ABI:
        return f"the kernel's Landlock (ABI {found}) has no scopes (ABI {SCOPE_ABI}, Linux 6.12)"
    return None


def scope_abstract_unix_sockets() -> None:
    """Enter a Landlock domain of this thread's own where only abstract Unix sockets made inside it
    can be reached. Landlock binds the calling thread and what it starts afterwards, for good: call it
    on the thread that starts the run's processes. Needs root (``CAP_SYS_ADMIN``) or no_new_privs."""
    attr = _RulesetAttr(0, 0, SCOPE_ABSTRACT_UNIX_SOCKET)
    size = ctypes.c_size_t(ctypes.sizeof(attr))
    ruleset = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), size, ctypes.c_uint32(0))
    try:
        _syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
