"""The same checks on the in-memory launcher the dispatcher tests use and on the real local one.

A launch answers with the launcher's cluster and a place of its own per run; a request without a
run token is refused for good (no retry can mend it); closing twice is harmless. The local launcher
really starts each runner (through the runner API on the real Postgres), and the run succeeds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

import pytest

from api.process import RunningApi
from dispatcher.launcher import Launcher, LaunchRequest
from dispatcher.local_launcher import LocalLauncher
from runplane.basics.errors import LaunchError
from runplane.basics.settings import Settings
from runplane.basics.types import AccountId, JobId, RunId, RunStatus
from tests.support.launchers import HoldingLauncher
from tests.support.polling import eventually
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run, run_row


@dataclass
class Subject:
    launcher: Launcher
    cluster: str
    settled: Callable[[RunId], Awaitable[None]]  # the launched run has done what it will do


def starting_run(db: Conn) -> LaunchRequest:
    run_id = queue_run(db, create_job(db, create_account(db), steps=["echo launched"]))
    token = make_starting(db, run_id)
    row = run_row(db, run_id)
    return LaunchRequest(RunId(run_id), JobId(row["job_id"]), AccountId(row["account_id"]), 1, 1024, 0, token=token)


@pytest.fixture(params=["in-memory", "local"])
async def subject(
    request: pytest.FixtureRequest, settings: Settings, db: Conn, runner_api: RunningApi
) -> AsyncIterator[Subject]:
    """Either launcher; the runner API runs for both, so the checks are the only difference."""
    cluster = settings.dispatcher.cluster
    if request.param == "in-memory":

        async def nothing_to_wait_for(_run_id: RunId) -> None:
            return None

        yield Subject(HoldingLauncher(cluster=cluster), cluster, nothing_to_wait_for)
        return
    local = LocalLauncher(settings)
    await local.start()

    async def succeeded(run_id: RunId) -> None:
        row = await eventually(lambda: run_row(db, run_id), 15, until=lambda r: r["status"] >= RunStatus.SUCCESS)
        assert row["status"] == RunStatus.SUCCESS, row["status_message"]

    try:
        yield Subject(local, cluster, succeeded)
    finally:
        await local.close()


async def test_a_launch_names_its_cluster_and_a_place_of_its_own(subject: Subject, db: Conn) -> None:
    first, second = starting_run(db), starting_run(db)
    launched = [await subject.launcher.launch(first), await subject.launcher.launch(second)]
    assert [result.cluster for result in launched] == [subject.cluster] * 2
    assert all(result.pod_name for result in launched)
    assert launched[0].pod_name != launched[1].pod_name
    await subject.settled(first.run_id)
    await subject.settled(second.run_id)


async def test_a_request_without_a_token_is_refused_for_good(subject: Subject, db: Conn) -> None:
    request = replace(starting_run(db), token="")
    with pytest.raises(LaunchError) as refused:
        await subject.launcher.launch(request)
    assert refused.value.retryable is False
    assert run_row(db, request.run_id)["status"] == RunStatus.STARTING  # nothing was started


async def test_closing_twice_is_harmless(subject: Subject) -> None:
    await subject.launcher.close()
    await subject.launcher.close()
    assert isinstance(subject.launcher.name, str) and subject.launcher.name
