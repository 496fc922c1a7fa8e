"""Private Postgres, Redis and RabbitMQ servers for tests that stop, restart or freeze a server.

Each runs on free ports with its own data directory under a temporary directory, so the machine's
shared servers are never touched. Postgres refuses to run as root: as root, its commands run as the
``postgres`` user.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.support.polling import wait_for
from tests.support.ports import free_port, listening, listening_by
from tests.support.processes import OwnRedis

__all__ = ["OwnPostgres", "OwnRabbit", "OwnRedis", "free_port"]


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
    if found is None:
        raise AssertionError(f"{name} not found (install postgresql)")
    return str(found)


class OwnPostgres:
    """A throwaway Postgres cluster (initdb) on a free port, trust auth, no fsync."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data = base / "pgdata"
        self.port = free_port()
        self._as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def init(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        if self._as_postgres:
            shutil.chown(self.base, "postgres", "postgres")
            for parent in self.base.parents:  # the postgres user must reach its directory
                if parent == Path(tempfile.gettempdir()):
                    break
                parent.chmod(parent.stat().st_mode | 0o711)
        subprocess.run(
            [*self._as_postgres, _pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        self.start()

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self._as_postgres, _pg_bin("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args],
            check=True, capture_output=True, timeout=90,
        )  # fmt: skip

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base} -c fsync=off -c max_connections=200"
        self._ctl("-o", options, "-l", str(self.base / "postgres.log"), "start")
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-m", mode, "stop")

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


class OwnRabbit:
    """A private RabbitMQ node: its own node name, AMQP and distribution ports, data and log dirs, no
    plugins (so no management listener to collide with the shared node's)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"rpfault{self.port}@localhost"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _env(self) -> dict[str, str]:
        plugins = self.base / "enabled_plugins"
        if not plugins.exists():
            plugins.write_text("[].\n")
        return {
            **os.environ,
            "HOME": str(self.base),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.base / "log"),
            "RABBITMQ_PID_FILE": str(self.base / "rabbit.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_CONFIG_FILE": str(self.base / "rabbitmq"),  # none: defaults (guest from localhost)
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.base / "rabbitmq-env.conf"),
        }

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        server = "/usr/lib/rabbitmq/bin/rabbitmq-server"
        if not Path(server).exists():
            server = shutil.which("rabbitmq-server") or server
        with (self.base / "server.out").open("ab") as out:
            self.process = subprocess.Popen(
                [server], env=self._env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        process = self.process
        # Its own listener (the Erlang VM, a child), not another test's server that took the port.
        wait_for(
            lambda: listening_by(process.pid, self.port) or process.poll() is not None, 90, what="RabbitMQ to listen"
        )
        if process.poll() is not None:
            raise RuntimeError(f"RabbitMQ exited ({process.returncode}): see {self.base / 'server.out'}")

    def stop(self) -> None:
        """Stop the node (SIGTERM to its process group: the Erlang VM and its helpers)."""
        if self.process is None:
            return
        # Its group only while the leader is unreaped: once reaped, the pid may be another's.
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # not reaped yet: still its own group
            self.process.wait()
        self.process = None
        wait_for(lambda: not listening(self.port), 30, what="RabbitMQ to close its port")

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
