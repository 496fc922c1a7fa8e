"""The demo's warehouse: a Postgres cluster of its own, beside the control plane's, with a password.

On one machine the control plane's Postgres trusts its local clients (``make run``'s default), so a
run that may reach it is a superuser of every account's data; the fence (``runner.fence``) refuses a
warehouse that is a control-plane server. The demo therefore keeps its warehouse in a cluster of
its own (``initdb`` into ``<state>/demo-warehouse``, listening on 127.0.0.1 only, password
authentication over TCP, its Unix socket in its own directory), started by ``runplane up --demo``
and stopped with it. Its port is the install's own when free, else the next free one: the demo
environment's profile is set again at every start, so it follows the cluster. The password is made
once and kept beside the cluster (0600); the demo environment holds it as an encrypted secret field,
as any customer's warehouse password.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg

from runplane.basics.settings import Settings
from runplane.commands.preflight import port_in_use

USER = "warehouse"
DATABASE = "warehouse"
STATE = Path("/var/lib/runplane") if os.geteuid() == 0 else Path.home() / ".local" / "state" / "runplane"
BASE_PORT = 25432
PORTS = 1000  # an install's preferred port is one of BASE_PORT .. BASE_PORT + PORTS - 1
TRIES = 20  # ports tried from the preferred one on, when another program holds it


def pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
    if found is None:
        raise FileNotFoundError(f"{name} not found: install Postgres's server package (postgresql)")
    return str(found)


@dataclass(frozen=True)
class DemoWarehouse:
    directory: Path
    port: int

    @classmethod
    def for_install(cls, settings: Settings, state: Path = STATE) -> DemoWarehouse:
        """One per install (its database URL), with a port of its own."""
        digest = hashlib.sha256(settings.database_url.encode()).hexdigest()
        return cls(state / f"demo-warehouse-{digest[:10]}", BASE_PORT + int(digest[:6], 16) % PORTS)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def password_file(self) -> Path:
        return self.directory / "password"

    def _as_owner(self) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as_owner(), *args], check=True, capture_output=True, timeout=120)

    def start(self) -> tuple[dict[str, str], str]:
        """Make the cluster once, start it (unless it runs), and give the profile fields and password."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.directory, owner.pw_uid, owner.pw_gid)
        if not self.password_file.exists():
            self.password_file.write_text(secrets.token_urlsafe(24))
            self.password_file.chmod(0o600)
        password = self.password_file.read_text().strip()
        if not (self.data / "PG_VERSION").exists():
            self._run(pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth-local=trust",
                      "--auth-host=scram-sha-256", "-N")  # fmt: skip
        running = subprocess.run([*self._as_owner(), pg_bin("pg_ctl"), "-D", str(self.data), "status"],
                                 capture_output=True, check=False)  # fmt: skip
        port = self._running_port() if running.returncode == 0 else self._start(password)
        self._ensure_role(password, port)
        return {"host": "127.0.0.1", "port": str(port), "user": USER, "dbname": DATABASE}, password

    def _running_port(self) -> int:
        """The port of the running cluster (the fourth line of its postmaster.pid)."""
        return int((self.data / "postmaster.pid").read_text().splitlines()[3])

    def _start(self, password: str) -> int:
        """Start the cluster on the install's port, or the next free one; the port it listens on.
        ``password`` is masked in what a failed start shows: the log keeps the statement of a
        failed ``ALTER ROLE`` of an earlier start."""
        log = self.directory / "postgres.log"
        tried = []
        for port in range(self.port, self.port + TRIES):
            if port_in_use("127.0.0.1", port):
                tried.append(port)
                continue
            options = f"-p {port} -c listen_addresses=127.0.0.1 -k {self.directory}"
            started = subprocess.run(
                [*self._as_owner(), pg_bin("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-o", options,
                 "-l", str(log), "start"],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            if started.returncode == 0:
                return port
            if not port_in_use("127.0.0.1", port):  # no race for the port: the cluster would not start
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(
                    f"the demo warehouse (Postgres in {self.data}) did not start on port {port}:\n"
                    f"{started.stdout}{started.stderr}{tail}".replace(password, "****")
                )
            tried.append(port)
        raise RuntimeError(f"the demo warehouse found no free port: {tried} are taken by other programs")

    def _ensure_role(self, password: str, port: int) -> None:
        """The warehouse's own role and database (over the cluster's Unix socket, as its superuser)."""
        with psycopg.connect(host=str(self.directory), port=port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:  # fmt: skip
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (USER,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(psycopg.sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(
                psycopg.sql.Identifier(USER), psycopg.sql.Literal(password)))  # fmt: skip
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    psycopg.sql.Identifier(DATABASE), psycopg.sql.Identifier(USER)))  # fmt: skip

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-m", "fast", "stop")
