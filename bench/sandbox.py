"""What every benchmark run gets of its own: a temporary database, unique names, child processes
that are always stopped, and bounded waits."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import redis
from psycopg import sql

from runplane.basics.settings import Settings
from runplane.commands.migrate import migrate

REPO_ROOT = Path(__file__).resolve().parent.parent


def unique_name(prefix: str) -> str:
    """A name no other run (or test, or checkout) uses: for databases, queues and Redis keys."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def admin_url(base_url: str) -> str:
    return psycopg.conninfo.make_conninfo(base_url, dbname="postgres")


@contextlib.contextmanager
def temporary_database(migrated: bool = True) -> Iterator[str]:
    """A fresh database (migrated with runplane's migrations) that is dropped afterwards."""
    base = Settings().database_url
    name = unique_name("rp_bench_")
    with psycopg.connect(admin_url(base), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(base, dbname=name)
    try:
        if migrated:
            migrate(url)
        yield url
    finally:
        with psycopg.connect(admin_url(base), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; True when it held."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: this one's, with the repository importable."""
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def start(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``python args...`` in its own process group, output to ``log_path``."""
    log = log_path.open("ab")
    try:
        return subprocess.Popen(
            [sys.executable, *args],
            env=env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group, so its children are stopped with it
        )
    finally:
        log.close()  # the child holds its own copy


def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> int | None:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds; returns the exit code."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    # Children left behind by the leader (a prefork pool) go too.
    _signal_group(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    return proc.returncode


def kill_hard(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 the process group: a crash, not a shutdown."""
    _signal_group(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def log_tail(path: Path, lines: int = 15) -> str:
    """The end of a child's log, to explain a failure."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def delete_prefixed_keys(prefix: str) -> None:
    """Delete a run's Redis keys (every service names its keys ``<prefix>:...``)."""
    client = redis.Redis.from_url(Settings().redis_url)
    try:
        keys = list(client.scan_iter(f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
