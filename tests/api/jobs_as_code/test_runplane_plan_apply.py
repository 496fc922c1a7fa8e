"""`runplane plan FILE` / `runplane apply FILE`: runplane's own job settings as code, over the jobs
dbt-jobs-as-code manages (found by the [[identifier]] in their names)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from api.process import RunningApi
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, jobs_pb2
from tests.api.conftest import Client
from tests.api.jobs_as_code.commands import runplane
from tests.support.api import serving_api

pytestmark = pytest.mark.timeout(120)

SETTINGS = """\
jobs:
  nightly:
    timezone: Europe/Amsterdam
    completion_mode: all
    priority: 10
    retry_max_attempts: 2
    retry_on_step_failure: true
"""


@pytest.fixture
async def api(settings: Settings, _cleanup_bus: None) -> AsyncIterator[RunningApi]:
    async with serving_api(settings, rest=False, deliveries=False) as running:
        yield running


async def test_plan_shows_apply_sets_once_and_delete_only_when_asked(
    api: RunningApi, client: Client, tmp_path: Path
) -> None:
    def job(name: str) -> jobs_pb2.CreateJobRequest:
        return jobs_pb2.CreateJobRequest(
            name=name,
            job_type=common_pb2.JOB_TYPE_DEPLOY,
            steps=["echo hi"],
            triggers=jobs_pb2.JobTriggers(schedule=jobs_pb2.CronSchedule(cron="0 6 * * *")),
        )

    nightly = await client.jobs.CreateJob(job("Nightly [[nightly]]"))
    hourly = await client.jobs.CreateJob(job("Hourly [[hourly]]"))
    unmanaged = await client.jobs.CreateJob(job("By hand"))
    for other in (hourly, unmanaged):
        request = jobs_pb2.UpdateJobRequest(
            job_id=other.id, name=other.name, job_type=other.job_type, steps=other.steps,
            triggers=other.triggers, settings=other.settings, expected_version=other.version,
        )  # fmt: skip
        request.settings.priority = 5
        await client.jobs.UpdateJob(request)
    path = tmp_path / "runplane-jobs.yml"
    path.write_text(SETTINGS)

    code, planned = await runplane(api, client.token, "plan", str(path))
    assert code == 0, planned
    assert "timezone: 'UTC' -> 'Europe/Amsterdam'" in planned and "priority: 0 -> 10" in planned
    assert "5 changes" in planned
    unchanged = await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=nightly.id))
    assert unchanged.version == nightly.version  # a plan changes nothing

    code, applied = await runplane(api, client.token, "apply", str(path))
    assert code == 0 and "applied 5 changes to 1 jobs" in applied, applied
    saved = await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=nightly.id))
    assert saved.triggers.schedule.timezone == "Europe/Amsterdam"
    assert saved.triggers.completion_mode == jobs_pb2.COMPLETION_MODE_ALL
    assert (saved.settings.priority, saved.settings.retry_max_attempts, saved.settings.retry_on_step_failure) == (
        10, 2, True,
    )  # fmt: skip
    assert saved.steps == nightly.steps and saved.name == nightly.name

    code, again = await runplane(api, client.token, "apply", str(path))
    assert (code, again.strip()) == (0, "no changes")
    assert (await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=nightly.id))).version == saved.version

    # Jobs the file leaves out keep their settings, unless --delete: then a managed one gets the defaults.
    assert (await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=hourly.id))).settings.priority == 5
    code, deleting = await runplane(api, client.token, "plan", "--delete", str(path))
    assert code == 0 and "Hourly [[hourly]]): priority: 5 -> 0" in deleting and "By hand" not in deleting, deleting
    code, _ = await runplane(api, client.token, "apply", "--delete", str(path))
    assert code == 0
    assert (await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=hourly.id))).settings.priority == 0
    assert (await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=unmanaged.id))).settings.priority == 5

    path.write_text("jobs:\n  missing:\n    priority: 1\n")
    code, refused = await runplane(api, client.token, "plan", str(path))
    assert code == 2 and "no job named with [[missing]]" in refused
