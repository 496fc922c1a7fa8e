"""Secret variables through the public API: write-only, encrypted at rest, shown only as set/unset."""

from __future__ import annotations

import json

import grpc

from api.process import start_server
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, jobs_pb2, runs_pb2
from tests.api.conftest import AsyncDb, Client, connect, deploy_job, scalar, status_of
from tests.conftest import TEST_SECRET_KEYS

SECRET = "pa55-w0rd-xyzzy"


def with_env(env: dict[str, str]) -> jobs_pb2.JobSettings:
    return jobs_pb2.JobSettings(environment=env)


async def test_a_secret_is_never_returned_and_only_ciphertext_is_stored(client: Client, adb: AsyncDb) -> None:
    created = await client.jobs.CreateJob(
        deploy_job(settings=with_env({"DBT_ENV_SECRET_PASSWORD": SECRET, "TARGET": "prod"}))
    )
    responses = [
        created,
        await client.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=created.id)),
        await client.jobs.ListJobs(jobs_pb2.ListJobsRequest()),
        await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=created.id, trigger=common_pb2.TRIGGER_MANUAL)),
    ]
    for response in responses:
        assert SECRET.encode() not in response.SerializeToString()
    assert dict(created.settings.environment) == {"TARGET": "prod"}
    assert list(created.settings.secret_names) == ["DBT_ENV_SECRET_PASSWORD"]

    stored = await scalar(adb, "SELECT secret_environment FROM jobs WHERE id = %s", created.id)
    plain = await scalar(adb, "SELECT environment::text FROM jobs WHERE id = %s", created.id)
    assert SECRET not in json.dumps(stored) and SECRET not in plain
    assert SecretBox.from_keys(TEST_SECRET_KEYS).decrypt(stored["DBT_ENV_SECRET_PASSWORD"]) == SECRET


async def test_secrets_are_set_kept_and_unset_one_by_one(client: Client, adb: AsyncDb) -> None:
    box = SecretBox.from_keys(TEST_SECRET_KEYS)
    job = await client.jobs.CreateJob(
        deploy_job(settings=with_env({"DBT_ENV_SECRET_A": "a-1", "DBT_ENV_SECRET_B": "b-1"}))
    )

    async def update(env: dict[str, str]) -> jobs_pb2.Job:
        request = jobs_pb2.UpdateJobRequest(
            job_id=job.id, name=job.name, job_type=job.job_type, steps=job.steps, settings=with_env(env)
        )
        return await client.jobs.UpdateJob(request)

    async def stored() -> dict[str, str]:
        tokens = await scalar(adb, "SELECT secret_environment FROM jobs WHERE id = %s", job.id)
        return {name: box.decrypt(token) for name, token in tokens.items()}

    kept = await update({"OTHER": "x"})  # secrets not named keep their values
    assert list(kept.settings.secret_names) == ["DBT_ENV_SECRET_A", "DBT_ENV_SECRET_B"]
    assert await stored() == {"DBT_ENV_SECRET_A": "a-1", "DBT_ENV_SECRET_B": "b-1"}
    changed = await update({"DBT_ENV_SECRET_A": "a-2", "DBT_ENV_SECRET_B": ""})  # set one, unset the other
    assert list(changed.settings.secret_names) == ["DBT_ENV_SECRET_A"]
    assert await stored() == {"DBT_ENV_SECRET_A": "a-2"}


async def test_without_keys_a_secret_is_refused_and_nothing_is_written(settings: Settings, adb: AsyncDb) -> None:
    from pydantic import SecretStr

    from api.admin import create_account

    keyless = settings.model_copy(update={"secret_keys": SecretStr("")})
    api = await start_server(keyless, port=0, runner_port=0)
    try:
        account_id, token = await create_account(keyless, name="nokeys", run_slots=1, memory_mb=512)
        async with connect(api, token, account_id) as c:
            code, details = await status_of(c.jobs.CreateJob(deploy_job(settings=with_env({"DBT_ENV_SECRET_X": "v"}))))
            assert code is grpc.StatusCode.FAILED_PRECONDITION and "RUNPLANE_SECRET_KEYS" in details
            assert await scalar(adb, "SELECT count(*) FROM jobs") == 0
            plain = await c.jobs.CreateJob(deploy_job(settings=with_env({"PLAIN": "ok"})))  # no secret: fine
            assert dict(plain.settings.environment) == {"PLAIN": "ok"}
    finally:
        await api.stop(0)
