"""The runner host's caches (repository mirrors, installed dbt packages) and who may change them.

A run's prep asks a :class:`PrepCache` for its checkout and its packages. Two kinds:

- :class:`InProcessCache`: the runner keeps the caches itself, as its own uid (a runner that does
  not switch to a run uid: a Pod, or a machine where runplane does not run as root).
- :class:`KeeperClient`: runs have uids of their own, and a cache writable by them would let one
  run plant code in the next. The fork server forks a *keeper* beside each spare runner, still
  root, joined to it by a ``SOCK_SEQPACKET`` socket pair; the runner (by then the run's uid) sends
  its requests there during prep and closes its end before the first step. The keeper serves
  only that runner: it learns the runner's uid from the kernel (``SCM_CREDENTIALS``), refuses any
  uid outside the run range, and hands the run what it made (:func:`serve`). It ends when the
  runner's end closes. It runs git as the cache's own unprivileged uid, never as root
  (``runner.checkout``): the caches are then in ``/var/lib/runplane/cache`` (beside
  ``runner.local_run_root``) unless the settings name them, never under root's HOME.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from pathlib import Path
from typing import Any, Protocol

from runner.checkout import Checkout, Repository, RepositoryCache, git_uid_for
from runner.package_cache import PackageCache
from runplane.basics.errors import RunplaneError
from runplane.basics.repository_urls import RepositoryRule
from runplane.basics.settings import RunnerSettings, Settings

log = logging.getLogger(__name__)

MAX_MESSAGE = 1 << 20
_UCRED = struct.Struct("3i")  # pid, uid, gid


class CacheError(RunplaneError):
    """The cache could not serve a request; the message says why (credentials masked)."""


class PrepCache(Protocol):
    async def checkout(self, repo: Repository, *, account_id: int, branch: str, sha: str, dest: Path) -> Checkout:
        """A clone of the run's repository in ``dest`` with its commit resolved, not checked out yet."""
        ...

    async def restore_packages(self, key: str, project: Path, install_dir: str) -> bool:
        """Link the packages entry ``key`` into ``project/install_dir``; False when there is none."""
        ...

    async def store_packages(self, key: str, project: Path, install_dir: str) -> str:
        """Keep ``project/install_dir`` as the entry ``key``; "" or why it was not kept."""
        ...

    async def close(self) -> None: ...


def cache_roots(runner: RunnerSettings, *, keeper: bool = False) -> tuple[Path, Path]:
    """(repositories, dbt packages) of this host: by default in the runner's HOME, or for a root
    ``keeper`` beside the runs' directories, where the cache's own uid can reach them."""
    base = Path(runner.local_run_root).parent / "cache" if keeper else Path.home() / ".cache" / "runplane"
    if keeper:
        base.mkdir(mode=0o711, parents=True, exist_ok=True)
    return (
        Path(runner.repository_cache or base / "repositories"),
        Path(runner.package_cache or base / "dbt-packages"),
    )


class InProcessCache:
    """The caches kept by the runner itself, as its own uid."""

    def __init__(self, settings: Settings) -> None:
        repositories, packages = cache_roots(settings.runner)
        self._repositories = RepositoryCache(repositories, RepositoryRule(settings.repositories))
        self._packages = PackageCache(packages)

    async def checkout(self, repo: Repository, *, account_id: int, branch: str, sha: str, dest: Path) -> Checkout:
        return await self._repositories.clone_for_run(
            repo, account_id=account_id, branch=branch, sha=sha, dest=dest, owner=None
        )

    async def restore_packages(self, key: str, project: Path, install_dir: str) -> bool:
        return await asyncio.to_thread(self._packages.restore, key, project, install_dir, None)

    async def store_packages(self, key: str, project: Path, install_dir: str) -> str:
        return await asyncio.to_thread(self._packages.store, key, project, install_dir, None)

    async def close(self) -> None:
        return None


