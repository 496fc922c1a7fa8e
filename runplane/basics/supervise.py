"""Running a service: named, supervised tasks, waiting on events, and a bounded drain on SIGTERM.

Every background task runs in one ``asyncio.TaskGroup``: a task that dies unexpectedly cancels the
others and the process exits non-zero; so does a loop spawned ``eternal`` that returns before the
stop event is set (a loop that quietly ends would leave the process running without it).
SIGTERM/SIGINT set the stop event; the service has ``drain_seconds`` to finish before its tasks are
cancelled. :func:`wait_any` is the one way to wait for the stop event, other events, or a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from runplane.basics.errors import RunplaneError

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
    await wait_any(stop, task)
    if task.done():
        task.result()  # re-raise a crash
        return
    log.info("stopping", extra={"service": name, "drain_seconds": drain_seconds})
    try:
        await asyncio.wait_for(task, timeout=drain_seconds)
    except TimeoutError:
        log.warning("drain timed out; cancelling", extra={"service": name})


class TaskEnded(RunplaneError):
    """A background task meant to run until the stop event returned before it was set."""


def spawn(
    group: asyncio.TaskGroup,
    name: str,
    coro: Coroutine[Any, Any, None],
    *,
    eternal: bool = False,
    stop: asyncio.Event | None = None,
) -> asyncio.Task[None]:
    """A named task in ``group``; its failure stops the whole group (and the process).

    ``eternal``: the task is a loop that runs until ``stop`` is set; returning earlier is a failure
    too (:class:`TaskEnded`).
    """
    if eternal and stop is None:
        raise ValueError(f"eternal task {name!r} needs the stop event it runs until")

    async def guarded() -> None:
        try:
            await coro
            if eternal and stop is not None and not stop.is_set():
                raise TaskEnded(f"background task {name} returned before the service was stopped")
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("background task died", extra={"task": name})
            raise

    return group.create_task(guarded(), name=name)


async def wait_any(
    stop: asyncio.Event, *events: asyncio.Event | asyncio.Future[Any], timeout: float | None = None
) -> bool:
    """Wait until ``stop`` or one of ``events`` is set (a future: done), or ``timeout`` seconds pass.

    True when ``stop`` is set. Futures passed in are left as they are; the waiters made here are
    cancelled before returning.
    """
    if stop.is_set() or any(event.is_set() if isinstance(event, asyncio.Event) else event.done() for event in events):
        return stop.is_set()
    own = [asyncio.ensure_future(event.wait()) for event in (stop, *events) if isinstance(event, asyncio.Event)]
    waiters = {*own, *(event for event in events if not isinstance(event, asyncio.Event))}
    try:
        await asyncio.wait(
            waiters, timeout=None if timeout is None else max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for waiter in own:
            waiter.cancel()
    return stop.is_set()


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; True when stop was set meanwhile."""
    return await wait_any(stop, timeout=seconds)
