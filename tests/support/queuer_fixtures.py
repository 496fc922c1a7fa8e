"""The ``queuers`` fixture: real orchestrator and queuer worker processes on this test's database and
bus, stopped after the test (their logs printed when it failed). Loaded by the root conftest."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

from runplane.basics.settings import Settings
from tests.support.reports import failed

if TYPE_CHECKING:  # imported by the fixture: a test process that starts no queuer does not load it
    from tests.support.queuer import Cluster, Db


@pytest.fixture
async def queuers(
    request: pytest.FixtureRequest, settings: Settings, service_env: dict[str, str], db: Db
) -> AsyncIterator[Cluster]:
    from tests.support.queuer import Cluster

    c = Cluster(settings, service_env)
    try:
        yield c
    finally:
        await c.cleanup(db, print_logs=failed(request))
