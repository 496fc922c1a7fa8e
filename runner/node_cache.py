"""The node's dbt packages cache for run Pods: a keeper per node (``runplane node-cache``) and its client.

A run Pod's steps run as the same uid as its runner and can reach the keeper's socket, so nothing a
caller says about itself can be trusted: every request carries the run's token, and the keeper asks
the runner API whose run that is (``RunnerService.RunAccount``: the run's token, running, under the
lease it names). The entries it serves and keeps are that account's alone (``<root>/<account id>/``),
whatever key the caller sends; a token of a finished run, of another run, or none, is refused.
Within an account an entry is what one of its runs' ``dbt deps`` installed, the trust the host's
cache gives (``runner.package_cache``).

No file system is shared with the Pod: the keeper streams an entry as a tar over the socket and the
runner extracts it into its project; a store is the reverse, each member checked by the keeper as
``package_cache`` checks what it copies (no device, no setuid, no link out of the project) into a
staging directory renamed into place. The socket is ``SOCK_SEQPACKET``, one message per packet as the
host's keeper speaks (``runner.cache_keeper``): a request and its answers are JSON; a tar travels in
data packets, each starting with a NUL byte (which no JSON message does), ended by a JSON message.
A connection carries one request.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import shutil
import socket
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from runner.cache_budget import CacheBudget
from runner.cache_keeper import MAX_MESSAGE, CacheError, InProcessCache
from runner.checkout import Checkout, Repository
from runner.package_cache import PackageCache, PackageCacheError, extract_entry, project_roots
from runplane.basics.errors import RunplaneError
from runplane.v1 import runner_pb2, runner_pb2_grpc

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

log = logging.getLogger(__name__)

DATA = b"\x00"
CHUNK = MAX_MESSAGE - len(DATA)
REQUEST_TIMEOUT = 10.0  # for a connection's request to arrive
TRANSFER_TIMEOUT = 60.0  # for the peer to send or take the next packet
ACCOUNT_CALL_TIMEOUT = 10.0
DEFAULT_MAX_ENTRY_BYTES = 1 << 30
MAX_CONNECTIONS = 16  # served at once; more wait in the listen backlog


# --- the framing, both ends


class _Frames:
    """One connection's packets, blocking, each wait bounded by ``timeout``."""

    def __init__(self, sock: socket.socket, timeout: float = TRANSFER_TIMEOUT) -> None:
        sock.setblocking(True)
        sock.settimeout(timeout)
        self._sock = sock

    def send(self, message: dict[str, Any]) -> None:
        self._sock.sendall(_encode(message))

    def receive(self) -> dict[str, Any]:
        return _decode(self._recv())

    def _recv(self) -> bytes:
        packet = self._sock.recv(MAX_MESSAGE)
        if not packet:
            raise CacheError("the node's cache connection closed")
        return packet

    def writer(self) -> _DataWriter:
        return _DataWriter(self._sock)

    def reader(self, limit: int) -> _DataReader:
        return _DataReader(self._recv, limit)


