"""The dispatch decision on its own: run slots, serial execution, CI and merge rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dispatcher.run_slots import ActiveRun, QueuedRun, plan_dispatch
from runplane.basics.types import JobId, JobType, RunId, WaitingReason, ci_schema

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def queued(run_id: int, job_id: int, job_type: JobType = JobType.DEPLOY, pr: int | None = None) -> QueuedRun:
    return QueuedRun(
        run_id=RunId(run_id),
        job_id=JobId(job_id),
        job_type=job_type,
        takes_slot=job_type is not JobType.CI,
        queued_at=T0 + timedelta(seconds=run_id),
        pull_request_number=pr,
    )


def test_free_slots_are_filled_in_order_and_the_rest_wait_for_a_slot() -> None:
    plan = plan_dispatch(2, [ActiveRun(JobId(99), True)], [queued(i, i) for i in range(1, 5)])
    assert [r.run_id for r in plan.start] == [1]
    assert plan.waiting == {2: WaitingReason.NO_RUN_SLOT, 3: WaitingReason.NO_RUN_SLOT, 4: WaitingReason.NO_RUN_SLOT}


def test_a_job_runs_one_run_at_a_time() -> None:
    plan = plan_dispatch(5, [], [queued(1, 7), queued(2, 7), queued(3, 8)])
    assert [r.run_id for r in plan.start] == [1, 3]
    assert plan.waiting == {2: WaitingReason.JOB_ALREADY_RUNNING}
    plan = plan_dispatch(5, [ActiveRun(JobId(7), True)], [queued(4, 7)])
    assert plan.start == [] and plan.waiting == {4: WaitingReason.JOB_ALREADY_RUNNING}


def test_ci_runs_take_no_slot_run_concurrently_in_their_own_schema() -> None:
    runs = [queued(i, 5, JobType.CI, pr=100 + i) for i in range(1, 6)]
    plan = plan_dispatch(1, [ActiveRun(JobId(1), True)], [queued(9, 1), *runs])
    assert [r.run_id for r in plan.start] == [1, 2, 3, 4, 5]
    assert plan.waiting == {9: WaitingReason.JOB_ALREADY_RUNNING}
    assert [plan.schemas[RunId(i)] for i in range(1, 6)] == [f"dbt_cloud_pr_5_{100 + i}" for i in range(1, 6)]
    assert ci_schema(5, None, 42) == "dbt_cloud_pr_5_run_42"


def test_of_several_queued_merge_runs_only_the_newest_runs() -> None:
    plan = plan_dispatch(3, [], [queued(i, 4, JobType.MERGE) for i in range(1, 5)])
    assert [r.run_id for r in plan.start] == [4]
    assert [r.run_id for r in plan.superseded] == [1, 2, 3]
    plan = plan_dispatch(3, [ActiveRun(JobId(4), True)], [queued(5, 4, JobType.MERGE)])
    assert plan.start == [] and plan.waiting == {5: WaitingReason.MERGE_IN_PROGRESS}


def test_no_slots_at_all_still_runs_ci() -> None:
    plan = plan_dispatch(0, [], [queued(1, 1), queued(2, 2, JobType.CI, pr=1)])
    assert [r.run_id for r in plan.start] == [2]
    assert plan.waiting == {1: WaitingReason.NO_RUN_SLOT}
