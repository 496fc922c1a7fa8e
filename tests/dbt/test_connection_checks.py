"""An environment's "test connection" with real dbt against the local Postgres, and a project's with
real git: ok when the warehouse (the repository) accepts, else the adapter's (git's, the rule's) words."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import http.server
import os
import secrets
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import psycopg
import pytest

from runner import sandbox
from runner.checkout import CheckoutError, Repository, RepositoryCache
from runner.connection_checks import ConnectionResult, check_warehouse
from runner.steps import Limits, StepControl
from runplane.adapters import run_scratch
from runplane.basics.repository_urls import RepositoryRule
from runplane.basics.settings import RepositorySettings
from runplane.basics.types import JobType, Trigger
from runplane.dbt.context import DbtContext
from tests.conftest import ADMIN_URL
from tests.dbt.conftest import make_repository

pytestmark = [pytest.mark.slow, pytest.mark.dbt, pytest.mark.timeout(180)]


@pytest.fixture
def roles() -> Iterator[tuple[str, str]]:
    """Two roles of the test's own: one that may log in, one that may not; dropped afterwards."""
    suffix = secrets.token_hex(4)
    allowed, refused = f"conn_ok_{suffix}", f"conn_refused_{suffix}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {allowed} LOGIN PASSWORD 'right-password'")
        conn.execute(f"CREATE ROLE {refused} NOLOGIN PASSWORD 'right-password'")
    try:
        yield allowed, refused
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {allowed}")
            conn.execute(f"DROP ROLE IF EXISTS {refused}")


def _context(user: str, password: str, dbname: str = "postgres") -> DbtContext:
    return DbtContext(
        run_id=1, job_id=1, account_id=1, project_id=1, environment_id=1, environment_type="deployment",
        job_type=JobType.DEPLOY, trigger=Trigger.API, cause="", repository_url="", subdirectory="",
        git_credential_kind="none", git_credential="", git_sha="", git_branch="", dbt_version="1.10",
        adapter_type="postgres", connection={"host": "127.0.0.1", "port": "5432", "user": user, "dbname": dbname},
        connection_secrets={"password": password}, target_name="prod", schema="analytics", threads=1,
        variables={}, pull_request_number=None,
    )  # fmt: skip


def _check(context: DbtContext, dbt_bin: Path, directory: Path, confinement: tuple[str, ...] = ()) -> ConnectionResult:
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    limits = Limits(deadline=None, memory_bytes=None, cancel_grace=5.0, confinement=confinement)
    return asyncio.run(
        check_warehouse(
            context, dbt_bin=dbt_bin, directory=directory, base_env=base, control=StepControl(), limits=limits
        )
    )


def test_an_environment_whose_warehouse_accepts_it_connects(
    roles: tuple[str, str], dbt_bin: Path, tmp_path: Path
) -> None:
    allowed, _ = roles
    result = _check(_context(allowed, "right-password"), dbt_bin, tmp_path / "check")
    assert result.ok, result.message
    assert result.message == ""


def test_a_warehouse_that_refuses_the_login_answers_with_the_adapters_error_line(
    roles: tuple[str, str], dbt_bin: Path, tmp_path: Path
) -> None:
    _, refused = roles
    result = _check(_context(refused, "right-password"), dbt_bin, tmp_path / "check")
    assert not result.ok
    assert result.message.startswith("Database Error: connection to server at"), result.message
    assert f'role "{refused}" is not permitted to log in' in result.message
    assert "right-password" not in result.message


def test_a_database_that_does_not_exist_is_the_adapters_error_line(
    roles: tuple[str, str], dbt_bin: Path, tmp_path: Path
) -> None:
    allowed, _ = roles
    missing = f"missing_{secrets.token_hex(4)}"
    result = _check(_context(allowed, "right-password", dbname=missing), dbt_bin, tmp_path / "check")
    assert not result.ok
    assert f'database "{missing}" does not exist' in result.message, result.message


