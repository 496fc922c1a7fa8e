"""Real service processes for multi-process tests: started, signalled, and always cleaned up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import psycopg

from runplane.adapters.bus import AmqpBus, Topology
from runplane.v1 import bus_pb2
from tests.support.polling import wait_for
from tests.support.ports import free_port, listening, listening_by


class Services:
    """Starts ``python -m runplane <command>`` processes; ``stop_all`` ends them and every runner they started.

    Runners reach the control plane only through the runner API, so the first dispatcher brings an
    ``api`` process along unless ``with_api`` is off (a test that serves the API itself).
    """

    def __init__(self, env: dict[str, str], log_dir: Path, database_url: str) -> None:
        self.with_api = True
        self.env = dict(env)
        self.log_dir = log_dir
        self.database_url = database_url
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._extra_pids: dict[int, float] = {}  # pid → its process's start time

    def start(self, command: str, name: str | None = None, **env: str) -> subprocess.Popen[bytes]:
        if command == "dispatcher" and self.with_api and not any(n.startswith("api") for n, _ in self.processes):
            self.start("api", name="api")
            wait_for_port(self.env["RUNPLANE_RUNNER__API_ADDRESS"])
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
        """Also kill this process (and its group) at the end: e.g. a step orphaned by a killed runner.

        Only while it is the same process: pids are reused (a machine's ``pid_max`` may be 32768),
        and a kill must never reach a process another test or program started under that pid.
        """
        with contextlib.suppress(psutil.NoSuchProcess):
            self._extra_pids[pid] = psutil.Process(pid).create_time()

    def stop_all(self) -> None:
        # Every pid with its process's start time, killed at the end only if it still is that process.
        pids = dict(self._extra_pids)
        for _, process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(process.pid).children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        pids[child.pid] = child.create_time()
        for pid in runner_pids(self.database_url, self.env.get("RUNPLANE_RUNNER__API_ADDRESS", "")):
            if (started := started_at(pid)) is not None:
                pids[pid] = started
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
        for pid, started in pids.items():
            if started_at(pid) == started:
                kill_group(pid)


def runner_pids(database_url: str, runner_api_address: str) -> set[int]:
    """Live runner processes the local launcher recorded (``pod_name`` ``pid:N``) for this system.

    A recorded pid may since belong to anything (a runner that ended long ago, its pid reused): only
    a process whose environment names this system's runner API is one of its runners.
    """
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            found = conn.execute("SELECT pod_name FROM runs WHERE pod_name LIKE 'pid:%'").fetchall()
    except psycopg.OperationalError:
        return set()
    pids = {int(str(row[0]).removeprefix("pid:")) for row in found}
    return {pid for pid in pids if runner_api_address and _runner_api_of(pid) == runner_api_address}


def _runner_api_of(pid: int) -> str | None:
    try:
        return psutil.Process(pid).environ().get("RUNPLANE_RUNNER__API_ADDRESS")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def started_at(pid: int) -> float | None:
    """When the process now holding ``pid`` started (None: no such process)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


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


def wait_for_port(address: str, timeout: float = 30.0) -> None:
    """Until something listens on ``host:port``."""
    host, port = address.rsplit(":", 1)
    wait_for(lambda: listening(int(port), host), timeout, what=f"something to listen on {address}")


class OwnRedis:
    """A throwaway redis-server on a free port, for tests that stop Redis (the shared one stays up)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it on its port; a port another process took meanwhile is an error, not a shared Redis."""
        process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.process = process
        wait_for(
            lambda: listening_by(process.pid, self.port) or process.poll() is not None,
            10,
            what="redis-server to listen",
        )
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited ({process.returncode}): port {self.port} taken by another process")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None


async def finish(proc: asyncio.subprocess.Process, timeout: float = 60) -> tuple[int, str, str]:
    """Wait up to ``timeout`` s for ``proc`` (killed after that): its exit code, stdout and stderr."""
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
