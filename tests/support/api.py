"""The API process's servers, started in the test's own process on free ports, and stopped after it.

A test directory's ``api`` fixture starts REST only for the tests that reach it through its
``rest_server`` fixture (``wants_rest``): uvicorn's stop waits out polls of 0.1 s, a cost the
others need not pay.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from api.process import RunningApi, start_server
from runplane.basics.settings import Settings


@contextlib.asynccontextmanager
async def serving_api(settings: Settings, *, rest: bool = True, deliveries: bool = True) -> AsyncIterator[RunningApi]:
    """The servers of the API process (gRPC and, if ``rest``, REST on free ports, the runner API on
    ``settings.api.runner_port``) and, if ``deliveries``, its outgoing webhook deliveries; stopped
    without a drain when the block ends."""
    running = await start_server(settings, port=0, rest_port=None if rest else -1, deliveries=deliveries)
    try:
        yield running
    finally:
        await running.stop(0)


def wants_rest(request: pytest.FixtureRequest) -> bool:
    """Whether the test asks for ``rest_server``: its ``api`` fixture starts REST then."""
    return "rest_server" in request.fixturenames
