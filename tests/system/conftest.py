"""Fixtures for the end-to-end tests: service processes that are always stopped, runners included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import Services


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
