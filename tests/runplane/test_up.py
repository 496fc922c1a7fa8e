"""`runplane up`: every service as its own OS process; all stopped on SIGTERM with no orphans; a
service that dies stops everything instead of being restarted silently."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

pytestmark = pytest.mark.slow

EXPECTED = ["api", "orchestrator", "queuer-worker", "queuer-worker", "scheduler", "dispatcher", "dispatcher"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _service_children(up: psutil.Process) -> list[psutil.Process]:
    return [p for p in up.children() if "runplane" in " ".join(p.cmdline())]


def _wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _serving(port: int) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture
def up_env(service_env: dict[str, str]) -> Iterator[dict[str, str]]:
    env = dict(service_env)
    env["RUNPLANE_API__PORT"] = str(_free_port())
    env["RUNPLANE_METRICS_PORT"] = str(_free_port())
    env["RUNPLANE_DRAIN_SECONDS"] = "5"
    yield env


def _start(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runplane", "up", "--demo"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_up_starts_every_service_and_sigterm_stops_them_all(up_env: dict[str, str]) -> None:
    proc = _start(up_env)
    up = psutil.Process(proc.pid)
    try:
        _wait_for(lambda: len(_service_children(up)) == len(EXPECTED), 60, "every service process")
        commands = sorted(c.cmdline()[-1] for c in _service_children(up))
        assert commands == sorted(EXPECTED)
        _wait_for(lambda: _serving(int(up_env["RUNPLANE_API__PORT"])), 60, "the API to serve")
        pids = {p.pid for p in up.children(recursive=True)}
        time.sleep(2)  # let the services settle so a crash on start would show
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, output
        assert "demo token:" in output
        assert "stopped" in output
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert alive == [], f"orphans left: {alive}"
    finally:
        for child in up.children(recursive=True) if up.is_running() else []:
            child.kill()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_service_that_dies_stops_everything(up_env: dict[str, str]) -> None:
    proc = _start(up_env)
    up = psutil.Process(proc.pid)
    try:
        _wait_for(lambda: len(_service_children(up)) == len(EXPECTED), 60, "every service process")
        pids = {p.pid for p in up.children(recursive=True)}
        victim = next(p for p in _service_children(up) if p.cmdline()[-1] == "scheduler")
        os.kill(victim.pid, signal.SIGKILL)
        output = proc.communicate(timeout=60)[0]
        assert proc.returncode == 1
        assert "scheduler exited with code -9; stopping everything" in output
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert alive == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