def test_a_repository_the_rule_allows_is_reached(tmp_path: Path) -> None:
    repo = make_repository(tmp_path / "repo")
    cache = RepositoryCache(tmp_path / "cache", RepositoryRule(RepositorySettings(local_roots=[str(tmp_path)])))
    line = asyncio.run(cache.reach(Repository(f"file://{repo}")))
    assert line == "ref: refs/heads/main\tHEAD"
    assert not (tmp_path / "cache").exists()  # nothing is cloned, no mirror made


def test_a_repository_the_rule_forbids_or_git_cannot_reach_says_why(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    elsewhere = make_repository(tmp_path / "elsewhere")
    cache = RepositoryCache(tmp_path / "cache", RepositoryRule(RepositorySettings(local_roots=[str(allowed)])))
    with pytest.raises(CheckoutError, match=r"refused: .* is a local path outside the directories this host allows"):
        asyncio.run(cache.reach(Repository(f"file://{elsewhere}")))
    with socket.socket() as listener:  # a port on the host's loopback: never reached
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        url = f"https://127.0.0.1:{listener.getsockname()[1]}/b.git"
        with pytest.raises(CheckoutError, match=r"127\.0\.0\.1, which is not a public address"):
            asyncio.run(cache.reach(Repository(url, "token", "a-token")))
        with pytest.raises(BlockingIOError):
            listener.accept()
    with pytest.raises(CheckoutError, match=r"git ls-remote of file://.*/missing failed: .*does not appear"):
        asyncio.run(cache.reach(Repository(f"file://{allowed}/missing")))


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A git host that wants credentials: answers 403 and keeps the Authorization header it got."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization", ""))
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_repository_is_asked_with_the_projects_credential_on_a_network_the_operator_allows(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    serving = threading.Thread(target=server.serve_forever, name="git-host", daemon=True)
    serving.start()
    try:
        settings = RepositorySettings(plain_schemes=True, allowed_networks=["127.0.0.0/8"])
        cache = RepositoryCache(tmp_path / "cache", RepositoryRule(settings))
        url = f"http://127.0.0.1:{server.server_address[1]}/acme/analytics.git"
        with pytest.raises(
            CheckoutError, match=r"git ls-remote of http://127\.0\.0\.1:\d+/acme/analytics\.git failed"
        ) as refused:
            asyncio.run(cache.reach(Repository(url, "token", "tok-secret-123")))
        assert "tok-secret-123" not in str(refused.value)
    finally:
        server.shutdown()
        server.server_close()
        serving.join()
    expected = "Basic " + base64.b64encode(b"x-access-token:tok-secret-123").decode()
    assert expected in _Recorder.seen, _Recorder.seen


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (make fence-packages)")
def test_the_check_runs_in_the_runs_fence_which_hides_the_control_planes_sockets(
    roles: tuple[str, str], dbt_bin: Path, kept_directory: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """An environment that names the host's Postgres socket reaches it from an unfenced process, and
    not from the check: it runs as a step, in the run's namespaces, where the socket's directory is empty."""
    allowed, _ = roles
    context = _context(allowed, "right-password")
    context = dataclasses.replace(context, connection={**context.connection, "host": "/run/postgresql"})
    unfenced = _check(context, dbt_bin, kept_directory / "unfenced")
    assert unfenced.ok, unfenced.message  # the socket is there, and takes the role

    scratch = tmp_path_factory.mktemp("scratch")
    run_scratch.make_directories(scratch, os.getuid())
    # The dbt install bound whole, as runner/fence.py binds it (its bin directory alone lacks its modules).
    fence = sandbox.confinement(scratch, ["/run/postgresql"], [str(dbt_bin.parent)])
    fenced = _check(context, dbt_bin, kept_directory / "fenced", fence)
    assert not fenced.ok
    assert 'connection to server on socket "/run/postgresql/.s.PGSQL.5432" failed' in fenced.message, fenced.message
