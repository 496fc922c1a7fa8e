"""`runplane up`: every service as its own OS process; all stopped on SIGTERM with no orphans; a
service that dies is restarted with backoff, loudly, and the others keep running."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runplane.basics.settings import ApiSettings, Settings
from runplane.commands.up import plan, ports_to_bind, taken_ports
from tests.support.polling import wait_for
from tests.support.ports import free_ports, listening

pytestmark = pytest.mark.slow

EXPECTED = ["api", "orchestrator", "queuer-worker", "queuer-worker", "scheduler", "dispatcher", "dispatcher"]


def _services(up: psutil.Process) -> list[tuple[int, str]]:
    """(pid, service) of the live service processes of ``runplane up``; a killed one is a zombie until
    it is reaped, and is left out."""
    found = []
    for child in up.children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "runplane" in " ".join(cmdline := child.cmdline()):
                found.append((child.pid, cmdline[-1]))
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
    return found


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
    api_port, *metrics_ports = free_ports(len(EXPECTED) + 1)  # up gives service i the metrics port base + i
    env["RUNPLANE_API__PORT"] = str(api_port)
    env["RUNPLANE_METRICS_PORT"] = str(metrics_ports[0])
    env["RUNPLANE_DRAIN_SECONDS"] = "5"
    yield env


@contextlib.contextmanager
def _running_up(env: dict[str, str], output: Path) -> Iterator[tuple[subprocess.Popen[str], psutil.Process]]:
    """``runplane up --demo``, its output in a file (a pipe nobody reads until the end could fill and
    stop it); whatever happens, it and every process under it are gone afterwards."""
    with output.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "runplane", "up", "--demo"], env=env, stdout=sink,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    up = psutil.Process(proc.pid)
    try:
        yield proc, up
    finally:
        for child in up.children(recursive=True) if up.is_running() else []:
            child.kill()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _wait_for_every_service(proc: subprocess.Popen[str], up: psutil.Process, output: Path) -> None:
    wait_for(lambda: proc.poll() is not None or len(_services(up)) == len(EXPECTED), 60, what="every service process")
    assert proc.poll() is None, f"runplane up exited with {proc.returncode}:\n{output.read_text()[-5000:]}"


def _stop(proc: subprocess.Popen[str], output: Path) -> str:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    text = output.read_text()
    assert proc.returncode == 0, text[-5000:]
    assert "Traceback" not in text, text[-5000:]  # every service stops on its own terms, none dies
    return text


def test_up_starts_every_service_and_sigterm_stops_them_all(up_env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    with _running_up(up_env, log) as (proc, up):
        _wait_for_every_service(proc, up, log)
        commands = sorted(name for _, name in _services(up))
        assert commands == sorted(EXPECTED)
        wait_for(lambda: _serving(int(up_env["RUNPLANE_API__PORT"])), 60, what="the API to serve")
        pids = {p.pid for p in up.children(recursive=True)}
        base = int(up_env["RUNPLANE_METRICS_PORT"])
        metrics = range(base, base + len(EXPECTED))
        wait_for(lambda: all(listening(port) for port in metrics), 60, what="every service's metrics endpoint")
        wait_for(lambda: "runplane is up" in log.read_text(), 60, what="the banner, once everything answers")
        assert proc.poll() is None, log.read_text()[-5000:]
        output = _stop(proc, log)
        assert "demo token:" in output
        assert "stopped" in output
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert alive == [], f"orphans left: {alive}"


def _with_pid(pid: int, attempts: int = 200) -> subprocess.Popen[bytes]:
    """A process of this test, unrelated to runplane, that the kernel gave the number ``pid``: the next
    pid is set through ``ns_last_pid`` (root), and set again whenever another process on the machine
    took it first."""
    for _ in range(attempts):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        other = subprocess.Popen(["sleep", "600"])
        if other.pid == pid:
            return other
        other.kill()
        other.wait()
    raise AssertionError(f"pid {pid} was never free for this test's process in {attempts} attempts")


def _spare_runner(up: psutil.Process) -> psutil.Process | None:
    """A spare runner: a child of a dispatcher's fork server (two levels under a service of ``up``)."""
    for process in up.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            parent = process.parent()
            forked = parent is not None and "runner.fork_server" in " ".join(parent.cmdline())
            if forked and process.status() != psutil.STATUS_ZOMBIE:
                return process
    return None


