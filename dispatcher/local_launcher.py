"""The local launcher: one runner process per run on this machine (the default of ``runplane up``).

By default runners are forked from a pre-loaded runner (``python -m runner.fork_server``, one per
dispatcher), so a run starts in milliseconds instead of the second a fresh interpreter spends
importing; with ``dispatcher.local_fork_server`` off, each run gets a fresh
``python -m runplane runner --run-id N``. Either way the runner lives in its own session, so it
outlives a dispatcher restart the way a Pod outlives the dispatcher that created it.

A runner gets no control-plane credential: its environment is built from an allow-list
(:func:`runner_environment`: PATH, HOME, locale, Python's own, the runner's settings, the runner
API address and the repository rule's settings) and never holds the database, Redis or RabbitMQ
URLs or the secret keys. The run's token travels through a pipe (the fork server's stdin, or a
fresh runner's stdin), never through an environment variable or a file left on disk.

The launcher knows which of the runners it gave a run are alive: a pidfd per runner, watched by the
event loop, tells it when one exits (:meth:`LocalLauncher.alive`). The dispatcher holds no more runs
than ``dispatcher.local_capacity`` leaves room for (``dispatcher/intake.py``), so a peak larger than
the machine waits queued, where nothing times out, instead of as thousands of runners that cannot
all claim their runs before the start timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import signal
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from dispatcher.launcher import LaunchRequest, LaunchResult
from dispatcher.pool_sizing import record_launch
from runplane.adapters import cgroups, local_fence, network_fence
from runplane.adapters.network_fence import Endpoint
from runplane.basics.errors import LaunchError
from runplane.basics.held_processes import exited, open_pidfd
from runplane.basics.local_capacity import local_capacity, pids_per_run
from runplane.basics.repository_urls import repository_environment
from runplane.basics.settings import Settings

log = logging.getLogger(__name__)

FORK_SERVER_MODULE = "runner.fork_server"
POOL_NAME = "local"  # the fork server's spares, as a pool in the metrics
FORK_SERVER_ANSWER_TIMEOUT = 30.0  # covers the server's own start (imports) on a busy machine
SPARE_DESCRIPTORS = 256  # file descriptors kept for everything but the runners' pidfds


# Passed through from the dispatcher's environment to a runner; nothing else is.
RUNNER_INHERITS = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR")
RUNNER_INHERITS_PREFIXES = ("LC_",)
# Settings a runner reads; database, Redis, RabbitMQ URLs and secret keys are not among them.
RUNNER_SETTINGS = ("RUNPLANE_LOG_FORMAT", "RUNPLANE_LOG_LEVEL", "RUNPLANE_OTLP_ENDPOINT")
RUNNER_SETTINGS_PREFIX = "RUNPLANE_RUNNER__"


def runner_environment(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a local runner starts with: an allow-list, plus the runner API address."""
    source = os.environ if environ is None else environ
    env = {
        k: v
        for k, v in source.items()
        if k in RUNNER_INHERITS
        or k.startswith(RUNNER_INHERITS_PREFIXES)
        or k in RUNNER_SETTINGS
        or k.startswith(RUNNER_SETTINGS_PREFIX)
    }
    env["RUNPLANE_RUNNER__API_ADDRESS"] = settings.runner.api_address
    env.update(repository_environment(settings.repositories))  # the cache keeper checks each clone with them
    hidden = [*settings.runner.local_hidden_paths, *_socket_directories(settings.database_url)]
    env["RUNPLANE_RUNNER__LOCAL_HIDDEN_PATHS"] = json.dumps(list(dict.fromkeys(hidden)))
    # The dispatcher knows how many runs this machine holds at once; each runner applies its share.
    env["RUNPLANE_RUNNER__LOCAL_PIDS_MAX"] = str(pids_per_run(settings))
    return env


def _socket_directories(database_url: str) -> list[str]:
    """The directories of the Unix sockets ``database_url`` names (a host that is a path)."""
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    hosts = str(info.get("host") or "").split(",")
    return [host for host in hosts if host.startswith("/")] or ["/var/run/postgresql"]  # libpq's default


def control_plane_endpoints(settings: Settings) -> list[Endpoint]:
    """The servers a run must never reach, wherever they are, even as a warehouse: the system of
    record, the lock store and the bus. (The public APIs, like everything else on this machine,
    are out of a run's reach anyway.)"""
    found: set[Endpoint] = set()
    info = psycopg.conninfo.conninfo_to_dict(settings.database_url)
    hosts = str(info.get("host") or "127.0.0.1").split(",")
    ports = str(info.get("port") or "5432").split(",")
    for index, host in enumerate(hosts):
        found.update(network_fence.resolve(host, int(ports[min(index, len(ports) - 1)] or 5432)))
    for url, default_port in ((settings.redis_url, 6379), (settings.amqp_url, 5672)):
        parts = urlsplit(url)
        found.update(network_fence.resolve(parts.hostname or "127.0.0.1", parts.port or default_port))
    return sorted(found)


