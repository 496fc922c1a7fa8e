"""Run as a step (plain ``python3 -I``, standard library only): look for control-plane credentials.

It reads what a customer's code could reach: the environment and command line of every ancestor
along ``/proc`` and of every other process it can see, the files its ancestors hold open, and every
file under the work directory. Whatever looks like a Postgres, Redis or RabbitMQ URL, a runplane
setting that holds one, a secret key or a run token is collected, and for each URL found it tries
to connect. It prints one line ``PROBE {json}`` with what it tried and found.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections.abc import Callable
from functools import partial
from urllib.parse import urlsplit

PATTERN = re.compile(
    r"(?:postgres(?:ql)?|redis|rediss|amqps?)://[^\s\x00'\"]+"
    r"|RUNPLANE_(?:DATABASE_URL|REDIS_URL|AMQP_URL|SECRET_KEYS)=[^\s\x00]*"
    r"|rpr_[A-Za-z0-9_-]{20,}"
)
OWN_VARIABLES = ("DBT_ENV_SECRET_", "RUNPLANE_RUN_ID", "PROBE_")


def main() -> None:
    found: dict[str, list[str]] = {}
    tried: dict[str, str] = {}

    def scan(label: str, read: Callable[[], str]) -> None:
        try:
            text = read()
        except OSError as exc:
            tried[label] = exc.strerror or type(exc).__name__
            return
        tried[label] = "read"
        hits = PATTERN.findall(text)
        if hits:
            found[label] = hits

    def read_bytes(path: str) -> str:
        with open(path, "rb") as handle:
            return handle.read(4 * 1024 * 1024).decode("latin-1").replace("\x00", "\n")

    ancestors = []
    pid = os.getppid()
    while pid > 1:
        ancestors.append(pid)
        try:
            with open(f"/proc/{pid}/stat") as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    for pid in ancestors:
        try:
            with open(f"/proc/{pid}/status") as handle:  # world-readable: who the process runs as
                uid = next(line.split()[1] for line in handle if line.startswith("Uid:"))
            tried[f"ancestor {pid} uid"] = uid
        except OSError:
            pass
        for what in ("environ", "cmdline"):
            scan(f"ancestor {pid} {what}", partial(read_bytes, f"/proc/{pid}/{what}"))
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            tried[f"ancestor {pid} fds"] = f"listed {len(fds)}"
        except OSError as exc:
            tried[f"ancestor {pid} fds"] = exc.strerror or "error"
            fds = []
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            if os.path.isfile(path):
                scan(f"ancestor {pid} fd {fd}", partial(read_bytes, path))
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in ancestors and int(name) != os.getpid():
            scan(f"process {name} environ", partial(read_bytes, f"/proc/{name}/environ"))
    for root, _dirs, files in os.walk("."):
        for file in files:
            path = os.path.join(root, file)
            scan(f"work dir {path}", partial(read_bytes, path))
    own = "\n".join(f"{k}={v}" for k, v in os.environ.items() if not k.startswith(OWN_VARIABLES))
    scan("own environment", lambda: own)
    stdin_fd = "/proc/self/fd/0"
    scan("own stdin", lambda: read_bytes(stdin_fd) if os.path.isfile(stdin_fd) else "")

    connected = []
    for hits in found.values():
        for hit in hits:
            url = hit.split("=", 1)[-1]
            if "://" not in url:
                continue
            parts = urlsplit(url)
            try:
                with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5432), timeout=2):
                    connected.append(url)
            except OSError:
                continue
    readable = sum(1 for v in tried.values() if v == "read")
    report = {"found": found, "connected": connected, "tried": tried, "readable": readable, "uid": os.getuid()}
    print("PROBE " + json.dumps(report))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
