"""An asyncio event loop on simulated time: when nothing is ready to run, the clock jumps to the
next timer instead of waiting for it.

Every ``asyncio.sleep``, ``wait_for`` and ``call_later`` of the code under test then runs on this
clock, so an hour of the protocol takes as long as its decisions do. The loop is deterministic:
ready callbacks run in the order they were scheduled, timers in the order of their times (ties in
the order they were armed), and there is no real I/O to wait for.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import Iterator
from typing import Any


class Deadlock(RuntimeError):
    """Nothing is ready and no timer is armed: the simulated world can never move again."""


class _VirtualSelector(selectors.BaseSelector):
    """A selector with no files to watch: selecting for ``timeout`` moves the loop's clock on."""

    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}
        self.now = 0.0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._map[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._map.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("no task can run and no timer is armed")
        self.now += max(0.0, timeout)
        return []

    def get_map(self) -> Any:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """``loop.time()`` is simulated seconds since the loop was made."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


class _TasksInOrder(dict[asyncio.Task[Any], None]):
    """A set of tasks that iterates in the order they were added (``set`` iterates in address order,
    which differs from run to run)."""

    def add(self, task: asyncio.Task[Any]) -> None:
        self[task] = None

    def discard(self, task: asyncio.Task[Any]) -> None:
        self.pop(task, None)


class OrderedTaskGroup(asyncio.TaskGroup):
    """``asyncio.TaskGroup`` that cancels its tasks in the order they were created, so a group that
    aborts (a leader stepping down, a worker stopping) wakes them in the same order every run."""

    def __init__(self) -> None:
        super().__init__()
        vars(self)["_tasks"] = _TasksInOrder()  # typeshed calls it a set; any add/discard container will do


@contextlib.contextmanager
def ordered_task_groups() -> Iterator[None]:
    """While inside: ``asyncio.TaskGroup()`` makes an ``OrderedTaskGroup``."""
    original = asyncio.TaskGroup
    vars(asyncio)["TaskGroup"] = OrderedTaskGroup
    try:
        yield
    finally:
        vars(asyncio)["TaskGroup"] = original