def closed_to_others(path: Path) -> Path | None:
    """The first of ``path`` (symlinks followed) and its directories that other users cannot read
    or enter, or None."""
    target = path.resolve()
    for part in [*reversed(target.parents), target]:
        try:
            mode = part.stat().st_mode
        except OSError:
            return part
        needed = stat.S_IXOTH if part.is_dir() else stat.S_IROTH
        if not mode & needed:
            return part
    return None


def _allow_descriptors(count: int) -> None:
    """Raise this process's soft limit on open files to ``count`` when it is lower (within the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count if hard == resource.RLIM_INFINITY else min(count, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


class ForkServer:
    """The dispatcher's end of ``runner.fork_server``: a run id and its token in, the forked runner's pid
    out, and whether that runner was started and waiting (warm) or the run waited for it (cold)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = dict(env)
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            await self._ensure_started()

    async def _ensure_started(self) -> asyncio.subprocess.Process:
        if self._process is not None and self._process.returncode is None:
            return self._process
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                FORK_SERVER_MODULE,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=self._env,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start the runner fork server: {exc}", retryable=True) from exc
        process = self._process
        assert process.stdout is not None
        try:
            ready = await asyncio.wait_for(process.stdout.readline(), timeout=FORK_SERVER_ANSWER_TIMEOUT)
        except TimeoutError:
            ready = b""
        if ready.strip() != b"ready":
            await self._discard(process)
            raise LaunchError(f"runner fork server did not start: {ready!r}", retryable=True)
        log.info("runner fork server ready", extra={"pid": process.pid})
        return process

    async def fork(self, run_id: int, token: str) -> tuple[int, bool]:
        """The pid of the runner given the run, and whether it was waiting for it (warm)."""
        async with self._lock:
            process, answer = await self._ask(f"{run_id} {token}\n".encode())
            parts = answer.split()
            if len(parts) != 3 or int(parts[0]) != run_id or int(parts[1]) <= 0 or parts[2] not in (b"warm", b"cold"):
                await self._discard(process)
                raise LaunchError(f"runner fork server answered {answer!r}", retryable=True)
            return int(parts[1]), parts[2] == b"warm"

    async def set_spares(self, count: int) -> None:
        """Ask the server to keep ``count`` runners started and waiting (it forks or lets go of spares)."""
        async with self._lock:
            process, answer = await self._ask(f"spares {count}\n".encode())
            if answer.split() != [b"spares", str(count).encode()]:
                await self._discard(process)
                raise LaunchError(f"runner fork server answered {answer!r}", retryable=True)

    async def _ask(self, line: bytes, *, again: bool = True) -> tuple[asyncio.subprocess.Process, bytes]:
        """Send one line and read the server's answer (the caller holds the lock).

        A server that died since the last question may still look alive (its exit not yet reaped, so
        ``returncode`` is None): its closed pipe (end of file, or a broken pipe) says so, and the
        question goes ``again`` to a new server. A duplicate fork is harmless: a run is claimed once."""
        process = await self._ensure_started()
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(line)
            await process.stdin.drain()
            answer = await asyncio.wait_for(process.stdout.readline(), timeout=FORK_SERVER_ANSWER_TIMEOUT)
        except (BrokenPipeError, ConnectionResetError) as exc:
            await self._discard(process)
            if again:
                return await self._ask(line, again=False)
            raise LaunchError(f"runner fork server did not answer: {exc!r}", retryable=True) from exc
        except (OSError, TimeoutError) as exc:
            await self._discard(process)
            raise LaunchError(f"runner fork server did not answer: {exc!r}", retryable=True) from exc
        if not answer and again:
            await self._discard(process)
            return await self._ask(line, again=False)
        return process, answer

    async def _discard(self, process: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        self._process = None

    async def close(self) -> None:
        """Close its stdin: the server exits; runners it forked carry on."""
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout=5)
        except TimeoutError:
            await self._discard(process)
        self._process = None


