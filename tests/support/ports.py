"""Free TCP ports on 127.0.0.1 for the processes a test starts."""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    """A port free right now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` consecutive ports free right now (``runplane up`` gives service i the metrics port base + i)."""
    for base in range(24000, 60000, 97):
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + n):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return list(range(base, base + n))
    raise RuntimeError(f"no {n} consecutive free ports")


def listening(port: int) -> bool:
    """Whether something accepts connections on the port."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
