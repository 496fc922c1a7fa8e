"""Running a service: named, supervised tasks and a bounded drain on SIGTERM.

Every background task runs in one ``asyncio.TaskGroup``: a task that dies unexpectedly cancels the
others and the process exits non-zero. SIGTERM/SIGINT set the stop event; the service has
``drain_seconds`` to finish before its tasks are cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

Service = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


def install_signal_handlers(stop: asyncio.Event) -> None:
    """Only entry points call this."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def run_until_stopped(name: str, service: Service, *, drain_seconds: float) -> None:
    """Run ``service(stop)``; on a signal, give it ``drain_seconds`` to return."""
    stop = asyncio.Event()
    install_signal_handlers(stop)
    task = asyncio.create_task(service(stop), name=name)
    stop_wait = asyncio.create_task(stop.wait(), name=f"{name}:signals")
    done, _ = await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        stop_wait.cancel()
        task.result()  # re-raise a crash
        return
    log.info("stopping", extra={"service": name, "drain_seconds": drain_seconds})
    try:
        await asyncio.wait_for(task, timeout=drain_seconds)
    except TimeoutError:
        log.warning("drain timed out; cancelling", extra={"service": name})


def spawn(group: asyncio.TaskGroup, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """A named task in ``group``; its failure stops the whole group (and the process)."""

    async def guarded() -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("background task died", extra={"task": name})
            raise

    return group.create_task(guarded(), name=name)


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; True when stop was set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))
    except TimeoutError:
        return False
    return True
