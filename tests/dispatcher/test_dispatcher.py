"""One dispatcher in this process, on the real Postgres and Redis: what a pickup does to an account."""

from __future__ import annotations

import pytest

from dispatcher.launcher import LaunchRequest, LaunchResult
from dispatcher.service import Dispatcher
from runplane.adapters.db import Pool, open_pool
from runplane.adapters.locks import RedisAccountLocks
from runplane.basics.errors import LaunchError
from runplane.basics.settings import Settings
from runplane.basics.types import AccountId, RunStatus
from tests.support.launchers import HoldingLauncher
from tests.support.records import Conn, create_account, create_job, queue_run, rows, run_row, statuses


async def pickup(settings: Settings, locks: RedisAccountLocks, launcher: HoldingLauncher, account: int) -> list[int]:
    pool = await open_pool(settings.database_url)
    try:
        dispatcher = Dispatcher(settings, pool, None, locks, launcher)
        return [s.run_id for s in await dispatcher.dispatch([AccountId(account)])]
    finally:
        await pool.close()


async def test_runs_fill_free_slots_and_the_rest_wait_for_one(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    account = create_account(db, run_slots=2, memory_mb=512)
    runs = [queue_run(db, create_job(db, account, name=f"job {i}", timeout_seconds=30)) for i in range(5)]
    launcher = HoldingLauncher()
    assert await pickup(settings, locks, launcher, account) == runs[:2]
    assert [(r.run_id, r.memory_mb, r.timeout_seconds, r.attempt) for r in launcher.requests] == [
        (runs[0], 512, 30, 1),
        (runs[1], 512, 30, 1),
    ]
    started = [run_row(db, r) for r in runs[:2]]
    assert [(r["status"], r["pod_name"], r["launch_attempts"]) for r in started] == [
        (RunStatus.STARTING, f"held-{runs[0]}", 1),
        (RunStatus.STARTING, f"held-{runs[1]}", 1),
    ]
    assert all(r["dispatched_at"] is not None for r in started)
    assert [run_row(db, r)["waiting_reason"] for r in runs[2:]] == ["no_run_slot"] * 3
    # A second pickup while both slots are busy starts nothing.
    assert await pickup(settings, locks, launcher, account) == []


async def test_a_job_runs_serially_and_its_next_run_says_why_it_waits(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    account = create_account(db, run_slots=5)
    job = create_job(db, account)
    first, second = queue_run(db, job), queue_run(db, job, trigger="api")
    assert await pickup(settings, locks, HoldingLauncher(), account) == [first]
    assert run_row(db, second)["waiting_reason"] == "job_already_running"


async def test_ci_runs_start_together_outside_the_slots_each_in_its_own_schema(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    account = create_account(db, run_slots=1)
    busy = queue_run(db, create_job(db, account), status=3)
    ci_job = create_job(db, account, job_type="ci")
    runs = [queue_run(db, ci_job, trigger="ci", pull_request_number=pr) for pr in range(101, 106)]
    assert await pickup(settings, locks, HoldingLauncher(), account) == runs
    schemas = [run_row(db, r)["schema_name"] for r in runs]
    assert schemas == [f"dbt_cloud_pr_{ci_job}_{pr}" for pr in range(101, 106)]
    assert run_row(db, busy)["status"] == RunStatus.RUNNING


async def test_of_four_queued_merge_runs_the_newest_runs_and_the_rest_are_cancelled(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    account = create_account(db, run_slots=3)
    job = create_job(db, account, job_type="merge")
    runs = [queue_run(db, job, trigger="merge") for _ in range(4)]
    assert await pickup(settings, locks, HoldingLauncher(), account) == [runs[-1]]
    older = [run_row(db, r) for r in runs[:3]]
    assert [r["status"] for r in older] == [RunStatus.CANCELLED] * 3
    assert all("superseded by a newer merge run" in r["status_message"] for r in older)
    assert all(r["finished_at"] is not None for r in older)


async def test_a_pickup_for_a_locked_account_changes_nothing(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    account = create_account(db)
    run_id = queue_run(db, create_job(db, account))
    held = await locks.acquire([account])
    assert held.accounts == [account]
    try:
        assert await pickup(settings, locks, HoldingLauncher(), account) == []
        assert run_row(db, run_id)["status"] == RunStatus.QUEUED
    finally:
        await held.release()
    assert await pickup(settings, locks, HoldingLauncher(), account) == [run_id]


async def test_a_failed_launch_is_retried_with_backoff_then_fails_the_run(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    settings.scheduler.launch_attempts = 2
    settings.scheduler.launch_backoff = 0.01
    account = create_account(db)
    run_id = queue_run(db, create_job(db, account))
    launcher = HoldingLauncher(fail_with=LaunchError("no capacity", retryable=True))
    assert await pickup(settings, locks, launcher, account) == [run_id]
    row = run_row(db, run_id)
    assert (row["status"], row["launch_attempts"], row["waiting_reason"]) == (RunStatus.QUEUED, 1, "launch_backoff")
    assert row["not_before"] is not None and row["dispatched_at"] is None
    assert "no capacity" in row["status_message"]
    db.execute("UPDATE runs SET not_before = now() - interval '1 s' WHERE id = %s", (run_id,))
    assert await pickup(settings, locks, launcher, account) == [run_id]
    row = run_row(db, run_id)
    assert (row["status"], row["launch_attempts"]) == (RunStatus.ERROR, 2)
    assert row["status_message"] == "launch failed after 2 attempts: no capacity"
    assert statuses(db, [run_id]) == {run_id: RunStatus.ERROR}
    assert [r.attempt for r in launcher.requests] == [1, 2]
    assert rows(db, "SELECT count(*) AS n FROM runs") == [{"n": 1}]  # no retry budget on the job


def test_the_launcher_is_chosen_by_name(settings: Settings) -> None:
    from dispatcher.launcher_choice import companion, intake_gate, make_launcher
    from dispatcher.local_launcher import LocalLauncher
    from dispatcher.noop_launcher import NoopLauncher
    from runplane.basics.errors import InvalidArgument

    pool = Pool(settings.database_url, open=False)  # kept by a launcher, never used here
    assert isinstance(make_launcher(settings, pool), LocalLauncher)
    settings.dispatcher.launcher = "noop"
    assert isinstance(make_launcher(settings, pool), NoopLauncher)
    assert companion(settings, pool) is None
    assert intake_gate(settings, None) is None
    settings.dispatcher.launcher = "ssh"
    with pytest.raises(InvalidArgument, match="unknown launcher 'ssh'"):
        make_launcher(settings, pool)


class EndingLauncher(HoldingLauncher):
    """Its runners are quick: each run has ended (or was sent back to the queue) before ``launch`` returns,
    so before the dispatcher records where the runs went."""

    def __init__(self, db: Conn, requeue: set[int]) -> None:
        super().__init__()
        self.db = db
        self.requeue = requeue

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        result = await super().launch(request)
        if request.run_id in self.requeue:  # as the reaper does when a runner never claimed it
            self.db.execute("UPDATE runs SET status = 1, dispatched_at = NULL WHERE id = %s", (request.run_id,))
        else:
            self.db.execute(
                "UPDATE runs SET status = 10, started_at = now(), finished_at = now() WHERE id = %s", (request.run_id,)
            )
        return result


async def test_a_run_that_ended_before_its_launch_was_recorded_still_says_where_it_ran(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    account = create_account(db, run_slots=3)
    quick, requeued = (queue_run(db, create_job(db, account, name=f"job {i}")) for i in range(2))
    launcher = EndingLauncher(db, requeue={requeued})
    assert sorted(await pickup(settings, locks, launcher, account)) == [quick, requeued]
    assert (run_row(db, quick)["status"], run_row(db, quick)["pod_name"]) == (RunStatus.SUCCESS, f"held-{quick}")
    assert run_row(db, quick)["cluster"] == "test"
    # Back in the queue: its launch is forgotten, and its next one is recorded when it comes.
    assert (run_row(db, requeued)["status"], run_row(db, requeued)["pod_name"]) == (RunStatus.QUEUED, "")
