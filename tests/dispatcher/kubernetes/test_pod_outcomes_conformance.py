"""The same checks on the in-memory ``PodOutcomes`` and on ``PostgresPodOutcomes`` (real Postgres).

Every method is a compare-and-set: a run ends for memory once, only through the Pod recorded on it;
a Pod that failed before its runner claimed the run sends a starting run back to the queue (within
the launch budget) and nothing else; one that failed after the claim ends the run only if it is the
Pod recorded on it; a Pod is live while its run is starting, or running or just
ended on that Pod, and an orphan otherwise.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import pytest

from dispatcher.kubernetes.outcomes import PostgresPodOutcomes
from dispatcher.kubernetes.watch import PodOutcomes
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings
from runplane.basics.types import RunId, RunStatus
from tests.support.pod_outcomes import RecordedOutcomes, TwinRun
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run, run_row

GRACE = 60.0


class Runs(Protocol):
    def add(self, status: RunStatus, pod_name: str = "", ended_ago: float = 0.0) -> RunId: ...

    def status(self, run_id: RunId) -> RunStatus: ...


@dataclass
class TwinRuns:
    twin: RecordedOutcomes

    def add(self, status: RunStatus, pod_name: str = "", ended_ago: float = 0.0) -> RunId:
        run_id = RunId(len(self.twin.runs) + 1)
        finished = time.time() - ended_ago if status >= RunStatus.SUCCESS else None
        self.twin.runs[run_id] = TwinRun(status, pod_name, finished)
        return run_id

    def status(self, run_id: RunId) -> RunStatus:
        return self.twin.runs[run_id].status


@dataclass
class PostgresRuns:
    db: Conn

    def add(self, status: RunStatus, pod_name: str = "", ended_ago: float = 0.0) -> RunId:
        run_id = queue_run(self.db, create_job(self.db, create_account(self.db)))
        make_starting(self.db, run_id)
        self.db.execute(
            "UPDATE runs SET status = %s, pod_name = %s,"
            " finished_at = CASE WHEN %s >= 10 THEN clock_timestamp() - make_interval(secs => %s) END"
            " WHERE id = %s",
            (int(status), pod_name, int(status), ended_ago, run_id),
        )
        return RunId(run_id)

    def status(self, run_id: RunId) -> RunStatus:
        return RunStatus(run_row(self.db, run_id)["status"])


@pytest.fixture(params=["in-memory", "postgres"])
async def subject(
    request: pytest.FixtureRequest, settings: Settings, db: Conn
) -> AsyncIterator[tuple[PodOutcomes, Runs]]:
    if request.param == "in-memory":
        twin = RecordedOutcomes(orphan_grace=GRACE)
        yield twin, TwinRuns(twin)
        return
    k8s = settings.kubernetes.model_copy(update={"orphan_grace_seconds": GRACE})
    pool = await open_pool(settings.database_url)
    try:
        yield PostgresPodOutcomes(pool, settings.model_copy(update={"kubernetes": k8s})), PostgresRuns(db)
    finally:
        await pool.close()


async def test_a_run_ends_for_memory_once_and_only_through_its_own_pod(subject: tuple[PodOutcomes, Runs]) -> None:
    outcomes, runs = subject
    run = runs.add(RunStatus.RUNNING, "pod-a")
    assert await outcomes.memory_limit_exceeded(run, "pod-b") is False  # another Pod of the run
    assert runs.status(run) == RunStatus.RUNNING
    assert await outcomes.memory_limit_exceeded(run, "pod-a") is True
    assert runs.status(run) == RunStatus.ERROR
    assert await outcomes.memory_limit_exceeded(run, "pod-a") is False  # already ended: nothing more


async def test_a_pod_that_failed_before_the_claim_sends_only_a_starting_run_back(
    subject: tuple[PodOutcomes, Runs],
) -> None:
    outcomes, runs = subject
    starting, running = runs.add(RunStatus.STARTING, "pod-s"), runs.add(RunStatus.RUNNING, "pod-r")
    assert await outcomes.failed_before_claim(running, "pod-r", "ImagePullBackOff") is False
    assert runs.status(running) == RunStatus.RUNNING
    assert await outcomes.failed_before_claim(starting, "pod-s", "ImagePullBackOff") is True
    assert runs.status(starting) == RunStatus.QUEUED  # relaunched: the first of its launch attempts
    assert await outcomes.failed_before_claim(starting, "pod-s", "ImagePullBackOff") is False


async def test_a_failed_pod_ends_a_claimed_run_only_when_its_runner_lives_there(
    subject: tuple[PodOutcomes, Runs],
) -> None:
    outcomes, runs = subject
    running, unrecorded = runs.add(RunStatus.RUNNING, "pod-r"), runs.add(RunStatus.RUNNING, "")
    starting = runs.add(RunStatus.STARTING, "pod-s")
    assert await outcomes.runner_pod_failed(running, "pod-old-launch", "Error") is False
    assert await outcomes.runner_pod_failed(unrecorded, "pod-u", "Error") is False  # whose runner, unknown
    assert await outcomes.runner_pod_failed(starting, "pod-s", "Error") is False  # failed_before_claim's
    assert [runs.status(r) for r in (running, unrecorded, starting)] == [RunStatus.RUNNING] * 2 + [RunStatus.STARTING]
    assert await outcomes.runner_pod_failed(running, "pod-r", "Error") is True
    assert runs.status(running) == RunStatus.ERROR
    assert await outcomes.runner_pod_failed(running, "pod-r", "Error") is False  # already ended


async def test_live_pods_are_those_their_runs_still_need(subject: tuple[PodOutcomes, Runs]) -> None:
    outcomes, runs = subject
    starting = runs.add(RunStatus.STARTING, "")
    running = runs.add(RunStatus.RUNNING, "pod-run")
    just_ended = runs.add(RunStatus.SUCCESS, "pod-ended", ended_ago=1)
    long_ended = runs.add(RunStatus.SUCCESS, "pod-old", ended_ago=10 * GRACE)
    pods = [
        (starting, "pod-start-1"),
        (starting, "pod-start-2"),  # between launches: any Pod of a starting run
        (running, "pod-run"),
        (running, "pod-stray"),  # not the Pod its runner lives in
        (just_ended, "pod-ended"),  # its runner is still exiting
        (long_ended, "pod-old"),
        (RunId(10**9), "pod-of-nothing"),
    ]
    assert await outcomes.live_pods(pods) == {"pod-start-1", "pod-start-2", "pod-run", "pod-ended"}
    assert await outcomes.live_pods([]) == set()