class _DataWriter(io.BufferedIOBase):
    """A file to ``tarfile`` (``w|``): what it writes goes out in data packets of at most ``CHUNK``."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self._pending = bytearray()

    def write(self, data: ReadableBuffer) -> int:
        data = bytes(data)
        self._pending += data
        while len(self._pending) >= CHUNK:
            self._sock.sendall(DATA + bytes(self._pending[:CHUNK]))
            del self._pending[:CHUNK]
        return len(data)

    def flush(self) -> None:
        if self._pending:
            self._sock.sendall(DATA + bytes(self._pending))
            self._pending.clear()


class _DataReader(io.BufferedIOBase):
    """A file to ``tarfile`` (``r|``) over data packets, at most ``limit`` bytes; the JSON message that
    ends them is kept in :attr:`end`."""

    def __init__(self, recv: Callable[[], bytes], limit: int) -> None:
        super().__init__()
        self._recv = recv
        self._limit = limit
        self._buffer = bytearray()
        self._received = 0
        self.end: dict[str, Any] | None = None

    def read(self, size: int | None = -1, /) -> bytes:
        size = -1 if size is None else size
        while self.end is None and (size < 0 or len(self._buffer) < size):
            packet = self._recv()
            if not packet.startswith(DATA):
                self.end = _decode(packet)
                break
            self._received += len(packet) - len(DATA)
            if self._received > self._limit:
                raise CacheError(f"the packages are larger than this node keeps ({self._limit} bytes)")
            self._buffer += packet[len(DATA) :]
        size = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def finish(self) -> dict[str, Any]:
        """Read what is left (the tar's padding) up to the message that ends the data; that message."""
        while self.read(CHUNK):
            pass
        assert self.end is not None
        return self.end


def _encode(message: dict[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    if len(data) > MAX_MESSAGE:
        raise CacheError("a cache message is too large")
    return data


def _decode(packet: bytes) -> dict[str, Any]:
    try:
        message = json.loads(packet)
    except ValueError:
        raise CacheError("not a cache message") from None
    if not isinstance(message, dict):
        raise CacheError("not a cache message")
    return message


# --- the run's end


class NodeCacheClient:
    """A run Pod's :class:`~runner.cache_keeper.PrepCache`: the dbt packages from the node's keeper
    at ``socket_path`` (asked with this run's token and lease), the checkout kept in the Pod.

    A keeper that is not there, does not answer within ``timeout`` or breaks off costs the run its
    ``dbt deps``, never the run itself: the socket is reachable by every Pod of the node, so a busy
    or stalled keeper must not fail another account's runs. A keeper's refusal is an error.
    """

    def __init__(
        self,
        socket_path: Path,
        *,
        token: str,
        run_id: int,
        lease_id: str,
        local: InProcessCache,
        timeout: float = TRANSFER_TIMEOUT,
    ) -> None:
        self._path = socket_path
        self._caller = {"token": token, "run_id": run_id, "lease_id": lease_id}
        self._local = local
        self._timeout = timeout

    async def checkout(self, repo: Repository, *, account_id: int, branch: str, sha: str, dest: Path) -> Checkout:
        return await self._local.checkout(repo, account_id=account_id, branch=branch, sha=sha, dest=dest)

    async def restore_packages(self, key: str, project: Path, install_dir: str) -> bool:
        return await asyncio.to_thread(self._restore, key, project, install_dir)

    async def store_packages(self, key: str, project: Path, install_dir: str) -> str:
        return await asyncio.to_thread(self._store, key, project, install_dir)

    async def close(self) -> None:
        await self._local.close()

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.settimeout(self._timeout)
        try:
            sock.connect(str(self._path))
        except OSError as exc:
            sock.close()
            log.warning("the node's cache keeper does not answer at %s: %s", self._path, exc)
            return None
        return sock

    def _restore(self, key: str, project: Path, install_dir: str) -> bool:
        sock = self._connect()
        if sock is None:  # no keeper on this node now: the run installs its packages itself
            return False
        with sock:
            frames = _Frames(sock, self._timeout)
            try:
                frames.send({"op": "restore_packages", **self._caller, "key": key})
                answer = frames.receive()
            except (OSError, CacheError) as exc:
                log.warning("the node's cache keeper did not answer: %s", exc)
                return False
            if not _answer(answer).get("restored"):
                return False
            reader = frames.reader(DEFAULT_MAX_ENTRY_BYTES)
            try:
                extract_entry(reader, project, install_dir)
                _answer(reader.finish())
            except PackageCacheError as exc:
                raise CacheError(f"the node's entry was refused: {exc}") from exc
            except (OSError, CacheError) as exc:  # broken off: what came is removed, dbt deps installs
                log.warning("the node's cache keeper broke off a restore: %s", exc)
                shutil.rmtree(project / install_dir, ignore_errors=True)
                return False
            return True

    def _store(self, key: str, project: Path, install_dir: str) -> str:
        sock = self._connect()
        if sock is None:
            return f"the node's cache keeper does not answer at {self._path}"
        request = {
            "op": "store_packages",
            **self._caller,
            "key": key,
            "dir": install_dir,
            "project_roots": project_roots(project),
        }
        with sock:
            frames = _Frames(sock, self._timeout)
            try:
                frames.send(request)
                answer = _answer(frames.receive())
                if "reason" in answer:  # kept already, or not wanted
                    return str(answer["reason"])
                _write_tree(project / install_dir, frames.writer())
                frames.send({"end": True})
                return str(_answer(frames.receive())["reason"])
            except OSError as exc:
                return f"the node's cache keeper broke off: {exc}"


def _write_tree(tree: Path, writer: _DataWriter) -> None:
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        archive.add(tree, arcname=".")
    writer.flush()


def _answer(message: dict[str, Any]) -> dict[str, Any]:
    if "error" in message:
        raise CacheError(f"the node's cache: {message['error']}")
    return message


# --- the keeper


class NodeCacheKeeper:
    """Serves the node's entries under ``root`` on the Unix socket ``socket_path``; the caller's
    account comes from the runner API at ``api_address``."""

    def __init__(
        self,
        socket_path: Path,
        root: Path,
        api_address: str,
        *,
        max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
        max_cache_bytes: int = 0,
    ) -> None:
        self._path = socket_path
        self._root = root
        self._api_address = api_address
        self._max_entry_bytes = max_entry_bytes
        self._budget = CacheBudget(root, max_cache_bytes)  # 0: no budget

    async def serve(self, stop: asyncio.Event) -> None:
        """Answer connections until ``stop`` is set; the connections being served end first."""
        self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self._root, 0o700)
        self._path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)  # a socket left by an earlier keeper
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(self._path))
        os.chmod(self._path, 0o666)  # any run's uid may ask: the token says who it is
        listener.listen(64)
        listener.setblocking(False)
        log.info("node cache keeper serving", extra={"socket": str(self._path), "root": str(self._root)})
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(MAX_CONNECTIONS)
        async with grpc.aio.insecure_channel(self._api_address) as channel:
            stub = runner_pb2_grpc.RunnerServiceStub(channel)
            try:
                async with asyncio.TaskGroup() as group:
                    while not stop.is_set():
                        accept = asyncio.ensure_future(loop.sock_accept(listener))
                        stopping = asyncio.ensure_future(stop.wait())
                        await asyncio.wait({accept, stopping}, return_when=asyncio.FIRST_COMPLETED)
                        stopping.cancel()
                        if not accept.done():
                            accept.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await accept
                            break
                        conn, _ = accept.result()
                        await slots.acquire()
                        group.create_task(self._connection(conn, stub, slots), name="node-cache:connection")
            finally:
                listener.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path)

    async def _connection(
        self, conn: socket.socket, stub: runner_pb2_grpc.RunnerServiceAsyncStub, slots: asyncio.Semaphore
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            with conn:
                try:
                    packet = await asyncio.wait_for(loop.sock_recv(conn, MAX_MESSAGE), REQUEST_TIMEOUT)
                    request = _decode(packet)
                    account_id = await self._account(stub, request)
                except (CacheError, TimeoutError, OSError) as exc:
                    with contextlib.suppress(OSError):
                        await loop.sock_sendall(conn, _encode({"error": str(exc)[:1000]}))
                    return
                await asyncio.to_thread(self._answer, _Frames(conn), request, account_id)
        finally:
            slots.release()

    async def _account(self, stub: runner_pb2_grpc.RunnerServiceAsyncStub, request: dict[str, Any]) -> int:
        """The account of the run whose token the request carries, from the runner API."""
        token, run_id, lease_id = request.get("token"), request.get("run_id"), request.get("lease_id")
        if not isinstance(token, str) or not isinstance(run_id, int) or not isinstance(lease_id, str):
            raise CacheError("a request names its run, lease and token")
        try:
            answer = await stub.RunAccount(
                runner_pb2.LeaseRequest(run_id=run_id, lease_id=lease_id),
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=ACCOUNT_CALL_TIMEOUT,
            )
        except grpc.aio.AioRpcError as exc:
            raise CacheError(f"refused by the runner API: {exc.details()}") from exc
        return int(answer.account_id)

    def _answer(self, frames: _Frames, request: dict[str, Any], account_id: int) -> None:
        packages = PackageCache(self._root / str(account_id))
        extra = {"account_id": account_id, "run_id": request.get("run_id")}
        try:
            match request.get("op"):
                case "restore_packages":
                    self._restore(frames, packages, str(request["key"]))
                case "store_packages":
                    reason = self._store(frames, packages, request)
                    log.info("dbt packages stored" if not reason else "dbt packages not stored: %s", reason,
                             extra=extra)  # fmt: skip
                case other:
                    raise CacheError(f"unknown request {str(other)[:40]!r}")
        except (RunplaneError, OSError, KeyError, TypeError) as exc:
            log.warning("node cache request failed: %s", exc, extra=extra)
            with contextlib.suppress(OSError):
                frames.send({"error": str(exc)[:1000]})

    def _restore(self, frames: _Frames, packages: PackageCache, key: str) -> None:
        if not (packages.entry(key) / "tree").is_dir():
            frames.send({"restored": False})
            return
        frames.send({"restored": True})
        self._budget.restored(packages.entry(key))
        writer = frames.writer()
        if not packages.write_archive(key, writer):  # evicted meanwhile: the run's restore is a miss
            raise CacheError("the entry went away")
        writer.flush()
        frames.send({"end": True})

    def _store(self, frames: _Frames, packages: PackageCache, request: dict[str, Any]) -> str:
        key, install_dir, roots = str(request["key"]), str(request["dir"]), request["project_roots"]
        if not isinstance(roots, list) or not all(isinstance(root, str) for root in roots):
            raise CacheError("project_roots is a list of paths")
        if (packages.entry(key) / "tree").is_dir():
            self._budget.restored(packages.entry(key))
            frames.send({"reason": ""})
            return ""
        frames.send({"send": True})
        reader = frames.reader(self._max_entry_bytes)
        reason = packages.store_archive(key, reader, roots, install_dir)
        reader.finish()  # after a refused member the run is still sending: take the rest (bounded) first
        frames.send({"reason": reason})
        if not reason:  # after the answer: the run does not wait for older entries to be removed
            self._budget.stored(packages.entry(key))
        return reason