class LocalLauncher:
    name = "local"

    def __init__(self, settings: Settings) -> None:
        for problem in local_fence.problems(settings):
            log.warning("runs are not fenced like Pods: %s", problem, extra={"uid": os.geteuid()})
        if settings.runner.local_uid >= 0 and os.geteuid() == 0:
            log.info("runs are limited: %s", local_fence.limits(settings))
            if settings.runner.local_fence and network_fence.unavailable() is None:
                network_fence.install(
                    settings.runner.local_uid, settings.runner.local_uid_count, control_plane_endpoints(settings)
                )
            for path in [sys.executable, *settings.runner.dbt_versions.values()]:
                if (closed := closed_to_others(Path(path))) is not None:
                    log.warning(
                        "runs get uids of their own, but %s is closed to other users: what needs it (the "
                        "runner's Python, dbt) fails in a run; install it where every user can read it",
                        closed,
                        extra={"path": path},
                    )
        self._cluster = settings.dispatcher.cluster
        self._env = runner_environment(settings)
        self._fork_server = ForkServer(self._env) if settings.dispatcher.local_fork_server else None
        self._children: set[int] = set()
        self.capacity = local_capacity(settings)
        _allow_descriptors(self.capacity + SPARE_DESCRIPTORS)
        # A pidfd for each runner given a run that has not exited: its run and pid.
        self._alive: dict[int, tuple[int, int]] = {}

    def alive(self) -> int:
        """Runners this launcher gave a run that have not exited yet."""
        return len(self._alive)

    def runs_alive(self) -> list[int]:
        """The runs of those runners."""
        return [run_id for run_id, _ in self._alive.values()]

    def end_runner(self, run_id: int) -> list[tuple[Path, int]] | None:
        """On the event loop (which alone closes pidfds): end the runner of ``run_id`` and everything
        of its run. With a run cgroup, its directories and descriptors opened while the runner was
        alive, for the caller to empty (:func:`runplane.adapters.cgroups.kill`, which may take a
        while) and close; without one the runner is killed here and the list is empty. None when the
        run has no live runner here."""
        for pidfd, (held_run, pid) in self._alive.items():
            if held_run != run_id:
                continue
            opened: list[tuple[Path, int]] = []
            with contextlib.suppress(OSError):
                for directory in cgroups.run_cgroups_of(pid):
                    opened.append((directory, cgroups.open_cgroup(directory)))
            if exited(pidfd):  # checked after: what was read and opened was this runner's, alive
                for _, fd in opened:
                    os.close(fd)
                return None
            if not opened:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return opened
        return None

    async def start(self) -> None:
        """Load the fork server ahead of the first run."""
        if self._fork_server is not None:
            await self._fork_server.start()

    async def set_spares(self, count: int) -> bool:
        """Keep ``count`` runners started and waiting; False when runners are not forked (nothing to keep)."""
        if self._fork_server is None:
            return False
        await self._fork_server.set_spares(count)
        return True

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        if not request.token:
            raise LaunchError(f"run {request.run_id} has no run token", retryable=False)
        if self._fork_server is not None:
            pid, warm = await self._fork_server.fork(request.run_id, request.token)
        else:
            pid, warm = self._spawn(request.run_id, request.token), False
        self._watch(request.run_id, pid)
        record_launch(pool=POOL_NAME, cluster=self._cluster, warm=warm)
        log.info("runner started", extra={"run_id": request.run_id, "pid": pid, "warm": warm})
        return LaunchResult(cluster=self._cluster, pod_name=f"pid:{pid}", warm=warm)

    def _watch(self, run_id: int, pid: int) -> None:
        """Count the runner as alive until the kernel says it exited (its pidfd turns readable)."""
        try:
            pidfd = open_pidfd(pid)
        except OSError as exc:
            log.warning("a runner is not counted against the capacity", extra={"pid": pid, "error": str(exc)})
            return
        if pidfd is None:
            return  # it has already exited, and its parent reaped it
        asyncio.get_running_loop().add_reader(pidfd, self._exited, pidfd)
        self._alive[pidfd] = (run_id, pid)

    def _exited(self, pidfd: int) -> None:
        asyncio.get_running_loop().remove_reader(pidfd)
        os.close(pidfd)
        self._alive.pop(pidfd, None)

    def _spawn(self, run_id: int, token: str) -> int:
        self._reap()
        argv = [sys.executable, "-m", "runplane", "runner", "--run-id", str(run_id), "--token-file", "-"]
        # The token waits in a pipe that becomes the runner's stdin (far below the pipe's buffer size).
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, f"{token}\n".encode())
            os.close(write_end)
            write_end = -1
            # posix_spawn (vfork) keeps the event loop's pause to well under a millisecond.
            pid = os.posix_spawn(
                sys.executable,
                argv,
                self._env,
                file_actions=[(os.POSIX_SPAWN_DUP2, read_end, 0)],
                setsid=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start a runner process: {exc}", retryable=True) from exc
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        self._children.add(pid)
        return pid

    def _reap(self) -> None:
        for pid in list(self._children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._children.discard(pid)

    async def close(self) -> None:
        """Runners still working carry on (their lease keeps them honest)."""
        for pidfd in list(self._alive):
            self._exited(pidfd)
        if self._fork_server is not None:
            await self._fork_server.close()
        with contextlib.suppress(OSError):
            self._reap()
