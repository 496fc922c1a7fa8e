"""Executing one step: ``/bin/sh -c`` in its own process group, watched until it ends; if the
runner dies the group dies with it (see ``_GUARD``).

While the step runs, its output goes to a callback as it comes, and every ``sample_interval`` the
watcher checks, in this order: cancellation requested, the run's deadline, and the resident memory
of the whole process tree against the limit (SIGKILL at once, as the kernel's OOM killer would).
Cancel and timeout stop the group in three stages: SIGINT (dbt cancels its open warehouse queries
and writes its artifacts), SIGTERM after ``interrupt_grace`` seconds, SIGKILL after a further
``cancel_grace``. Whatever the end, nothing of the group is left running, and the result says which
signal ended it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import psutil


class StepEnd(enum.Enum):
    EXITED = "exited"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    MEMORY_LIMIT = "memory_limit"
    DISK_QUOTA = "disk_quota"  # the run's scratch space was full when the step failed
    ABANDONED = "abandoned"  # the runner lost its lease: stop without an outcome


@dataclass(frozen=True)
class StepResult:
    end: StepEnd
    exit_code: int | None
    end_reason: str = ""  # "" when the step ended by itself; else e.g. "SIGINT", "SIGKILL after SIGINT, SIGTERM"


@dataclass
class StepControl:
    """What the runner tells a running step; set from the lease/poll task."""

    cancel_requested: bool = False
    abandoned: bool = False


@dataclass(frozen=True)
class Limits:
    deadline: float | None  # time.monotonic() at which the run times out
    memory_bytes: int | None
    cancel_grace: float  # seconds from SIGTERM to SIGKILL
    interrupt_grace: float = 10.0  # seconds from SIGINT to SIGTERM
    sample_interval: float = 0.2
    # The argv a step's command is appended to: the run's namespaces (``runner.sandbox``); () for none.
    confinement: tuple[str, ...] = ()
    # How many of the run's processes the kernel killed for the run cgroup's memory limit so far.
    oom_kills: Callable[[], int] | None = None
    # Awaited before each read of a step's output: the step blocks on its pipe while what it wrote
    # waits to be shipped (``runner.run_logs``).
    output_room: Callable[[], Awaitable[None]] | None = None
    # Whether the run's scratch space (its /tmp and the other shared places) is out of room.
    scratch_full: Callable[[], bool] | None = None


def tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants, in bytes."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += process.memory_info().rss
    return total


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# The guard leads a step's process group (a group joins only a group of its own session, so not a
# session of its own). It holds the read end of a pipe whose write
# end only this runner holds; when the runner dies, even by SIGKILL, the kernel closes that end, the
# guard's read returns and it kills its whole group: the step and everything it started die with
# the runner instead of outliving it. It ignores SIGTERM so a graceful cancel keeps it watching.
_GUARD = "trap '' TERM INT HUP; read -r _; kill -s KILL 0"


async def _start_guard(cwd: str) -> tuple[asyncio.subprocess.Process, int]:
    """Start a guard; its process (its pid is the step's process group) and its lifeline's write end."""
    read_end, write_end = os.pipe()  # both close-on-exec: no step inherits the write end
    try:
        guard = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", _GUARD, cwd=cwd, stdin=read_end, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, process_group=0,
        )  # fmt: skip
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return guard, write_end


def _steps_can_be_interrupted() -> None:
    """Let the steps this process starts receive SIGINT (dbt cancels its warehouse queries on it).

    A process started with SIGINT ignored (by ``nohup``, or ``&`` in a script) passes that on
    through every exec, and no shell can undo it, so a cancel would wait out the grace and end in
    SIGTERM. A handled signal is not inherited: this process takes Python's usual one instead.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


async def run_step(
    command: str,
    *,
    cwd: str,
    env: Mapping[str, str],
    on_output: Callable[[bytes], None],
    control: StepControl,
    limits: Limits,
) -> StepResult:
    _steps_can_be_interrupted()
    guard, lifeline = await _start_guard(cwd)
    oom_kills_before = limits.oom_kills() if limits.oom_kills is not None else 0
    try:
        process = await asyncio.create_subprocess_exec(
            *limits.confinement,
            "/bin/sh",
            "-c",
            command,
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            # The guard's process group: signals reach everything the step started, and the guard
            # kills all of it if this runner dies.
            process_group=guard.pid,
        )
    except BaseException:
        _signal_group(guard.pid, signal.SIGKILL)
        os.close(lifeline)
        await guard.wait()
        raise
    pgid = guard.pid
    assert process.stdout is not None
    stdout = process.stdout

    async def pump() -> None:
        while True:
            if limits.output_room is not None:
                await limits.output_room()
            chunk = await stdout.read(65536)
            if not chunk:
                return
            on_output(chunk)

    reader = asyncio.create_task(pump(), name=f"step:{pgid}:output")
    end = StepEnd.EXITED
    sent: list[signal.Signals] = []
    try:
        end = await _watch(process, pgid, control, limits, sent)
        exit_code = await process.wait()
        if end is StepEnd.EXITED and exit_code != 0 and limits.oom_kills and limits.oom_kills() > oom_kills_before:
            end = StepEnd.MEMORY_LIMIT  # the kernel killed a process of the step for the run's memory limit
        elif end is StepEnd.EXITED and exit_code != 0 and limits.scratch_full and limits.scratch_full():
            end = StepEnd.DISK_QUOTA  # a write of the step got ENOSPC from the run's scratch space
    finally:
        _signal_group(pgid, signal.SIGKILL)  # anything the step left in the background, and the guard
        os.close(lifeline)
        if process.returncode is None:
            await process.wait()
        await guard.wait()
        # The pipe closes when the last holder of it is gone; the group was just killed.
        try:
            await asyncio.wait_for(reader, timeout=5)
        except TimeoutError:
            reader.cancel()
    return StepResult(end, exit_code if end is StepEnd.EXITED else None, _end_reason(exit_code, sent))


def _end_reason(exit_code: int, sent: list[signal.Signals]) -> str:
    """Which signal ended the step, and what was sent before it."""
    if exit_code < 0:
        killed_by = signal.Signals(-exit_code).name
        before = [s.name for s in sent if s.name != killed_by]
        return f"{killed_by} after {', '.join(before)}" if before else killed_by
    if sent:
        return f"exited with code {exit_code} after {', '.join(s.name for s in sent)}"
    return ""


async def _watch(
    process: asyncio.subprocess.Process, pgid: int, control: StepControl, limits: Limits, sent: list[signal.Signals]
) -> StepEnd:
    waiter = asyncio.ensure_future(process.wait())
    try:
        while True:
            done, _ = await asyncio.wait({waiter}, timeout=limits.sample_interval)
            if done:
                return StepEnd.EXITED
            if control.abandoned:
                sent.append(signal.SIGKILL)
                _signal_group(pgid, signal.SIGKILL)
                return StepEnd.ABANDONED
            if control.cancel_requested:
                await _stop(waiter, pgid, limits, sent)
                return StepEnd.CANCELLED
            if limits.deadline is not None and time.monotonic() >= limits.deadline:
                await _stop(waiter, pgid, limits, sent)
                return StepEnd.TIMED_OUT
            if limits.memory_bytes is not None and tree_rss(process.pid) > limits.memory_bytes:
                sent.append(signal.SIGKILL)
                _signal_group(pgid, signal.SIGKILL)
                return StepEnd.MEMORY_LIMIT
    finally:
        if not waiter.done():
            waiter.cancel()


async def _stop(waiter: asyncio.Future[int], pgid: int, limits: Limits, sent: list[signal.Signals]) -> None:
    """SIGINT to the group, then SIGTERM and SIGKILL each after its grace period if still there."""
    for sig, grace in (
        (signal.SIGINT, limits.interrupt_grace),
        (signal.SIGTERM, limits.cancel_grace),
        (signal.SIGKILL, 0.0),
    ):
        sent.append(sig)
        _signal_group(pgid, sig)
        if sig is signal.SIGKILL:
            return
        done, _ = await asyncio.wait({waiter}, timeout=grace)
        if done:
            return