def test_stopping_never_signals_a_program_that_got_the_pid_of_a_process_up_saw(
    up_env: dict[str, str], tmp_path: Path
) -> None:
    """A spare runner ``up`` has seen exits; a program of its own gets its pid; stopping ``up`` leaves
    that program running (``up`` signals through pidfds, never a remembered number)."""
    log = tmp_path / "up.log"
    other: subprocess.Popen[bytes] | None = None
    try:
        with _running_up(up_env, log) as (proc, up):
            _wait_for_every_service(proc, up, log)
            spare = wait_for(lambda: _spare_runner(up), 90, what="a spare runner of a fork server")
            assert spare is not None
            time.sleep(1.0)  # up's bookkeeping looks every 0.2 s: it has seen the spare
            pid = spare.pid
            spare.kill()
            wait_for(lambda: not psutil.pid_exists(pid), 30, what=f"the spare runner {pid} to be reaped")
            other = _with_pid(pid)
            output = _stop(proc, log)
            assert "stopped" in output
            assert other.poll() is None, f"runplane up signalled {pid}, which another program held:\n{output[-3000:]}"
    finally:
        if other is not None:
            other.kill()
            other.wait()


def test_a_service_that_dies_is_restarted_and_the_others_keep_running(up_env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    with _running_up(up_env, log) as (proc, up):
        _wait_for_every_service(proc, up, log)
        others = {pid for pid, name in _services(up) if name != "scheduler"}
        victim = next(pid for pid, name in _services(up) if name == "scheduler")
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: any(name == "scheduler" and pid != victim for pid, name in _services(up)),
            30,
            what="a new scheduler process",
        )
        assert proc.poll() is None
        assert others <= {pid for pid, _ in _services(up)}, "another service was stopped"
        output = _stop(proc, log)
        assert "scheduler exited with code -9; restarting in 1 s" in output
        assert "restarted scheduler" in output


def test_restart_backoff_doubles_to_a_bound_and_starts_over_after_a_stable_run() -> None:
    from runplane.commands.up import RESTART_BACKOFF_CAP, RESTART_STABLE_AFTER, Child, restart_delay

    child = Child("scheduler", [], {})
    delays = [restart_delay(child, now=1.0) for _ in range(8)]
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30] and max(delays) == RESTART_BACKOFF_CAP
    child.started_at = 100.0
    assert restart_delay(child, now=100.0 + RESTART_STABLE_AFTER) == 1


def test_a_taken_port_is_named_with_the_setting_that_moves_it() -> None:
    api_port, runner_port, rest_port, metrics_port, *_ = free_ports(8)  # 5 services: 5 metrics ports
    settings = Settings(
        api=ApiSettings(port=api_port, runner_port=runner_port, rest_port=rest_port), metrics_port=metrics_port
    )
    children = plan(settings, queuer_workers=1, dispatchers=1, launcher="noop")
    assert taken_ports(ports_to_bind(settings, children)) == []
    with socket.socket() as other:
        other.bind(("127.0.0.1", runner_port))
        other.listen()
        assert taken_ports(ports_to_bind(settings, children)) == [
            f"port {runner_port} on 127.0.0.1 is taken by another program: set RUNPLANE_API__RUNNER_PORT to a free one"
        ]


