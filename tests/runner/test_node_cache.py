"""The node's cache keeper with the real runner API: entries by the account of the caller's run token.

Runs are claimed through the runner API on the real Postgres; the keeper (``runplane node-cache``'s
``NodeCacheKeeper``) serves a socket in the test's directory and learns each caller's account from
the runner API, so what one account stored is restored to its next run, never to another account's,
and a token that is not a running run's gets nothing.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import stat
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.cache_keeper import CacheError, InProcessCache
from runner.control_plane import RunnerApi
from runner.node_cache import NodeCacheClient, NodeCacheKeeper
from runner.package_cache import package_key
from runplane.basics.settings import Settings
from runplane.basics.types import Outcome, RunStatus
from tests.support.polling import eventually
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run

pytestmark = pytest.mark.usefixtures("_cleanup_bus", "runner_api")

PACKAGES = "packages:\n  - package: dbt-labs/dbt_utils\n    version: 1.3.0\n"


@dataclass
class Node:
    socket: Path
    root: Path


@dataclass
class Run:
    api: RunnerApi
    token: str
    account_id: int


@pytest.fixture
async def node(tmp_path: Path, settings: Settings) -> AsyncIterator[Node]:
    """A keeper serving ``tmp_path/sock/cache.sock``, its entries under ``tmp_path/node``."""
    found = Node(tmp_path / "sock" / "cache.sock", tmp_path / "node")
    keeper = NodeCacheKeeper(found.socket, found.root, settings.runner.api_address)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.serve(stop), name="node-cache")
    try:
        await eventually(lambda: task.done() or found.socket.exists(), 10, what="the keeper's socket")
        assert not task.done(), task.exception()
        yield found
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert not found.socket.exists()


@pytest.fixture
async def runs(settings: Settings) -> AsyncIterator[list[Run]]:
    """Runs this test claims (closed after it)."""
    made: list[Run] = []
    yield made
    for run in made:
        await run.api.close()


async def claimed(db: Conn, settings: Settings, runs: list[Run], account_id: int) -> Run:
    """A run of ``account_id`` claimed through the runner API, as a runner does."""
    run_id = queue_run(db, create_job(db, account_id))
    token = make_starting(db, run_id)
    run = Run(RunnerApi(settings.runner.api_address, token, run_id), token, account_id)
    runs.append(run)
    assert await run.api.claim() is not None
    return run


def client(node: Node, settings: Settings, run: Run, *, token: str | None = None) -> NodeCacheClient:
    return NodeCacheClient(
        node.socket,
        token=token or run.token,
        run_id=run.api.run_id,
        lease_id=run.api.lease_id,
        local=InProcessCache(settings),
    )


def project(root: Path, macro: str = "{% macro m() %}1{% endmacro %}") -> Path:
    """A project whose ``dbt deps`` installed one package and linked a ``local:`` one by absolute path."""
    (root / "dbt_packages" / "dbt_utils" / "macros").mkdir(parents=True)
    (root / "local_pkg").mkdir()
    (root / "packages.yml").write_text(PACKAGES)
    (root / "dbt_packages" / "dbt_utils" / "macros" / "m.sql").write_text(macro)
    os.symlink(root / "local_pkg", root / "dbt_packages" / "local_pkg")
    return root


def key_of(project_dir: Path, account_id: int) -> str:
    return package_key(project_dir, account_id=account_id, dbt_version="1.10", install_dir="dbt_packages")


async def test_a_run_restores_what_an_earlier_run_of_its_account_stored(
    db: Conn, settings: Settings, node: Node, runs: list[Run], tmp_path: Path
) -> None:
    account = create_account(db, name="first")
    first, second = await claimed(db, settings, runs, account), await claimed(db, settings, runs, account)
    stored = project(tmp_path / "first")
    key = key_of(stored, account)

    assert await client(node, settings, first).restore_packages(key, stored, "dbt_packages") is False
    assert await client(node, settings, first).store_packages(key, stored, "dbt_packages") == ""
    assert (node.root / str(account) / key / "tree" / "dbt_utils" / "macros" / "m.sql").is_file()

    restoring = tmp_path / "second"
    restoring.mkdir()
    (restoring / "packages.yml").write_text(PACKAGES)
    (restoring / "dbt_packages").mkdir()
    (restoring / "dbt_packages" / "stale.sql").write_text("left by an earlier install")
    assert await client(node, settings, second).restore_packages(key, restoring, "dbt_packages") is True

    installed = restoring / "dbt_packages"
    assert (installed / "dbt_utils" / "macros" / "m.sql").read_text() == "{% macro m() %}1{% endmacro %}"
    assert not (installed / "stale.sql").exists()
    assert os.readlink(installed / "local_pkg") == "../local_pkg"  # into this run's own project
    # Stored again by a later run of the account: the entry is there, nothing is sent.
    assert await client(node, settings, second).store_packages(key, stored, "dbt_packages") == ""


async def test_another_account_neither_reads_nor_replaces_an_entry(
    db: Conn, settings: Settings, node: Node, runs: list[Run], tmp_path: Path
) -> None:
    owner, other = create_account(db, name="owner"), create_account(db, name="other")
    owners = await claimed(db, settings, runs, owner)
    others = await claimed(db, settings, runs, other)
    stored = project(tmp_path / "owner")
    key = key_of(stored, owner)  # the other account can compute it: it names no secret
    assert await client(node, settings, owners).store_packages(key, stored, "dbt_packages") == ""

    target = tmp_path / "other"
    target.mkdir()
    assert await client(node, settings, others).restore_packages(key, target, "dbt_packages") is False
    assert not (target / "dbt_packages").exists()

    planted = project(tmp_path / "planted", macro="{% macro m() %}planted{% endmacro %}")
    assert await client(node, settings, others).store_packages(key, planted, "dbt_packages") == ""
    # Kept as the other account's own entry; the owner's next run still gets what the owner stored.
    assert (node.root / str(other) / key / "tree").is_dir()
    again = await claimed(db, settings, runs, owner)
    mine = tmp_path / "mine"
    mine.mkdir()
    assert await client(node, settings, again).restore_packages(key, mine, "dbt_packages") is True
    assert (mine / "dbt_packages" / "dbt_utils" / "macros" / "m.sql").read_text() == "{% macro m() %}1{% endmacro %}"


async def test_a_wrong_or_finished_runs_token_is_refused(
    db: Conn, settings: Settings, node: Node, runs: list[Run], tmp_path: Path
) -> None:
    account = create_account(db)
    first, other = await claimed(db, settings, runs, account), await claimed(db, settings, runs, account)
    stored = project(tmp_path / "p")
    key = key_of(stored, account)
    assert await client(node, settings, first).store_packages(key, stored, "dbt_packages") == ""

    target = tmp_path / "target"
    target.mkdir()
    wrong = client(node, settings, first, token=other.token)  # another run's token for this run
    with pytest.raises(CacheError, match="not for run"):
        await wrong.restore_packages(key, target, "dbt_packages")
    with pytest.raises(CacheError, match="not for run"):
        await wrong.store_packages(key_of(stored, account + 1000), stored, "dbt_packages")

    await first.api.finish(Outcome(RunStatus.SUCCESS, ""))
    with pytest.raises(CacheError, match="token is spent"):
        await client(node, settings, first).restore_packages(key, target, "dbt_packages")
    assert not (target / "dbt_packages").exists()
    assert sorted(p.name for p in node.root.iterdir()) == [str(account)]
    assert [p.name for p in (node.root / str(account)).iterdir()] == [key]


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, content in members:
            info.size = len(content) if info.isfile() else 0
            archive.addfile(info, io.BytesIO(content) if info.isfile() else None)
    return out.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


async def _store_raw(node: Node, run: Run, key: str, archive: bytes) -> dict[str, object]:
    """A store request made by hand, as a step of the run could send it (the protocol, not the client)."""

    def ask() -> dict[str, object]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(10)
            sock.connect(str(node.socket))
            request = {
                "op": "store_packages",
                "token": run.token,
                "run_id": run.api.run_id,
                "lease_id": run.api.lease_id,
                "key": key,
                "dir": "dbt_packages",
                "project_roots": ["/work/project"],
            }
            sock.sendall(json.dumps(request).encode())
            assert json.loads(sock.recv(1 << 20)) == {"send": True}
            for start in range(0, len(archive), 4096):
                sock.sendall(b"\x00" + archive[start : start + 4096])
            sock.sendall(json.dumps({"end": True}).encode())
            answer: dict[str, object] = json.loads(sock.recv(1 << 20))
            return answer

    return await asyncio.to_thread(ask)


@pytest.mark.parametrize(
    "case",
    [
        (_member("escape", tarfile.SYMTYPE, link="/etc/passwd"), "links outside the project (/etc/passwd)"),
        (_member("up", tarfile.SYMTYPE, link="../../.."), "links outside the project"),
        (_member("../outside.sql"), "is outside the packages' directory"),
        (_member("/abs.sql"), "is outside the packages' directory"),
        (_member("tty", tarfile.CHRTYPE), "is not a file, a directory or a symlink"),
        (_member("hard", tarfile.LNKTYPE, link="/etc/shadow"), "is not a file, a directory or a symlink"),
    ],
)
async def test_a_malicious_archive_is_refused_on_store(
    db: Conn, settings: Settings, node: Node, runs: list[Run], case: tuple[tarfile.TarInfo, str]
) -> None:
    member, refusal = case
    account = create_account(db)
    run = await claimed(db, settings, runs, account)
    key = "ab" * 32
    archive = _tar((_member("dbt_utils", tarfile.DIRTYPE, 0o755), b""), (member, b""), (_member("z.sql"), b"x" * 9000))

    answer = await _store_raw(node, run, key, archive)

    assert refusal in str(answer["reason"])
    assert not (node.root / str(account) / key).exists()
    assert [p.name for p in (node.root / str(account)).iterdir()] == []  # no staging left either


async def test_a_setuid_or_world_writable_file_is_kept_without_those_bits(
    db: Conn, settings: Settings, node: Node, runs: list[Run]
) -> None:
    account = create_account(db)
    run = await claimed(db, settings, runs, account)
    key = "cd" * 32
    archive = _tar((_member("run.sh", mode=0o6777), b"#!/bin/sh\n"), (_member("dir", tarfile.DIRTYPE, 0o1777), b""))

    assert await _store_raw(node, run, key, archive) == {"reason": ""}

    tree = node.root / str(account) / key / "tree"
    assert stat.S_IMODE((tree / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((tree / "dir").stat().st_mode) == 0o755


async def test_a_node_without_a_keeper_is_a_miss_not_a_failure(
    db: Conn, settings: Settings, runs: list[Run], tmp_path: Path
) -> None:
    run = await claimed(db, settings, runs, create_account(db))
    absent = Node(tmp_path / "none" / "cache.sock", tmp_path / "node")
    stored = project(tmp_path / "p")
    key = key_of(stored, run.account_id)
    assert await client(absent, settings, run).restore_packages(key, stored, "dbt_packages") is False
    assert "does not answer" in await client(absent, settings, run).store_packages(key, stored, "dbt_packages")


async def test_a_keeper_that_never_answers_costs_the_run_dbt_deps_not_the_run(
    db: Conn, settings: Settings, runs: list[Run], tmp_path: Path
) -> None:
    run = await claimed(db, settings, runs, create_account(db))
    stalled = Node(tmp_path / "stalled.sock", tmp_path / "node")
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
        listener.bind(str(stalled.socket))
        listener.listen(8)  # connections wait in the backlog, never accepted, never answered
        stored = project(tmp_path / "p")
        key = key_of(stored, run.account_id)
        slow = NodeCacheClient(
            stalled.socket,
            token=run.token,
            run_id=run.api.run_id,
            lease_id=run.api.lease_id,
            local=InProcessCache(settings),
            timeout=0.3,
        )
        assert await slow.restore_packages(key, stored, "dbt_packages") is False
        assert (stored / "dbt_packages" / "dbt_utils" / "macros" / "m.sql").is_file()  # left as it was
        assert "broke off" in await slow.store_packages(key, stored, "dbt_packages")


async def test_a_restore_broken_off_midway_leaves_no_half_entry(
    db: Conn, settings: Settings, runs: list[Run], tmp_path: Path
) -> None:
    run = await claimed(db, settings, runs, create_account(db))
    path = tmp_path / "breaking.sock"
    half = _tar((_member("dbt_utils", tarfile.DIRTYPE, 0o755), b""), (_member("dbt_utils/a.sql"), b"a" * 5000))

    def keeper_that_breaks_off(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1 << 20)
            conn.sendall(json.dumps({"restored": True}).encode())
            conn.sendall(b"\x00" + half[:3000])  # part of the entry, then the keeper is gone

    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
        listener.bind(str(path))
        listener.listen(1)
        breaking = asyncio.create_task(asyncio.to_thread(keeper_that_breaks_off, listener), name="breaking-keeper")
        target = tmp_path / "target"
        target.mkdir()
        restoring = client(Node(path, tmp_path / "node"), settings, run)
        assert await restoring.restore_packages("ab" * 32, target, "dbt_packages") is False
        await breaking
    assert not (target / "dbt_packages").exists()


async def test_a_node_over_its_budget_drops_the_least_recently_used_entry(
    db: Conn, settings: Settings, runs: list[Run], tmp_path: Path
) -> None:
    small = Node(tmp_path / "small" / "cache.sock", tmp_path / "small-node")
    keeper = NodeCacheKeeper(small.socket, small.root, settings.runner.api_address, max_cache_bytes=2500)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.serve(stop), name="small-node-cache")
    try:
        await eventually(lambda: task.done() or small.socket.exists(), 10, what="the keeper's socket")
        one, two = create_account(db, name="one"), create_account(db, name="two")
        ones, twos = await claimed(db, settings, runs, one), await claimed(db, settings, runs, two)
        keys = []
        for index, run in enumerate((ones, twos, ones)):
            stored = project(tmp_path / f"p{index}", macro="x" * 1000)
            keys.append(key_of(stored, index))
            assert await client(small, settings, run).store_packages(keys[-1], stored, "dbt_packages") == ""
            if index == 1:  # the first entry is restored, so the second is the least recently used
                into = tmp_path / "into"
                into.mkdir()
                assert await client(small, settings, ones).restore_packages(keys[0], into, "dbt_packages")
        # Removed after the store's answer (the run does not wait for it).
        await eventually(lambda: not (small.root / str(two) / keys[1]).exists(), 10, what="the eviction")
        assert (small.root / str(one) / keys[0]).is_dir()
        assert (small.root / str(one) / keys[2]).is_dir()
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
