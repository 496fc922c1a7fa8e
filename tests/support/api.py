"""The API process's servers, started in the test's own process on free ports, and stopped after it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from api.process import RunningApi, start_server
from runplane.basics.settings import Settings


@contextlib.asynccontextmanager
async def serving_api(settings: Settings) -> AsyncIterator[RunningApi]:
    """Every server of the API process (gRPC and REST on free ports, the runner API on
    ``settings.api.runner_port``), stopped without a drain when the block ends."""
    running = await start_server(settings, port=0)
    try:
        yield running
    finally:
        await running.stop(0)