class KeeperClient:
    """The runner's end of its keeper's socket."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(self._sock, json.dumps(request).encode())
        reply = await loop.sock_recv(self._sock, MAX_MESSAGE)
        if not reply:
            raise CacheError("the host's cache keeper is gone")
        answer: dict[str, Any] = json.loads(reply)
        if "error" in answer:
            raise CacheError(str(answer["error"]))
        return answer

    async def checkout(self, repo: Repository, *, account_id: int, branch: str, sha: str, dest: Path) -> Checkout:
        request = {
            "op": "checkout",
            "url": repo.url,
            "credential_kind": repo.credential_kind,
            "credential": repo.credential,
            "account_id": account_id,
            "branch": branch,
            "sha": sha,
            "dest": str(dest),
        }
        answer = await self._ask(request)
        return Checkout(dest, str(answer["sha"]), str(answer["branch"]), bool(answer["cloned"]))

    async def restore_packages(self, key: str, project: Path, install_dir: str) -> bool:
        answer = await self._ask({"op": "restore_packages", "key": key, "project": str(project), "dir": install_dir})
        return bool(answer["restored"])

    async def store_packages(self, key: str, project: Path, install_dir: str) -> str:
        answer = await self._ask({"op": "store_packages", "key": key, "project": str(project), "dir": install_dir})
        return str(answer["reason"])

    async def close(self) -> None:
        self._sock.close()


def keeper_socket_pair() -> tuple[socket.socket, socket.socket]:
    """(the keeper's end, the runner's end); the keeper's receives its peer's kernel-checked uid."""
    keeper, runner = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    keeper.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return keeper, runner


def serve(sock: socket.socket, settings: Settings) -> None:
    """The keeper's loop: answer the runner's requests until its end closes."""
    repositories, packages = cache_roots(settings.runner, keeper=True)
    rule = RepositoryRule(settings.repositories)
    git_uid = git_uid_for(settings.runner.local_uid)
    keeper = _Keeper(RepositoryCache(repositories, rule, git_uid), PackageCache(packages), settings.runner)
    while True:
        try:
            data, ancillary, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(_UCRED.size))
        except ConnectionError:
            return
        if not data:
            return
        uid = _sender_uid(ancillary)
        try:
            answer = keeper.answer(json.loads(data), uid)
        except (RunplaneError, OSError, ValueError, KeyError, TypeError) as exc:
            answer = {"error": _reason(exc)}
        try:
            sock.sendall(json.dumps(answer).encode())
        except OSError:
            return


def _sender_uid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
            _, uid, _ = _UCRED.unpack(payload[: _UCRED.size])
            return int(uid)
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc)


class _Keeper:
    def __init__(self, repositories: RepositoryCache, packages: PackageCache, runner: RunnerSettings) -> None:
        self._repositories = repositories
        self._packages = packages
        self._uids = range(runner.local_uid, runner.local_uid + runner.local_uid_count)

    def _owner(self, uid: int | None) -> int | None:
        """Whom what the keeper makes is handed to: the runner's run uid (None: the runner is root)."""
        if uid == 0:
            return None
        if uid is None or uid not in self._uids:
            raise CacheError(f"uid {uid} is not a run uid")
        return uid

    def answer(self, request: dict[str, Any], uid: int | None) -> dict[str, Any]:
        owner = self._owner(uid)
        match request["op"]:
            case "checkout":
                repo = Repository(str(request["url"]), str(request["credential_kind"]), str(request["credential"]))
                checkout = asyncio.run(
                    self._repositories.clone_for_run(
                        repo,
                        account_id=int(request["account_id"]),
                        branch=str(request["branch"]),
                        sha=str(request["sha"]),
                        dest=_absolute(request["dest"]),
                        owner=owner,
                    )
                )
                return {"sha": checkout.sha, "branch": checkout.branch, "cloned": checkout.cloned}
            case "restore_packages":
                restored = self._packages.restore(
                    str(request["key"]), _absolute(request["project"]), str(request["dir"]), owner
                )
                return {"restored": restored}
            case "store_packages":
                reason = self._packages.store(
                    str(request["key"]), _absolute(request["project"]), str(request["dir"]), owner
                )
                return {"reason": reason}
            case other:
                raise CacheError(f"unknown request {str(other)[:40]!r}")


def _absolute(value: object) -> Path:
    path = Path(str(value))
    if not path.is_absolute():
        raise CacheError(f"not an absolute path: {str(value)[:200]!r}")
    return path
