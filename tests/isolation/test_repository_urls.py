"""A project's repository URL cannot make the runner host read another account's repository, nor reach
the host's own network: refused at every door (gRPC, REST, the web form), refused again when a run
clones it, reported by ``runplane migrate``; and the host's repository cache gives no mirror's place away."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import psycopg
import pytest

from api.admin import create_account as create_account_with_token
from api.process import RunningApi
from api.web.session import COOKIE, csrf_for
from client.cli import channel
from runner.checkout import Repository, RepositoryCache
from runplane.basics.repository_urls import RepositoryRule, RepositoryUrlRefused
from runplane.basics.settings import RepositorySettings, Settings
from runplane.basics.types import RunStatus
from runplane.v1 import projects_pb2, projects_pb2_grpc
from tests.isolation.conftest import run_log, wait_until_ended
from tests.support.api import serving_api
from tests.support.processes import Services
from tests.support.records import Conn, create_account, create_dbt_environment, create_job, queue_run, rows

SECRET_LINE = "account B's warehouse password is hunter2-b"


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def make_repository(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "dbt_project.yml").write_text("name: analytics\nversion: '1.0'\nprofile: analytics\n")
    (path / "secret.txt").write_text(SECRET_LINE + "\n")
    git(path, "init", "--quiet", "--initial-branch=main")
    git(path, "add", "-A")
    git(path, "-c", "user.name=B", "-c", "user.email=b@example.invalid", "commit", "--quiet", "-m", "b's project")
    return path


@pytest.fixture
def foreign_repository() -> Iterator[Path]:
    """Account B's repository on the runner host: outside every allowed root, readable by root alone."""
    base = Path(tempfile.mkdtemp(prefix="runplane-account-b-"))
    try:
        repo = make_repository(base / "analytics")
        base.chmod(0o700)
        yield repo
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def loopback_listener() -> Iterator[socket.socket]:
    """A port on loopback that records whether anything connected to it."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    try:
        yield listener
    finally:
        listener.close()


def accepted_nothing(listener: socket.socket) -> bool:
    try:
        connection, _ = listener.accept()
    except BlockingIOError:
        return True
    connection.close()
    return False


def resolves_to_non_public(host: str) -> bool:
    infos = socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
    return all(not ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]).is_global for info in infos)


def forbidden_urls(foreign: Path, port: int) -> list[str]:
    """Repository URLs that would make the runner host read what the account may not, or reach its network."""
    host_name = socket.gethostname()
    assert resolves_to_non_public(host_name), f"{host_name} must resolve to a non-public address here"
    return [
        str(foreign),  # another account's local repository
        f"file://{foreign}",
        f"file://localhost{foreign}/",
        f"{foreign.parent}/../{foreign.parent.name}/analytics",
        f"{Path.home()}/analytics",  # root's home
        f"http://127.0.0.1:{port}/b.git",  # loopback ports, plain and encrypted
        f"https://127.0.0.1:{port}/b.git",
        "git://localhost/b.git",
        "ssh://git@[::1]/b.git",
        "git@localhost:acme/b.git",
        "https://[::ffff:127.0.0.1]/b.git",
        "https://169.254.169.254/latest/meta-data/",  # link-local: the cloud's metadata service
        "https://10.1.2.3/acme/b.git",  # a private address
        f"https://{host_name}/acme/b.git",  # a name that resolves to a non-public address
    ]


@pytest.fixture
def door_settings(settings: Settings) -> Settings:
    """The test's settings with git:// and http:// allowed, so that they meet the address rule too."""
    return settings.model_copy(
        update={"repositories": settings.repositories.model_copy(update={"plain_schemes": True})}
    )


@pytest.fixture
async def api(door_settings: Settings, _cleanup_bus: None) -> AsyncIterator[RunningApi]:
    async with serving_api(door_settings, rest=True, deliveries=False) as running:
        yield running


