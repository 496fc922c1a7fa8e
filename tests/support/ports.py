"""Free TCP ports on 127.0.0.1 for the processes a test starts."""

from __future__ import annotations

import contextlib
import fcntl
import json
import random
import socket
import tempfile
import time
from pathlib import Path

import psutil


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range, which it hands to every outgoing connection."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports are picked below the ephemeral range: a port the kernel chose (bind to port 0) is free only
# until the next outgoing connection of any process on the machine is given it as its own, and a
# server started a moment later then found it taken (Address already in use).
_PORTS = range(20000, min(_ephemeral_start(), 32768))
_BLOCKS = range(_PORTS.start, _PORTS.stop - 100, 97)

# Ports handed out on this machine lately, by every test process (the xdist workers, the fault suite
# beside them, other checkouts): a port is free from its pick until its server binds it, which takes
# seconds for a broker or a database, and another process that picked the same port meanwhile found
# its test-bind free too; one of the two servers then failed with Address already in use.
_CLAIMS = Path(tempfile.gettempdir()) / "runplane-test-ports.json"
CLAIM_SECONDS = 900.0


def _claim(ports: list[int]) -> bool:
    """Record ``ports`` as handed out, unless a process on this machine was handed one of them in the
    last ``CLAIM_SECONDS``."""
    try:
        claims_file = _CLAIMS.open("a+")
    except OSError:  # another user's file: no claims kept, the test-bind alone decides
        return True
    with claims_file:
        fcntl.flock(claims_file, fcntl.LOCK_EX)
        claims_file.seek(0)
        try:
            claims = {int(port): float(at) for port, at in json.loads(claims_file.read() or "{}").items()}
        except (ValueError, AttributeError):
            claims = {}
        now = time.time()
        claims = {port: at for port, at in claims.items() if now - at < CLAIM_SECONDS}
        if any(port in claims for port in ports):
            return False
        claims.update(dict.fromkeys(ports, now))
        claims_file.seek(0)
        claims_file.truncate()
        claims_file.write(json.dumps(claims))
    return True


def free_port() -> int:
    """A port free right now, below the ephemeral range, picked at random and handed to no other test
    process on this machine lately."""
    for _ in range(200):
        port = random.choice(_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        if _claim([port]):
            return port
    raise RuntimeError("no free port below the ephemeral range")


def free_ports(n: int) -> list[int]:
    """``n`` consecutive ports free right now (``runplane up`` gives service i the metrics port base + i).

    The search starts at a random block: from a fixed one, tests on two workers picking blocks at
    once both got the first free one, and one's service found its metrics port taken by the
    other's (Address already in use)."""
    start = random.randrange(len(_BLOCKS))
    for base in [*_BLOCKS[start:], *_BLOCKS[:start]]:
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + n):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            if _claim(list(range(base, base + n))):
                return list(range(base, base + n))
    raise RuntimeError(f"no {n} consecutive free ports")


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on the port."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def listening_by(pid: int, port: int) -> bool:
    """Whether the process ``pid`` (or one of its children) listens on the port: a port free when it
    was picked may have been taken since by another test's server, which ``listening`` cannot tell."""
    try:
        process = psutil.Process(pid)
        family = [process, *process.children(recursive=True)]
        return any(
            c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
            for member in family
            for c in member.net_connections(kind="tcp")
        )
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
