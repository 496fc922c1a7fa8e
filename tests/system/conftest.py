"""Fixtures for the end-to-end tests: service processes that are always stopped, runners included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import Services
from tests.support.reports import failed

LOG_TAIL_LINES = 60


@pytest.fixture
def services(
    request: pytest.FixtureRequest, service_env: dict[str, str], tmp_path: Path, database_url: str, _cleanup_bus: None
) -> Iterator[Services]:
    env = dict(service_env)
    env.update(
        RUNPLANE_SCHEDULER__INTERVAL="0.2",
        RUNPLANE_DISPATCHER__LAUNCHER="local",
        RUNPLANE_DRAIN_SECONDS="5",
        RUNPLANE_LOG_LEVEL="INFO",
        # Steps here write into the test's tmp_path (root's, private), so runners keep the test's
        # user; test_runner_isolation.py removes this and runs with the default, a uid per run.
        RUNPLANE_RUNNER__LOCAL_UID="-1",
    )
    running = Services(env, tmp_path, database_url)
    try:
        yield running
    finally:
        running.stop_all()
        if failed(request):  # the services' own account of what happened, beside the failure
            for name, _ in running.processes:
                lines = running.log_text(name).splitlines()[-LOG_TAIL_LINES:]
                print(f"---- {name}.log (last {len(lines)} lines) ----", *lines, sep="\n")
