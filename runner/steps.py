"""Executing one step: ``/bin/sh -c`` in its own process group, watched until it ends.

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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psutil


class StepEnd(enum.Enum):
    EXITED = "exited"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    MEMORY_LIMIT = "memory_limit"
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


async def run_step(
    command: str,
    *,
    cwd: str,
    env: Mapping[str, str],
    on_output: Callable[[bytes], None],
    control: StepControl,
    limits: Limits,
) -> StepResult:
    process = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group: signals reach everything it started
    )
    pgid = process.pid
    assert process.stdout is not None
    stdout = process.stdout

    async def pump() -> None:
        while chunk := await stdout.read(65536):
            on_output(chunk)

    reader = asyncio.create_task(pump(), name=f"step:{pgid}:output")
    end = StepEnd.EXITED
    sent: list[signal.Signals] = []
    try:
        end = await _watch(process, pgid, control, limits, sent)
        exit_code = await process.wait()
    finally:
        _signal_group(pgid, signal.SIGKILL)  # anything the step left in the background
        if process.returncode is None:
            await process.wait()
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
