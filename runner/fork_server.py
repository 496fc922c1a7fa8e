"""A pre-loaded runner that forks one child per run: prep time in milliseconds on one machine.

A fresh ``runplane runner`` process spends most of a second (and as much CPU) importing before it
can claim its run; at ten runs a second that alone saturates a small machine. The local launcher
therefore keeps one of these per dispatcher: it imports everything once and says ``ready``; then
for every line ``<run_id> <token>`` on stdin a child executes :func:`runner.service.run` in its own
session, and the server answers ``<run_id> <pid> <warm|cold>`` on stdout. EOF on stdin (its
dispatcher went away) ends the server; the children carry on, each holding its own lease.

The child is forked ahead of its run (a *spare*): it has set up its process and opened its channel
to the runner API (gRPC's start in a fresh child and the connection cost about as much as the rest
of the prep time together), says so with one byte once connected, and waits on a socket of its
own. A run's line goes down that socket; the spare switches to the run's uid and claims it at once,
and the server forks the next spare. The answer says whether the run found its runner waiting
(``warm``: the spare had said it was connected) or waited for one (``cold``: the spare was still
starting, or had died and a child was forked for the run).

The server keeps one spare, or as many as its last line ``spares N`` asked (answered ``spares N``):
the dispatcher raises N ahead of a forecast peak (``dispatcher/local_spares.py``) and lowers it
after, so a peak's runs find started runners instead of waiting for forks. A spare above N gets EOF
on its socket and leaves.

When runs have uids of their own (a root server), each spare is forked with a *keeper* beside it:
a child that stays root and keeps the host's repository and package caches for that one runner
during its prep (``runner.cache_keeper``), so no cache is ever writable by a run.

Started as ``python -m runner.fork_server`` with the runner's allow-listed environment (no
control-plane credential); the tokens arrive only through the pipe. The server keeps no token: it
reads each line into one buffer, passes it on and wipes it before it forks the next spare, so a
spare holds no other run's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import socket
import sys
from dataclasses import dataclass

import grpc

from runner.cache_keeper import KeeperClient, keeper_socket_pair, serve
from runner.control_plane import runner_channel
from runner.run_user import lease_for_run, runs_have_own_uids
from runner.service import run
from runplane.adapters import run_scratch
from runplane.basics import logs
from runplane.basics.settings import Settings

MAX_LINE = 4096  # far above ``<run_id> <token>``; a longer line is refused whole
MAX_SPARES = 10_000  # a bound on ``spares N`` whatever the dispatcher asks
READY = b"r"  # a spare's one byte once it is connected and waiting for its run


@dataclass(frozen=True)
class Spare:
    """A forked child waiting for its run on its end of a socket pair."""

    pid: int
    end: int  # our end: the run's line goes out, the spare's READY comes in


def _reap(_signum: int = 0, _frame: object = None) -> None:
    """Collect finished children so they do not linger as zombies."""
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return


def _fork_spare(settings: Settings) -> Spare:
    keeper_end, runner_end = keeper_socket_pair() if runs_have_own_uids(settings.runner) else (None, None)
    if keeper_end is not None and runner_end is not None:
        _fork_keeper(settings, keeper_end, runner_end)
        run_scratch.places()  # found once, before the fork: every runner inherits the answer
    ours, theirs = (end.detach() for end in socket.socketpair())
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(ours)
        if keeper_end is not None:
            keeper_end.close()
        _spare(settings, theirs, runner_end)
    os.close(theirs)
    for end in (keeper_end, runner_end):
        if end is not None:
            end.close()
    return Spare(pid, ours)


def _fork_keeper(settings: Settings, keeper_end: socket.socket, runner_end: socket.socket) -> None:
    """Fork the root keeper of the next spare's caches; it serves until the runner's end closes."""
    sys.stderr.flush()
    if os.fork() != 0:
        return
    code = 1
    try:
        runner_end.close()
        _detach()
        # Nothing of the server's but the keeper's socket: a spare's end held here would never give it EOF.
        keep = keeper_end.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        serve(keeper_end, settings)
        code = 0
    except BaseException as exc:  # the child must never return into the server's loop
        print(f"runner fork server cache keeper failed: {exc!r}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)


def _detach() -> None:
    """A forked child's own session, default signals, and stdin/stdout off the server's pipes."""
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # stdout is the launcher's pipe: a child must never write into it
    os.close(devnull)


def _spare(settings: Settings, assignment: int, keeper: socket.socket | None) -> None:
    """In the forked child: become an ordinary runner process, wait for a run, then exit with its code."""
    code = 1
    try:
        _detach()
        from runplane.adapters.tracing import setup_tracing, shutdown_tracing

        setup_tracing("runner", settings.otlp_endpoint)  # imports first: the run's uid may not read them
        try:
            code = asyncio.run(_wait_and_run(settings, assignment, keeper))
        finally:
            shutdown_tracing()
    except BaseException as exc:  # the child must never return into the server's loop
        print(f"runner fork server child failed: {exc!r}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)


async def _wait_and_run(settings: Settings, assignment: int, keeper: socket.socket | None) -> int:
    """Connect to the runner API, say READY and wait for ``<run_id> <token>`` on ``assignment``, then
    run it as the run's user, its prep served by ``keeper`` (the host's caches) when there is one. EOF
    (the server ended) leaves without a run."""
    channel = runner_channel(settings.runner.api_address, connect=True)
    ready = asyncio.create_task(_say_ready(channel, assignment), name="say-ready")
    try:
        line = await _read_line(assignment)
    except BaseException:
        await channel.close(None)
        raise
    finally:
        ready.cancel()  # before the line's fd is closed; a run that came first is cold
        with contextlib.suppress(asyncio.CancelledError):
            await ready
    run_id, token = _parse(line)
    if run_id <= 0:  # the keeper, if any, leaves when this process exits and its end closes
        await channel.close(None)
        return 0
    run_user = lease_for_run(settings.runner, run_id)  # switched to after the claim; the connection stays open
    cache = KeeperClient(keeper) if keeper is not None else None
    return await run(settings, run_id, token, channel=channel, run_user=run_user, cache=cache)


async def _say_ready(channel: grpc.aio.Channel, assignment: int) -> None:
    """READY on ``assignment`` once the connection to the runner API is open: from then on a run
    finds this runner waiting."""
    await channel.channel_ready()
    with contextlib.suppress(OSError):  # the server gone: the spare's read sees EOF
        os.write(assignment, READY)


async def _read_line(fd: int) -> bytes:
    """A line from the server on ``fd``, its end of a socket pair; b"" when the server has gone. It
    may go with this spare's READY unread, and closing a socket with data unread resets it: a reset
    is the end of the server, as end of file is (read as a pipe, it was logged as a fatal error)."""
    loop = asyncio.get_running_loop()
    with socket.socket(fileno=fd) as end:
        end.setblocking(False)
        line = b""
        while not line.endswith(b"\n"):
            try:
                chunk = await loop.sock_recv(end, 4096)
            except ConnectionResetError:
                return b""
            if not chunk:
                break
            line += chunk
        return line


def _parse(line: bytes | bytearray) -> tuple[int, str]:
    """``(run_id, token)`` of a line ``<run_id> <token>``; run_id 0 when it is not one."""
    head, _, token = bytes(line).strip().partition(b" ")
    try:
        run_id = int(head)
    except ValueError:
        return 0, ""
    token = token.strip()
    if run_id <= 0 or not token:
        return 0, ""
    return run_id, token.decode("ascii", errors="replace")


def _read_request(buffer: bytearray) -> int:
    """Read one line from stdin into ``buffer`` byte by byte (nothing read ahead: the next run's line
    stays in the pipe); its length, 0 at EOF, -1 when it is longer than the buffer."""
    length = 0
    with memoryview(buffer) as view:
        while length < len(buffer):
            if os.readv(0, [view[length : length + 1]]) == 0:
                return length
            length += 1
            if buffer[length - 1] == ord("\n"):
                return length
    while os.read(0, 1) not in (b"\n", b""):  # drop the rest of an overlong line
        pass
    return -1


def _run_id(line: memoryview) -> int:
    """The run id of a line ``<run_id> <token>``, 0 when it is not one; the token is not copied."""
    space = bytes(line[:32]).find(b" ")
    if space <= 0 or not any(byte > ord(" ") for byte in line[space + 1 :]):
        return 0
    try:
        return max(0, int(bytes(line[:space])))
    except ValueError:
        return 0


def _hand_over(settings: Settings, spare: Spare, line: memoryview) -> tuple[int, bool]:
    """Give the run's line to the spare (or, if it died, to a child forked for it): the pid that runs
    it (0 if none), and whether that runner was already waiting for it (warm)."""
    waiting = _waiting(spare)
    if _give(spare, line):
        return spare.pid, waiting
    fresh = _fork_spare(settings)  # the spare is gone (killed): fork one for this run
    return (fresh.pid if _give(fresh, line) else 0), False


def _waiting(spare: Spare) -> bool:
    """Whether the spare has said READY (it is connected and waiting), without waiting for it."""
    poller = select.poll()
    poller.register(spare.end, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return os.read(spare.end, 1) == READY  # b"": it died
    except OSError:
        return False


def _give(child: Spare, line: memoryview) -> bool:
    try:
        os.write(child.end, line)
        return True
    except OSError:
        return False
    finally:
        os.close(child.end)


def _spares_line(line: memoryview) -> int:
    """N of a line ``spares N`` (how many runners to keep started and waiting), 0 when it is not one."""
    head, _, count = bytes(line).strip().partition(b" ")
    if head != b"spares" or not count.isdigit():
        return 0
    return min(int(count), MAX_SPARES)


def _resize(settings: Settings, spares: list[Spare], target: int) -> None:
    """Fork spares up to ``target``, or close the sockets of the newest above it (EOF: they leave)."""
    while len(spares) < target:
        spares.append(_fork_spare(settings))
    while len(spares) > target:
        with contextlib.suppress(OSError):
            os.close(spares.pop().end)


def main() -> int:
    settings = Settings()
    logs.configure("runner", fmt=settings.log_format, level=settings.log_level)
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the dispatcher; EOF stops us
    answers = sys.stdout
    target = 1
    spares: list[Spare] = [_fork_spare(settings)]  # oldest first: the longest connected goes first
    answers.write("ready\n")  # everything is imported and a runner waits: a run starts at once
    answers.flush()
    buffer = bytearray(MAX_LINE)
    try:
        while (length := _read_request(buffer)) != 0:
            with memoryview(buffer) as view:
                line = view[: max(length, 0)]
                run_id = _run_id(line)
                if run_id > 0:
                    spare = spares.pop(0) if spares else _fork_spare(settings)
                    pid, warm = _hand_over(settings, spare, line)
                    answers.write(f"{run_id} {pid} {'warm' if warm else 'cold'}\n")
                elif (count := _spares_line(line)) > 0:
                    target = count
                    answers.write(f"spares {target}\n")
                else:
                    print("fork server: expected '<run_id> <token>' or 'spares N'", file=sys.stderr, flush=True)
                    answers.write("0 0 cold\n")  # never echo a token
                line.release()
            buffer[:] = bytes(MAX_LINE)  # the token is gone before the next spare is forked
            answers.flush()
            _resize(settings, spares, target)
    finally:
        for spare in spares:
            with contextlib.suppress(OSError):
                os.close(spare.end)  # EOF: the spare leaves
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
