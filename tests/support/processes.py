"""Real service processes for multi-process tests: started, signalled, and always cleaned up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg

from runplane.bus import AmqpBus, Topology
from runplane.v1 import bus_pb2


class Services:
    """Starts ``python -m runplane <command>`` processes; ``stop_all`` ends them and every runner they started."""

    def __init__(self, env: dict[str, str], log_dir: Path, database_url: str) -> None:
        self.env = dict(env)
        self.log_dir = log_dir
        self.database_url = database_url
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._extra_pids: set[int] = set()

    def start(self, command: str, name: str | None = None, **env: str) -> subprocess.Popen[bytes]:
        name = name or f"{command}-{len(self.processes) + 1}"
        log = (self.log_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "runplane", command],
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        self.processes.append((name, process))
        return process

    def log_text(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def forget_pid_later(self, pid: int) -> None:
        """Also kill this process (and its group) at the end: e.g. a step orphaned by a killed runner."""
        self._extra_pids.add(pid)

    def stop_all(self) -> None:
        pids = set(self._extra_pids)
        for _, process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                pids |= {p.pid for p in psutil.Process(process.pid).children(recursive=True)}
        pids |= runner_pids(self.database_url)
        for _, process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
                process.terminate()
        for _, process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in pids:
            kill_group(pid)


def runner_pids(database_url: str) -> set[int]:
    """Runner processes the local launcher recorded (``pod_name`` ``pid:N``)."""
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            found = conn.execute("SELECT pod_name FROM runs WHERE pod_name LIKE 'pid:%'").fetchall()
    except psycopg.OperationalError:
        return set()
    return {int(str(row[0]).removeprefix("pid:")) for row in found}


def kill_group(pid: int) -> None:
    """SIGKILL a process, and its process group when it leads one (runners and steps do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


def publish_pickup(amqp_url: str, prefix: str, account_id: int) -> None:
    async def publish() -> None:
        bus = await AmqpBus.connect(amqp_url)
        try:
            await bus.publish(Topology(prefix).pickup, bus_pb2.Pickup(account_id=account_id))
        finally:
            await bus.close()

    asyncio.run(publish())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OwnRedis:
    """A throwaway redis-server on a free port, for tests that stop Redis (the shared one stays up)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None