async def project_count(settings: Settings) -> int:
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM projects")
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_forbidden_repository_is_refused_at_every_door(
    api: RunningApi,
    door_settings: Settings,
    foreign_repository: Path,
    loopback_listener: socket.socket,
    tmp_path: Path,
) -> None:
    account_id, token = await create_account_with_token(door_settings, name="a", run_slots=1, memory_mb=512)
    port = loopback_listener.getsockname()[1]
    urls = forbidden_urls(foreign_repository, port)
    assert api.rest is not None
    async with channel(f"127.0.0.1:{api.port}", token) as chan:
        projects = projects_pb2_grpc.ProjectServiceStub(chan)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{api.rest.port}", headers={"Authorization": f"Token {token}"}
        ) as rest:
            allowed = make_repository(tmp_path / "own")  # under the test's allowed root
            kept = await projects.CreateProject(
                projects_pb2.CreateProjectRequest(name="own", repository_url=f"file://{allowed}")
            )
            for url in urls:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await projects.CreateProject(projects_pb2.CreateProjectRequest(name="b", repository_url=url))
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, url
                assert (refused.value.details() or "").startswith("repository_url: "), refused.value.details()
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await projects.UpdateProject(
                        projects_pb2.UpdateProjectRequest(project_id=kept.id, name="own", repository_url=url)
                    )
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, url

                body = {"name": "b", "repository": {"remote_url": url}}
                answer = await rest.post(f"/api/v3/accounts/{account_id}/projects/", json=body)
                assert answer.status_code == 400, (url, answer.text)
                assert "repository.remote_url" in answer.text, answer.text
                answer = await rest.post(f"/api/v3/accounts/{account_id}/projects/{kept.id}/", json=body)
                assert answer.status_code == 400, (url, answer.text)
        unchanged = await projects.GetProject(projects_pb2.GetProjectRequest(project_id=kept.id))
        assert unchanged.repository_url == f"file://{allowed}"

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api.rest.port}") as http:
        form = await http.get("/ui/login")
        csrf = form.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        logged_in = await http.post("/ui/login", data={"token": token, "next": "/ui/runs", "csrf_token": csrf})
        assert logged_in.status_code == 303, logged_in.text
        session_csrf = csrf_for(http.cookies.get(COOKIE) or "")
        for url in urls:
            fields = {"csrf_token": session_csrf, "name": "b", "repository_url": url, "git_credential_kind": "none"}
            answer = await http.post("/ui/projects/new", data=fields)
            assert answer.status_code == 400 and 'id="e-repository_url"' in answer.text, (url, answer.status_code)
            answer = await http.post(f"/ui/projects/{kept.id}/edit", data=fields)
            assert answer.status_code == 400 and 'id="e-repository_url"' in answer.text, (url, answer.status_code)
        accepted = await http.post(
            "/ui/projects/new",
            data={**fields, "name": "own-2", "repository_url": str(allowed)},
        )
        assert accepted.status_code == 303, re.findall(r"id=\"e-[^<]*<", accepted.text)

    assert await project_count(door_settings) == 2  # the two allowed ones; nothing refused was written
    assert accepted_nothing(loopback_listener)


def test_the_rule_takes_only_what_the_operator_allows(foreign_repository: Path, tmp_path: Path) -> None:
    strict = RepositoryRule(RepositorySettings())
    for url in [*forbidden_urls(foreign_repository, 8080), f"file://{tmp_path}", "ext::sh -c id", "-uevil"]:
        with pytest.raises(RepositoryUrlRefused):
            asyncio.run(strict.reachable(url))
    for url in ("https://github.com/acme/jaffle.git", "ssh://git@github.com/acme/jaffle.git", "git@github.com:a/b"):
        assert strict.check(url).url == url
    with pytest.raises(RepositoryUrlRefused, match="https://, ssh://"):
        strict.check("git://github.com/acme/jaffle.git")

    operator = RepositoryRule(
        RepositorySettings(plain_schemes=True, allowed_networks=["127.0.0.0/8"], local_roots=[str(tmp_path)])
    )
    assert operator.check("git://github.com/acme/jaffle.git").scheme == "git"
    assert operator.check("http://127.0.0.1:3000/acme/jaffle.git").port == 3000
    assert operator.check(f"file://{tmp_path}/repo").local
    with pytest.raises(RepositoryUrlRefused, match="outside the directories"):
        operator.check(f"file://{tmp_path}/../{foreign_repository.parent.name}")  # .. leaves the root
    link = tmp_path / "b"
    link.symlink_to(foreign_repository)
    with pytest.raises(RepositoryUrlRefused, match="outside the directories"):
        operator.check(str(link))  # so does a symbolic link
    with pytest.raises(RepositoryUrlRefused, match="not a public address"):
        operator.check("https://10.1.2.3/acme/b.git")


