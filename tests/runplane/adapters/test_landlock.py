"""The Landlock scope of a run, on this machine's kernel: its own abstract sockets only."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runplane.adapters import landlock

pytestmark = pytest.mark.skipif(landlock.unavailable() is not None, reason=f"{landlock.unavailable()}")

# A process that enters the scope (no_new_privs first, so it needs no root), makes an abstract
# socket of its own, and tries each address it is given.
_SCOPED = """
import ctypes, json, socket, sys
from runplane.adapters import landlock
ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
landlock.scope_abstract_unix_sockets()
own = socket.socket(socket.AF_UNIX)
own.bind("\\0" + sys.argv[1])
own.listen()
outcome = {}
for address in ["@" + sys.argv[1], *sys.argv[2:]]:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect("\\0" + address[1:] if address.startswith("@") else address)
            outcome[address] = "connected"
        except OSError as exc:
            outcome[address] = exc.strerror
print(json.dumps(outcome))
"""


def test_a_scoped_process_reaches_its_own_abstract_sockets_and_no_one_elses(tmp_path: Path) -> None:
    own = f"rp-own-{secrets.token_hex(4)}"
    outside = f"@rp-outside-{secrets.token_hex(4)}"
    path = tmp_path / "pathname.sock"
    with socket.socket(socket.AF_UNIX) as listener, socket.socket(socket.AF_UNIX) as named:
        listener.bind("\0" + outside[1:])
        listener.listen()
        named.bind(str(path))
        named.listen()
        done = subprocess.run(
            [sys.executable, "-c", _SCOPED, own, outside, str(path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    # Pathname sockets are left to file permissions and the mount namespace.
    refused = "Operation not permitted"
    assert json.loads(done.stdout) == {f"@{own}": "connected", outside: refused, str(path): "connected"}
