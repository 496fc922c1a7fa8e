"""``runplane up``: the whole system on one machine, one OS process per service.

A service that exits is restarted, loudly (its name, exit code and the wait are printed), after a
backoff that doubles from 1 s to 30 s and starts over once it has stayed up for a minute: one lost
leader lock or one crash never ends the others' runs. Only Ctrl-C or SIGTERM stops everything:
SIGTERM first, SIGKILL after the drain bound, and the same for anything they started (local
runners), so no process is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import psutil
from pydantic import SecretStr

from runplane.adapters import local_fence
from runplane.basics.backoff import ceiling
from runplane.basics.settings import Settings
from runplane.commands.preflight import port_in_use


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    descendants: set[int] = field(default_factory=set)
    restarts: int = 0
    started_at: float = 0.0
    restart_at: float | None = None  # when a child that exited is started again

    def start(self) -> None:
        # Own process group: a terminal's Ctrl-C reaches only `up`, which stops the rest in order.
        self.process = subprocess.Popen(self.argv, env=self.env, start_new_session=True)
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


def taken_ports(ports: list[tuple[str, int, str]]) -> list[str]:
    """What is wrong with each port another program (another runplane, say) already listens on."""
    return [
        f"port {port} on {host} is taken by another program: set {setting} to a free one"
        for host, port, setting in ports
        if port_in_use(host, port)
    ]


def metrics_ports(children: list[Child]) -> dict[str, str]:
    return {c.name: c.env["RUNPLANE_METRICS_PORT"] for c in children if "RUNPLANE_METRICS_PORT" in c.env}


def _remember_descendants(children: list[Child]) -> None:
    for child in children:
        if child.process is None or child.process.poll() is not None:
            continue
        with contextlib.suppress(psutil.NoSuchProcess):
            child.descendants |= {p.pid for p in psutil.Process(child.process.pid).children(recursive=True)}


def stop_all(children: list[Child], drain_seconds: float) -> None:
    """SIGTERM every child, wait up to the drain bound, then SIGKILL what is left (with descendants)."""
    _remember_descendants(children)
    for child in children:
        if child.process and child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + drain_seconds
    for child in children:
        if child.process is None:
            continue
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
    leftovers = []
    for pid in set().union(*(c.descendants for c in children)):
        try:
            proc = psutil.Process(pid)
            proc.terminate()
            leftovers.append(proc)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(leftovers, timeout=5)
    for proc in alive:
        proc.kill()


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
    taken = taken_ports(ports_to_bind(settings, planned))
    if taken:
        for problem in taken:
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
    children = plan(settings, queuer_workers=queuer_workers, dispatchers=dispatchers, launcher=launcher)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for child in children:
        child.start()
        print(f"started {child.name} (pid {child.process.pid if child.process else '?'})", flush=True)
    print(f"runplane is up: gRPC API on {settings.api.host}:{settings.api.port}", flush=True)
    if settings.api.rest_port >= 0:
        scheme = "https" if settings.api.tls_certfile else "http"
        rest = f"{scheme}://{settings.api.host}:{settings.api.rest_port}"
        print(f"  REST API (dbt Cloud v2): {rest}/api/v2/accounts/ (Authorization: Token <token>)", flush=True)
        print(f"  pages: {rest}/ui/ (sign in with a token)", flush=True)
    for port_line in (f"  metrics of {n}: http://127.0.0.1:{p}/metrics" for n, p in metrics_ports(children).items()):
        print(port_line, flush=True)
    for line in banner:
        print(line, flush=True)
    if (launcher or settings.dispatcher.launcher) == "local":
        for problem in local_fence.problems(settings):  # last, so it is what the terminal shows
            print(f"runplane: WARNING: {problem}", file=sys.stderr, flush=True)
    exit_code = 0
    try:
        while not stopping:
            _remember_descendants(children)
            _restart_exited(children)
            time.sleep(0.2)
    finally:
        print("stopping runplane ...", flush=True)
        stop_all(children, settings.drain_seconds + 5)
        if warehouse is not None:
            warehouse.stop()
        print("stopped", flush=True)
    return exit_code
