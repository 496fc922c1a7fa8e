"""Waiting for a condition in a test: one bounded poll, never a bare sleep.

``wait_for`` blocks (for synchronous tests and fixtures); ``eventually`` is its asynchronous twin,
which also accepts a condition that returns an awaitable. Both call ``fetch`` until ``until`` holds
for its value (by default: the value is truthy), return that value, and fail with an
``AssertionError`` naming ``what`` and the last value seen after ``timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

INTERVAL = 0.05


class _Deadline:
    def __init__(self, timeout: float, what: str) -> None:
        self.timeout = timeout
        self.what = what
        self.at = time.monotonic() + timeout

    def check(self, last: object) -> None:
        if time.monotonic() > self.at:
            raise AssertionError(f"timed out after {self.timeout:g} s waiting for {self.what} (last: {last!r})")


def wait_for(
    fetch: Callable[[], T],
    timeout: float,
    *,
    until: Callable[[T], object] = bool,
    interval: float = INTERVAL,
    what: str = "condition",
) -> T:
    """Call ``fetch`` until ``until(value)`` holds; that value, or AssertionError after ``timeout`` s."""
    deadline = _Deadline(timeout, what)
    while True:
        value = fetch()
        if until(value):
            return value
        deadline.check(value)
        time.sleep(interval)


@overload
async def eventually(
    fetch: Callable[[], Awaitable[T]],
    timeout: float,
    *,
    until: Callable[[T], object] = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...
@overload
async def eventually(
    fetch: Callable[[], T],
    timeout: float,
    *,
    until: Callable[[T], object] = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...
async def eventually(fetch: Callable[[], Any], timeout: float, **options: Any) -> Any:
    """``wait_for`` for async tests (same options): the loop keeps running between polls; ``fetch``
    may be async."""
    until, interval, what = _options(**options)
    deadline = _Deadline(timeout, what)
    while True:
        value = fetch()
        if inspect.isawaitable(value):
            value = await value
        if until(value):
            return value
        deadline.check(value)
        await asyncio.sleep(interval)


def _options(
    until: Callable[[Any], object] = bool, interval: float = INTERVAL, what: str = "condition"
) -> tuple[Callable[[Any], object], float, str]:
    return until, interval, what
