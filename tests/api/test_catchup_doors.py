"""The catch-up window through the gRPC and REST doors of the API served in this process, on the real
Postgres."""

from __future__ import annotations

import grpc

from runplane.v1 import jobs_pb2
from tests.api.conftest import AsyncDb, Client, Rest, deploy_job, scalar, status_of


async def test_the_catchup_window_is_set_read_and_checked_over_grpc(client: Client, adb: AsyncDb) -> None:
    settings = jobs_pb2.JobSettings(missed_run_grace_seconds=-1, catchup_window_seconds=7200, catchup_all=True)
    created = await client.jobs.CreateJob(deploy_job(settings=settings))
    assert (created.settings.catchup_window_seconds, created.settings.catchup_all) == (7200, True)
    stored = "SELECT catchup_window_seconds || ':' || catchup_all FROM jobs WHERE id = %s"
    assert await scalar(adb, stored, created.id) == "7200:true"
    # Unset: no window, the grace alone, as every job had before.
    plain = await client.jobs.CreateJob(deploy_job())
    assert (plain.settings.catchup_window_seconds, plain.settings.catchup_all) == (0, False)
    too_long = deploy_job(settings=jobs_pb2.JobSettings(missed_run_grace_seconds=-1, catchup_window_seconds=604801))
    code, message = await status_of(client.jobs.CreateJob(too_long))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "settings.catchup_window_seconds" in message


async def test_the_catchup_window_is_a_runplane_field_over_rest(rest: Rest) -> None:
    body = {
        "name": "hourly",
        "execute_steps": ["echo hello"],
        "job_type": "scheduled",
        "triggers": {"schedule": True},
        "schedule": {"cron": "0 * * * *"},
        "runplane": {"catchup_window_seconds": 3600, "catchup_all": True},
    }
    created = await rest.http.post(f"{rest.base}/jobs/", json=body)
    assert created.status_code == 200, created.text
    job = created.json()["data"]
    assert (job["runplane"]["catchup_window_seconds"], job["runplane"]["catchup_all"]) == (3600, True)
    # An update that does not name them keeps them.
    del body["runplane"]
    kept = await rest.http.post(f"{rest.base}/jobs/{job['id']}/", json={**body, "name": "renamed"})
    assert kept.status_code == 200, kept.text
    runplane = kept.json()["data"]["runplane"]
    assert (runplane["catchup_window_seconds"], runplane["catchup_all"]) == (3600, True)
    refused = await rest.http.post(f"{rest.base}/jobs/", json={**body, "runplane": {"catchup_window_seconds": -1}})
    assert refused.status_code == 400, refused.text
