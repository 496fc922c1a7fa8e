"""Before running or testing: do Postgres, Redis and RabbitMQ answer? Start a stopped local one.

Each check speaks the real protocol (a Postgres login, a Redis PING, an AMQP handshake). When a
service on this machine does not answer and its server is installed, it is started with the
command its Debian package provides; otherwise the message says what is missing and how to get it.
"""

from __future__ import annotations

import asyncio
import errno
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from glob import glob
from urllib.parse import urlsplit

import psycopg

from runplane.adapters.db import redact
from runplane.basics.settings import Settings

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", ""}


def port_in_use(host: str, port: int) -> bool:
    """Whether another program listens on (or holds) ``host:port``, probed as servers bind
    (``SO_REUSEADDR``): connections of an earlier server waiting out TIME_WAIT leave it free."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            return True
    return False


@dataclass(frozen=True)
class Service:
    name: str
    url: str
    env: str
    check: Callable[[str], None]
    start: Callable[[int | None], list[str] | None]  # port -> the command that starts it here, or None
    install_hint: str


def _check_postgres(url: str) -> None:
    admin = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin, connect_timeout=3) as conn:
        conn.execute("SELECT 1")


def _check_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3)
    try:
        client.ping()
    finally:
        client.close()


def _check_amqp(url: str) -> None:
    import aio_pika

    async def probe() -> None:
        connection = await aio_pika.connect(url, timeout=5)
        await connection.close()

    asyncio.run(probe())


def _start_postgres(port: int | None) -> list[str] | None:
    if port not in (None, 5432):  # the cluster's configured port is the only one we can start
        return None
    versions = sorted(p.rsplit("/", 1)[-1] for p in glob("/etc/postgresql/*"))
    if shutil.which("pg_ctlcluster") and versions:
        return ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "start"]
    return None


def _start_redis(port: int | None) -> list[str] | None:
    if shutil.which("redis-server"):
        options = f"--daemonize yes --bind 127.0.0.1 --port {port or 6379} --appendonly no --save"
        return ["redis-server", *options.split(), ""]
    return None


def _start_rabbitmq(port: int | None) -> list[str] | None:
    if port not in (None, 5672):
        return None
    if shutil.which("rabbitmq-server"):
        return ["rabbitmq-server", "-detached"]
    return None


def services(settings: Settings) -> list[Service]:
    return [
        Service(
            "Postgres",
            settings.database_url,
            "RUNPLANE_DATABASE_URL",
            _check_postgres,
            _start_postgres,
            "install PostgreSQL 15+ (apt-get install postgresql) or point RUNPLANE_DATABASE_URL at a server",
        ),
        Service(
            "Redis",
            settings.redis_url,
            "RUNPLANE_REDIS_URL",
            _check_redis,
            _start_redis,
            "install Redis 6+ (apt-get install redis-server) or point RUNPLANE_REDIS_URL at a server",
        ),
        Service(
            "RabbitMQ",
            settings.amqp_url,
            "RUNPLANE_AMQP_URL",
            _check_amqp,
            _start_rabbitmq,
            "install RabbitMQ 3.12+ (apt-get install rabbitmq-server) or point RUNPLANE_AMQP_URL at a server",
        ),
    ]


def _answers(service: Service) -> str | None:
    """None when the service answers, else the error."""
    try:
        service.check(service.url)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def ensure_services(
    settings: Settings, *, start: bool = True, wait_seconds: float = 60.0, say: Callable[[str], None] = print
) -> list[str]:
    """Check every service, starting local stopped ones; returns the problems left (empty: all good)."""
    problems: list[str] = []
    for service in services(settings):
        error = _answers(service)
        if error is None:
            continue
        parts = urlsplit(service.url)
        host = parts.hostname or ""
        command = service.start(parts.port) if start and host in LOCAL_HOSTS else None
        if command is None:
            where = "cannot be started from here" if host in LOCAL_HOSTS else f"runs elsewhere ({host})"
            problems.append(
                f"{service.name} does not answer at {redact(service.url)} (set by {service.env}) and {where}: "
                f"{error}\n  how to get it: {service.install_hint}"
            )
            continue
        say(f"{service.name} is installed but not answering; starting it: {' '.join(command)}")
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        deadline = time.monotonic() + wait_seconds
        while (error := _answers(service)) is not None and time.monotonic() < deadline:
            time.sleep(0.5)
        if error is not None:
            problems.append(
                f"{service.name} was started with `{' '.join(command)}` but still does not answer at "
                f"{redact(service.url)} ({service.env}): {error}"
            )
    return problems
