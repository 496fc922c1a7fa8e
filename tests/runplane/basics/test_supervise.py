"""Supervision helpers: an eternal task that returns early stops its group; wait_any."""

from __future__ import annotations

import asyncio

import pytest

from runplane.basics.supervise import TaskEnded, spawn, wait_any


async def test_an_eternal_task_that_returns_before_stop_fails_its_group() -> None:
    stop = asyncio.Event()

    async def quits() -> None:
        return

    async def waits() -> None:
        await stop.wait()

    with pytest.raises(ExceptionGroup) as caught:
        async with asyncio.TaskGroup() as group:
            spawn(group, "quits", quits(), eternal=True, stop=stop)
            spawn(group, "waits", waits())
    assert caught.group_contains(TaskEnded)


async def test_an_eternal_task_may_return_once_stop_is_set() -> None:
    stop = asyncio.Event()

    async def loop() -> None:
        await stop.wait()

    async with asyncio.TaskGroup() as group:
        spawn(group, "loop", loop(), eternal=True, stop=stop)
        stop.set()


def test_an_eternal_task_needs_its_stop_event() -> None:
    async def work() -> None:
        return

    coro = work()
    with pytest.raises(ValueError, match="stop event"):
        spawn(asyncio.TaskGroup(), "work", coro, eternal=True)
    coro.close()


async def test_wait_any_says_whether_stop_was_set() -> None:
    stop, other = asyncio.Event(), asyncio.Event()
    assert await wait_any(stop, other, timeout=0.01) is False  # the timeout
    other.set()
    assert await wait_any(stop, other) is False  # another event, no timeout needed
    stop.set()
    assert await wait_any(stop, timeout=None) is True


async def test_wait_any_wakes_on_a_future_and_leaves_it_alone() -> None:
    stop = asyncio.Event()
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(future.set_result, 7)
    assert await wait_any(stop, future) is False
    assert future.result() == 7
    pending: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    assert await wait_any(stop, pending, timeout=0.01) is False
    assert not pending.cancelled()
    pending.cancel()


async def test_wait_any_wakes_when_stop_is_set_later() -> None:
    stop, never = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().call_soon(stop.set)
    assert await wait_any(stop, never) is True
