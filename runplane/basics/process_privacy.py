"""Keep a control-plane process's environment, memory and open files from other processes of its user.

A run's steps are customer code. When runners share the control plane's user (a dispatcher that is
not root cannot give them uids of their own), a step could otherwise read ``/proc/<pid>/environ``
of any control-plane process of that user, and the database URL with it. A process that is not
"dumpable" has its ``/proc/<pid>`` files owned by root and refuses ptrace from its own user
(prctl(2), ``PR_SET_DUMPABLE``), which closes that path. execve resets the flag, so the runners a
dispatcher starts are not affected (they hold no control-plane credential).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

PR_SET_DUMPABLE = 4


def make_undumpable() -> None:
    """Mark this process not dumpable (Linux; elsewhere nothing to do)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_DUMPABLE, 0): {os.strerror(errno)}")
