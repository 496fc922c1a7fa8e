"""Fixtures for the dispatch tests: service processes that are always stopped, runners included."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from api.server import RunningApi, start_server
from runplane.settings import Settings
from tests.dispatch.processes import Services


@pytest.fixture
async def runner_api(settings: Settings, _cleanup_bus: None) -> AsyncIterator[RunningApi]:
    """The API in this process: the runner API on ``settings.api.runner_port`` for runners to reach."""
    running = await start_server(settings, port=0)
    try:
        yield running
    finally:
        await running.stop(0)


@pytest.fixture
def services(service_env: dict[str, str], tmp_path: Path, database_url: str, _cleanup_bus: None) -> Iterator[Services]:
    env = dict(service_env)
    env.update(
        RUNPLANE_SCHEDULER__INTERVAL="0.2",
        RUNPLANE_DISPATCHER__LAUNCHER="local",
        RUNPLANE_DRAIN_SECONDS="5",
        RUNPLANE_LOG_LEVEL="INFO",
    )
    running = Services(env, tmp_path, database_url)
    try:
        yield running
    finally:
        running.stop_all()