def test_runners_are_told_the_runner_port_up_starts_the_runner_api_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNPLANE_RUNNER__API_ADDRESS", raising=False)
    settings = Settings(api=ApiSettings(runner_port=61234))
    children = plan(settings, queuer_workers=1, dispatchers=1, launcher="noop")
    assert {c.env["RUNPLANE_RUNNER__API_ADDRESS"] for c in children} == {"127.0.0.1:61234"}


def _refused(env: dict[str, str], tmp_path: Path) -> str:
    """``runplane up --demo`` that must refuse to start: its output; it fails the test if it runs on,
    and whatever it started is gone afterwards."""
    log = tmp_path / "up.log"
    with _running_up(env, log) as (proc, _):
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"runplane up started:\n{log.read_text()[-3000:]}") from None
        output = log.read_text()
        assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "started" not in output and "is up" not in output, f"something was started:\n{output[-3000:]}"
    return output


def test_a_port_over_65535_is_refused_naming_its_setting(up_env: dict[str, str], tmp_path: Path) -> None:
    output = _refused(up_env | {"RUNPLANE_API__REST_PORT": "70000"}, tmp_path)
    assert "RUNPLANE_API__REST_PORT=70000 is not a port: ports are 1 to 65535" in output


def test_two_services_on_one_port_are_refused(up_env: dict[str, str], tmp_path: Path) -> None:
    port = up_env["RUNPLANE_API__PORT"]
    output = _refused(up_env | {"RUNPLANE_API__REST_PORT": port}, tmp_path)
    assert f"RUNPLANE_API__PORT and RUNPLANE_API__REST_PORT are both {port}" in output


def test_a_port_among_the_metrics_ports_is_refused(up_env: dict[str, str], tmp_path: Path) -> None:
    inside = int(up_env["RUNPLANE_METRICS_PORT"]) + 2  # the third service's
    output = _refused(up_env | {"RUNPLANE_API__REST_PORT": str(inside)}, tmp_path)
    assert f"RUNPLANE_API__REST_PORT={inside} is one of the metrics ports" in output


def test_a_port_another_program_holds_is_refused(up_env: dict[str, str], tmp_path: Path) -> None:
    (rest_port,) = free_ports(1)
    with socket.socket() as other:
        other.bind(("127.0.0.1", rest_port))
        other.listen()
        output = _refused(up_env | {"RUNPLANE_API__REST_PORT": str(rest_port)}, tmp_path)
    assert f"port {rest_port} on 127.0.0.1 is taken by another program: set RUNPLANE_API__REST_PORT" in output


def test_a_service_that_cannot_start_is_reported_failing_and_up_is_never_said(
    up_env: dict[str, str], tmp_path: Path
) -> None:
    """The API cannot start (its certificate does not exist): up says so, restarts it, and never says up."""
    missing = tmp_path / "no-such-cert.pem"
    env = up_env | {"RUNPLANE_API__TLS_CERTFILE": str(missing), "RUNPLANE_API__TLS_KEYFILE": str(missing)}
    log = tmp_path / "up.log"
    with _running_up(env, log) as (proc, _):
        wait_for(lambda: "api exited with code" in log.read_text(), 90, what="the API to fail and be restarted")
        wait_for(lambda: "api is failing (not up)" in log.read_text(), 10, what="up to report the API failing")
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        output = log.read_text()
    assert "runplane is up" not in output, output[-3000:]
    assert "stopped" in output, output[-3000:]


def test_the_banner_waits_for_every_service_to_answer(up_env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    with _running_up(up_env, log) as (proc, _):
        wait_for(lambda: proc.poll() is not None or "runplane is up" in log.read_text(), 90, what="the banner")
        assert proc.poll() is None, log.read_text()[-3000:]
        assert _serving(int(up_env["RUNPLANE_API__PORT"])) or listening(int(up_env["RUNPLANE_API__PORT"]))
        base = int(up_env["RUNPLANE_METRICS_PORT"])
        assert all(listening(port) for port in range(base, base + len(EXPECTED))), log.read_text()[-3000:]
        _stop(proc, log)