def test_a_mirror_is_not_found_from_an_account_id_and_url_and_a_clone_does_not_name_it(tmp_path: Path) -> None:
    repo = make_repository(tmp_path / "repo")
    rule = RepositoryRule(RepositorySettings(local_roots=[str(tmp_path)]))
    cache = RepositoryCache(tmp_path / "cache", rule)
    url = f"file://{repo}"
    dest = tmp_path / "run" / "repository"
    dest.parent.mkdir()
    checkout = asyncio.run(cache.clone_for_run(Repository(url), account_id=7, branch="", sha="", dest=dest, owner=None))
    assert checkout.cloned and checkout.branch == "main"
    mirror = cache.mirror_path(7, url)
    assert mirror.is_dir()
    assert hashlib.sha256(f"7\0{url}".encode()).hexdigest()[:24] not in mirror.name  # the old, derivable name
    another_host = RepositoryCache(tmp_path / "another-cache", rule)
    assert another_host.mirror_path(7, url).name != mirror.name  # a secret of the host's names it

    remotes = git(dest, "remote", "-v")
    assert str(tmp_path / "cache") not in remotes and url in remotes, remotes
    shown = subprocess.run(
        ["grep", "-r", str(tmp_path / "cache"), str(dest / ".git")], check=False, capture_output=True, text=True
    )
    assert shown.stdout == "", shown.stdout  # not in the config, the reflog or anywhere else in the clone


@pytest.mark.slow  # real services and a run: more than 20 s on a busy machine
def test_a_project_written_around_the_doors_fails_its_run_at_clone_time(
    db: Conn, system: Services, foreign_repository: Path, loopback_listener: socket.socket
) -> None:
    port = loopback_listener.getsockname()[1]
    account = create_account(db, name="a")
    cases: dict[int, str] = {}
    for url, reason in [
        (f"file://{foreign_repository}", "is a local path outside the directories this host allows"),
        (f"https://127.0.0.1:{port}/b.git", "127.0.0.1, which is not a public address"),
    ]:
        environment = create_dbt_environment(db, account, url, "warehouse", "1.10", port=15432)
        job = create_job(db, account, steps=["cat secret.txt"], name=f"job {len(cases)}")
        db.execute("UPDATE jobs SET environment_id = %s WHERE id = %s", (environment, job))
        cases[queue_run(db, job)] = reason
    system.start("scheduler")
    system.start("dispatcher")
    for run_id, reason in cases.items():
        run = wait_until_ended(db, run_id)
        assert run["status"] == RunStatus.ERROR, run
        message = str(run["status_message"])
        assert "refused" in message and reason in message, message
        assert SECRET_LINE not in run_log(db, run_id)
    assert accepted_nothing(loopback_listener)


def test_migrate_reports_stored_projects_the_rule_refuses(
    db: Conn, service_env: dict[str, str], foreign_repository: Path
) -> None:
    account = create_account(db, name="a")
    refused = create_dbt_environment(db, account, f"file://{foreign_repository}", "warehouse", "1.10")
    create_dbt_environment(db, account, "https://github.com/acme/jaffle.git", "warehouse", "1.10")
    (project_id,) = [r["project_id"] for r in rows(db, "SELECT project_id FROM environments WHERE id = %s", (refused,))]
    done = subprocess.run(
        [sys.executable, "-m", "runplane", "migrate"],
        check=False,
        env=service_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "repository_url refused" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"runplane: project {project_id} of account {account}: repository_url refused: ")
    assert "1 projects name a repository their runs will refuse to clone" in done.stderr


@pytest.mark.slow  # real services and a run: more than 20 s on a busy machine
def test_a_local_repository_only_root_may_read_is_not_cloned_even_under_an_allowed_root(
    db: Conn, system: Services, foreign_repository: Path
) -> None:
    # The operator allows the directory: the rule passes it, and the cache's git, not root, reads it.
    system.env["RUNPLANE_REPOSITORIES__LOCAL_ROOTS"] = json.dumps([str(foreign_repository.parent)])
    account = create_account(db, name="a")
    environment = create_dbt_environment(db, account, str(foreign_repository), "warehouse", "1.10", port=15432)
    job = create_job(db, account, steps=["cat secret.txt"])
    db.execute("UPDATE jobs SET environment_id = %s WHERE id = %s", (environment, job))
    run_id = queue_run(db, job)
    system.start("scheduler")
    system.start("dispatcher")
    run = wait_until_ended(db, run_id)
    assert SECRET_LINE not in run_log(db, run_id)
    assert run["status"] == RunStatus.ERROR, run
    message = str(run["status_message"])
    assert "git clone" in message and str(foreign_repository) in message, message
