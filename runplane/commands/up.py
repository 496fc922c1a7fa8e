"""``runplane up``: the whole system on one machine, one OS process per service.

A service that exits is restarted, loudly (its name, exit code and the wait are printed), after a
backoff that doubles from 1 s to 30 s and starts over once it has stayed up for a minute: one lost
leader lock or one crash never ends the others' runs. Only Ctrl-C or SIGTERM stops everything:
SIGTERM first, SIGKILL after the drain bound, and the same for anything they started (local
runners), so no process is left behind. "runplane is up" is printed once every service answers on
its ports; a service that exits before it does is reported as failing instead.

Only processes provably started here are signalled: each service and everything under it is held
by a pidfd from when it is first seen until it exits (``runplane.basics.held_processes``), never
remembered as a pid number, which the machine hands to other programs once its process is gone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from pydantic import SecretStr

from runplane.adapters import local_fence
from runplane.basics import held_processes
from runplane.basics.backoff import ceiling
from runplane.basics.settings import Settings
from runplane.commands.preflight import port_in_use


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    held: held_processes.HeldProcess | None = None  # the process, by a pidfd opened before it could be reaped
    restarts: int = 0
    started_at: float = 0.0
    restart_at: float | None = None  # when a child that exited is started again

    def start(self) -> None:
        # Own process group: a terminal's Ctrl-C reaches only `up`, which stops the rest in order.
        self.process = subprocess.Popen(self.argv, env=self.env, start_new_session=True)
        if self.held is not None:
            self.held.close()
        self.held = held_processes.hold(self.process.pid)
        self.started_at = time.monotonic()
        self.restart_at = None


RESTART_BACKOFF_FIRST = 1.0
RESTART_BACKOFF_CAP = 30.0
# A child that stayed up this long starts its backoff over when it exits.
RESTART_STABLE_AFTER = 60.0


def restart_delay(child: Child, now: float) -> float:
    """How long to wait before starting ``child`` again, counting this exit."""
    if now - child.started_at >= RESTART_STABLE_AFTER:
        child.restarts = 0
    child.restarts += 1
    return ceiling(RESTART_BACKOFF_FIRST, child.restarts, cap=RESTART_BACKOFF_CAP)


DEFAULT_METRICS_PORT = 9464  # the first service's; each next one takes the next port


def plan(settings: Settings, *, queuer_workers: int, dispatchers: int, launcher: str | None) -> list[Child]:
    """The processes ``up`` starts, each with its own metrics port (from RUNPLANE_METRICS_PORT, or 9464)."""
    base = os.environ.copy()
    keys = base.pop("RUNPLANE_SECRET_KEYS", "") or settings.secret_keys.get_secret_value()
    if launcher:
        base["RUNPLANE_DISPATCHER__LAUNCHER"] = launcher
    if settings.repositories.local_roots:  # the demo's repository added to the operator's
        base["RUNPLANE_REPOSITORIES__LOCAL_ROOTS"] = json.dumps(settings.repositories.local_roots)
    # Runners reach the runner API this `up` starts: one setting, the port, moves both ends.
    base.setdefault("RUNPLANE_RUNNER__API_ADDRESS", f"{settings.api.host}:{settings.api.runner_port}")
    exe = [sys.executable, "-m", "runplane"]
    names = ["api", "orchestrator"]
    names += [f"queuer-worker-{i + 1}" for i in range(queuer_workers)]
    names += ["scheduler"]
    names += [f"dispatcher-{i + 1}" for i in range(dispatchers)]
    children = []
    for index, name in enumerate(names):
        env = dict(base)
        env["RUNPLANE_METRICS_PORT"] = str((settings.metrics_port or DEFAULT_METRICS_PORT) + index)
        if name == "api" and keys:  # only the API encrypts and decrypts secrets
            env["RUNPLANE_SECRET_KEYS"] = keys
        command = name.rsplit("-", 1)[0] if name[-1].isdigit() else name
        children.append(Child(name, [*exe, command], env))
    return children


def ports_to_bind(settings: Settings, children: list[Child]) -> list[tuple[str, int, str]]:
    """(host, port, the setting that moves it) of every port the processes ``up`` starts listen on."""
    api = settings.api
    ports = [(api.host, api.port, "RUNPLANE_API__PORT"), (api.host, api.runner_port, "RUNPLANE_API__RUNNER_PORT")]
    if api.rest_port >= 0:
        ports.append((api.host, api.rest_port, "RUNPLANE_API__REST_PORT"))
    ports += [
        ("0.0.0.0", int(port), f"RUNPLANE_METRICS_PORT (the first of {len(children)} in a row)")
        for port in metrics_ports(children).values()
    ]
    return ports


PORTS = range(1, 65536)


def port_problems(settings: Settings, children: list[Child]) -> list[str]:
    """What is wrong with the ports ``up`` would start ``children`` on, each naming its setting (empty:
    nothing): a number that is not a port, two services on one port, a port among the metrics ports
    (one per service, in a row), then a port another program holds."""
    api = settings.api
    named = [("RUNPLANE_API__PORT", api.port), ("RUNPLANE_API__RUNNER_PORT", api.runner_port)]
    if api.rest_port >= 0:
        named.append(("RUNPLANE_API__REST_PORT", api.rest_port))
    first = settings.metrics_port or DEFAULT_METRICS_PORT
    metrics = range(first, first + len(children))
    problems = [f"{setting}={port} is not a port: ports are 1 to 65535" for setting, port in named if port not in PORTS]
    if metrics.start not in PORTS or metrics[-1] not in PORTS:
        problems.append(
            f"RUNPLANE_METRICS_PORT={first} gives the {len(children)} services the metrics ports {first} to "
            f"{metrics[-1]}: ports are 1 to 65535"
        )
    for index, (setting, port) in enumerate(named):
        problems += [
            f"{setting} and {other} are both {port}: each service needs a port of its own"
            for other, other_port in named[index + 1 :]
            if port == other_port
        ]
        if port in metrics:
            problems.append(
                f"{setting}={port} is one of the metrics ports {first} to {metrics[-1]} (RUNPLANE_METRICS_PORT "
                f"and the next {len(children) - 1}, one per service): move one of them"
            )
    return problems or taken_ports(ports_to_bind(settings, children))


def taken_ports(ports: list[tuple[str, int, str]]) -> list[str]:
    """What is wrong with each port another program (another runplane, say) already listens on."""
    return [
        f"port {port} on {host} is taken by another program: set {setting} to a free one"
        for host, port, setting in ports
        if port_in_use(host, port)
    ]


def metrics_ports(children: list[Child]) -> dict[str, str]:
    return {c.name: c.env["RUNPLANE_METRICS_PORT"] for c in children if "RUNPLANE_METRICS_PORT" in c.env}


def stop_all(children: list[Child], descendants: held_processes.Descendants, drain_seconds: float) -> None:
    """SIGTERM every service, SIGKILL what is left after the drain bound, then the same for what they
    started (local runners, their steps). Only held processes are signalled, and one that is gone
    already, or cannot be listed or signalled, never keeps the rest from being stopped."""
    services = [child.held for child in children if child.held is not None]
    try:
        descendants.follow(services)
    except OSError as exc:  # what was held before still is, and is stopped below
        print(f"runplane: could not look for new processes of the services: {exc}", file=sys.stderr, flush=True)
    try:
        held_processes.stop(services, drain_seconds)
    finally:
        for child in children:
            child.held = None
            if child.process is not None:
                child.process.poll()  # collected already: Popen forgets it
        descendants.stop(grace_seconds=5.0)


def _answers(host: str, port: int) -> bool:
    """Whether something accepts a connection on ``host:port`` (a wildcard address: this machine's)."""
    address = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def answering(settings: Settings, child: Child) -> bool:
    """Whether ``child`` runs and answers on each of its ports (the API's, and its metrics endpoint)."""
    if child.process is None or child.process.poll() is not None:
        return False
    ports = [("0.0.0.0", int(child.env["RUNPLANE_METRICS_PORT"]))]
    if child.name == "api":
        ports += [(host, port) for host, port, _ in ports_to_bind(settings, []) if port >= 0]
    return all(_answers(host, port) for host, port in ports) and child.process.poll() is None


def _restart_exited(children: list[Child]) -> None:
    """Schedule a restart of each child that exited; start those whose backoff is over."""
    now = time.monotonic()
    for child in children:
        if child.process is None or child.process.poll() is None:
            continue
        if child.restart_at is None:
            delay = restart_delay(child, now)
            child.restart_at = now + delay
            code = child.process.returncode
            print(f"runplane: {child.name} exited with code {code}; restarting in {delay:g} s", file=sys.stderr)
        elif now >= child.restart_at:
            child.start()
            pid = child.process.pid if child.process else "?"
            print(f"restarted {child.name} (pid {pid}, restart {child.restarts})", flush=True)


def up(settings: Settings, *, demo: bool, queuer_workers: int, dispatchers: int, launcher: str | None) -> int:
    from runplane.basics.secrets import box_from_settings, ensure_local_keys
    from runplane.commands.migrate import ensure_database, migrate

    planned = plan(settings, queuer_workers=queuer_workers, dispatchers=dispatchers, launcher=launcher)
    problems = port_problems(settings, planned)
    if problems:  # before anything starts
        for problem in problems:
            print(f"runplane: {problem}", file=sys.stderr, flush=True)
        print('runplane: README, "A second install on one machine", lists every setting to change', file=sys.stderr)
        return 1
    ensure_database(settings.database_url)
    # Every service that stores or reads a secret needs the same keys: one machine keeps them in a file.
    settings = settings.model_copy(update={"secret_keys": SecretStr(ensure_local_keys(settings))})
    migrate(settings.database_url, box_from_settings(settings))
    banner: list[str] = []
    warehouse = None
    if demo:
        from runplane.commands.demo import seed_demo, with_demo_repository

        settings = with_demo_repository(settings)
        banner, warehouse = seed_demo(settings)
    try:
        return _supervise(settings, banner, launcher=launcher, queuer_workers=queuer_workers, dispatchers=dispatchers)
    finally:
        if warehouse is not None:
            warehouse.stop()
        print("stopped", flush=True)


def _print_banner(settings: Settings, children: list[Child], banner: list[str], launcher: str | None) -> None:
    """Where everything answers: printed once every service does."""
    print(f"runplane is up: gRPC API on {settings.api.host}:{settings.api.port}", flush=True)
    if settings.api.rest_port >= 0:
        scheme = "https" if settings.api.tls_certfile else "http"
        rest = f"{scheme}://{settings.api.host}:{settings.api.rest_port}"
        print(f"  REST API (dbt Cloud v2): {rest}/api/v2/accounts/ (Authorization: Token <token>)", flush=True)
        print(f"  pages: {rest}/ui/ (sign in with a token)", flush=True)
    for name, port in metrics_ports(children).items():
        print(f"  metrics of {name}: http://127.0.0.1:{port}/metrics", flush=True)
    for line in banner:
        print(line, flush=True)
    if (launcher or settings.dispatcher.launcher) == "local":
        if settings.runner.local_uid >= 0 and os.geteuid() == 0:
            print(f"  runs: {local_fence.limits(settings)}", flush=True)
        for problem in local_fence.problems(settings):  # last, so it is what the terminal shows
            print(f"runplane: WARNING: {problem}", file=sys.stderr, flush=True)


def _supervise(
    settings: Settings, banner: list[str], *, launcher: str | None, queuer_workers: int, dispatchers: int
) -> int:
    """Start every service, keep them running until Ctrl-C or SIGTERM, then stop them and what they started."""
    children = plan(settings, queuer_workers=queuer_workers, dispatchers=dispatchers, launcher=launcher)
    descendants = held_processes.Descendants()
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for child in children:
            child.start()
            print(f"started {child.name} (pid {child.process.pid if child.process else '?'})", flush=True)
        up_now: set[str] = set()  # the services that answered since they last started
        failing: set[str] = set()
        told = False
        while not stopping:
            descendants.follow(child.held for child in children if child.held is not None)
            for child in children:
                if child.process is not None and child.process.poll() is not None:
                    up_now.discard(child.name)
                    if not told and child.name not in failing:
                        failing.add(child.name)
                        print(f"runplane: {child.name} is failing (not up): it exited before it answered; "
                              "its output is above", file=sys.stderr, flush=True)  # fmt: skip
                elif not told and child.name not in up_now and answering(settings, child):
                    up_now.add(child.name)
            _restart_exited(children)
            if not told and len(up_now) == len(children):
                _print_banner(settings, children, banner, launcher)
                told = True
            time.sleep(0.2)
    finally:
        print("stopping runplane ...", flush=True)
        stop_all(children, descendants, settings.drain_seconds + 5)
    return 0
