"""Overlap policy and jitter, reattaching triggers, pause notes and skipped occurrences through the
gRPC and REST doors of the API served in this process, on the real Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import grpc
import pytest

from api.process import RunningApi
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings
from runplane.basics.types import FailureKind, Outcome
from runplane.runs.finish import finish_run
from runplane.runs.retries import RetryPolicy
from runplane.v1 import jobs_pb2, runs_pb2
from tests.api.conftest import AsyncDb, Client, Rest, connect, deploy_job, scalar, status_of


@pytest.fixture
async def same(api: RunningApi, rest: Rest) -> AsyncIterator[Client]:
    """A gRPC client of the REST client's account: both doors on the same jobs."""
    async with connect(api, rest.token, rest.account_id) as client:
        yield client


async def test_overlap_policy_and_jitter_are_set_read_and_checked_over_grpc(client: Client, adb: AsyncDb) -> None:
    settings = jobs_pb2.JobSettings(
        missed_run_grace_seconds=-1, overlap_policy=jobs_pb2.OVERLAP_POLICY_SKIP, jitter_seconds=45
    )
    created = await client.jobs.CreateJob(deploy_job(settings=settings))
    assert created.settings.overlap_policy == jobs_pb2.OVERLAP_POLICY_SKIP
    assert created.settings.jitter_seconds == 45
    assert await scalar(adb, "SELECT overlap_policy || ':' || jitter_seconds FROM jobs WHERE id = %s", created.id) == (
        "skip:45"
    )
    # Unset is serial, the default every job had before.
    plain = await client.jobs.CreateJob(deploy_job())
    assert plain.settings.overlap_policy == jobs_pb2.OVERLAP_POLICY_SERIAL and plain.settings.jitter_seconds == 0
    too_much = deploy_job(settings=jobs_pb2.JobSettings(missed_run_grace_seconds=-1, jitter_seconds=3601))
    code, message = await status_of(client.jobs.CreateJob(too_much))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "settings.jitter_seconds" in message
    unknown = deploy_job(
        settings=jobs_pb2.JobSettings(missed_run_grace_seconds=-1, overlap_policy=jobs_pb2.OverlapPolicy.ValueType(99))
    )
    code, message = await status_of(client.jobs.CreateJob(unknown))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "settings.overlap_policy" in message


async def test_overlap_policy_and_jitter_are_runplane_fields_over_rest(rest: Rest) -> None:
    body = {
        "name": "hourly",
        "execute_steps": ["echo hello"],
        "job_type": "scheduled",
        "triggers": {"schedule": True},
        "schedule": {"cron": "0 * * * *"},
        "runplane": {"overlap_policy": "buffer_one", "jitter_seconds": 30},
    }
    created = await rest.http.post(f"{rest.base}/jobs/", json=body)
    assert created.status_code == 200, created.text
    job = created.json()["data"]
    assert (job["runplane"]["overlap_policy"], job["runplane"]["jitter_seconds"]) == ("buffer_one", 30)
    # An update that does not name them keeps them.
    del body["runplane"]
    kept = await rest.http.post(f"{rest.base}/jobs/{job['id']}/", json={**body, "name": "renamed"})
    assert kept.status_code == 200, kept.text
    assert (kept.json()["data"]["runplane"]["overlap_policy"], kept.json()["data"]["runplane"]["jitter_seconds"]) == (
        "buffer_one",
        30,
    )
    refused = await rest.http.post(f"{rest.base}/jobs/", json={**body, "runplane": {"overlap_policy": "sometimes"}})
    assert refused.status_code == 400, refused.text


async def test_a_reattaching_trigger_answers_the_run_in_progress_with_the_same_overrides(
    same: Client, rest: Rest, adb: AsyncDb
) -> None:
    job = await same.jobs.CreateJob(deploy_job())
    first = await same.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, cause="first"))
    assert not first.reattached
    again = await same.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, cause="again", reattach=True))
    assert (again.id, again.reattached) == (first.id, True)
    # Other overrides are another run; so is a trigger that does not ask to reattach.
    other = await same.runs.TriggerRun(
        runs_pb2.TriggerRunRequest(job_id=job.id, reattach=True, overrides=runs_pb2.RunOverrides(threads=3))
    )
    plain = await same.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    assert len({first.id, other.id, plain.id}) == 3 and not other.reattached and not plain.reattached
    # A run that ended is not reattached to: the newest one in progress with those overrides is.
    await adb.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (first.id,))
    over_rest = await rest.http.post(f"{rest.base}/jobs/{job.id}/run/", json={"runplane": {"reattach": True}})
    assert over_rest.status_code == 200, over_rest.text
    assert (over_rest.json()["data"]["id"], over_rest.json()["data"]["reattached"]) == (plain.id, True)
    fresh = await rest.http.post(f"{rest.base}/jobs/{job.id}/run/", json={"cause": "no reattach"})
    assert fresh.json()["data"]["reattached"] is False and fresh.json()["data"]["id"] not in {plain.id, first.id}
    assert await scalar(adb, "SELECT count(*) FROM runs WHERE job_id = %s", job.id) == 4


async def test_a_pause_keeps_who_and_why_on_every_door_and_an_unpause_clears_them(same: Client, rest: Rest) -> None:
    job = await same.jobs.CreateJob(deploy_job())
    paused = await same.jobs.PauseJob(jobs_pb2.PauseJobRequest(job_id=job.id, note="warehouse migration"))
    assert paused.paused and paused.pause_note == "warehouse migration"
    assert paused.paused_by.startswith("token #")
    unpaused = await same.jobs.UnpauseJob(jobs_pb2.UnpauseJobRequest(job_id=job.id))
    assert (unpaused.paused, unpaused.paused_by, unpaused.pause_note) == (False, "", "")
    code, message = await status_of(same.jobs.PauseJob(jobs_pb2.PauseJobRequest(job_id=job.id, note="x" * 1001)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "note" in message

    over_rest = await rest.http.post(f"{rest.base}/jobs/{job.id}/pause/", json={"note": "source is late"})
    assert over_rest.status_code == 200, over_rest.text
    fields = over_rest.json()["data"]["runplane"]
    assert fields["pause_note"] == "source is late" and fields["paused_by"].startswith("token #")
    # Without a body, as before: paused with no note.
    await rest.http.post(f"{rest.base}/jobs/{job.id}/unpause/")
    bare = await rest.http.post(f"{rest.base}/jobs/{job.id}/pause/")
    assert bare.status_code == 200 and bare.json()["data"]["paused"] is True
    assert bare.json()["data"]["runplane"]["pause_note"] == ""


async def test_a_job_deactivated_after_failing_says_why_on_every_door(
    same: Client, rest: Rest, adb: AsyncDb, settings: Settings
) -> None:
    job = await same.jobs.CreateJob(deploy_job())
    await adb.execute("UPDATE accounts SET deactivate_after_failures = 2 WHERE id = %s", (same.account_id,))
    pool = await open_pool(settings.database_url)
    try:
        async with pool.connection() as conn:
            for n in range(2):
                run = await same.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id, cause=f"failing {n}"))
                await adb.execute("UPDATE runs SET status = 3 WHERE id = %s", (run.id,))
                outcome = Outcome.error("boom", FailureKind.STEP)
                assert (
                    await finish_run(conn, run.id, outcome, policy=RetryPolicy(backoff_base=10.0, backoff_cap=40.0))
                    is not None
                )
    finally:
        await pool.close()
    reason = f"deactivated after 2 consecutive failed runs (last: run {run.id})"
    read = await same.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
    assert not read.active and read.deactivation_reason == reason
    over_rest = (await rest.http.get(f"{rest.base}/jobs/{job.id}/")).json()["data"]
    assert over_rest["deactivated"] is True and over_rest["runplane"]["deactivation_reason"] == reason


async def test_skipped_occurrences_are_listed_newest_first_on_both_doors(
    same: Client, rest: Rest, adb: AsyncDb
) -> None:
    job = await same.jobs.CreateJob(deploy_job())
    blocking = await same.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
    for minute in (1, 2):
        await adb.execute(
            "INSERT INTO skipped_occurrences (account_id, job_id, occurrence_key, scheduled_at, reason, detail,"
            " blocking_run_id) VALUES (%s, %s, %s, %s, 'overlap', 'in the way', %s)",
            (
                same.account_id,
                job.id,
                f"sched:{job.id}:{minute}",
                datetime.fromtimestamp(60 * minute, UTC),
                blocking.id,
            ),
        )
    listed = await same.jobs.ListSkippedOccurrences(jobs_pb2.ListSkippedOccurrencesRequest(job_id=job.id))
    assert [(o.scheduled_at.seconds, o.reason, o.blocking_run_id) for o in listed.occurrences] == [
        (120, "overlap", blocking.id),
        (60, "overlap", blocking.id),
    ]
    over_rest = await rest.http.get(f"{rest.base}/jobs/{job.id}/skipped-occurrences/")
    assert over_rest.status_code == 200, over_rest.text
    assert [(o["reason"], o["blocking_run_id"]) for o in over_rest.json()["data"]] == [("overlap", blocking.id)] * 2
    assert (await rest.http.get(f"{rest.base}/jobs/{job.id + 1000}/skipped-occurrences/")).status_code == 404
