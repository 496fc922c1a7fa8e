"""Arbitrary field values at CreateJob and TriggerRun: the server answers OK or a proper status, never
crashes, and a rejected request writes nothing.

One server and database serve every example of a test (that is the point: it must survive them all).
"""

from __future__ import annotations

from typing import TypeVar

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from runplane.v1 import common_pb2, jobs_pb2, runs_pb2
from tests.api.conftest import AsyncDb, Client, deploy_job, scalar, status_of

PROPER = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
}
T = TypeVar("T")
EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Any string protobuf can carry (no lone surrogates), biased towards the edges we check.
chars = st.characters(exclude_categories=["Cs"])
texts = st.one_of(
    st.text(chars, max_size=30),
    st.sampled_from(["", " ", "a\x00b", "line\nbreak", "-rf", "x" * 201, "y" * 4097, "Europe/Amsterdam"]),
)
int32 = st.one_of(st.integers(-3, 70), st.sampled_from([86_400, 86_401, 2**31 - 1, -(2**31)]))
ids = st.one_of(st.integers(-2, 5), st.sampled_from([2**63 - 1, -(2**63)]))
statuses = st.lists(st.sampled_from([0, 1, 3, 10, 20, 30, 99]), max_size=4)

# Plausible values, so that enough examples get through validation to exercise the writes.
names = st.text(st.characters(categories=("L", "N")), min_size=1, max_size=20)
steps = st.lists(st.sampled_from(["dbt build", "echo hi", "python3 -c 'print(1)'"]), min_size=1, max_size=3)
crons = st.sampled_from(["* * * * *", "0 2 * * 1-5", "*/15 * * * *", "61 * * * *", "* * *", ""])
zones = st.sampled_from(["", "UTC", "America/New_York", "Mars/Olympus", "../../etc/passwd"])


@st.composite
def field(draw: st.DrawFn, plausible: st.SearchStrategy[T], wild: st.SearchStrategy[T], chaos: int) -> T:
    """A plausible value, or (``chaos`` percent of the time) a wild one."""
    return draw(wild) if draw(st.integers(0, 99)) < chaos else draw(plausible)


@st.composite
def job_requests(draw: st.DrawFn) -> jobs_pb2.CreateJobRequest:
    chaos = draw(st.sampled_from([0, 15, 50, 100]))
    request = jobs_pb2.CreateJobRequest(
        name=draw(field(names, texts, chaos)),
        job_type=draw(
            field(
                st.integers(1, 4).map(common_pb2.JobType.ValueType),
                st.integers(-1, 6).map(common_pb2.JobType.ValueType),  # unknown numbers too
                chaos,
            )
        ),
        steps=draw(field(steps, st.lists(texts, max_size=4) | st.just(["true"] * 51), chaos)),
    )
    if draw(st.booleans()):
        request.triggers.on_pull_request = draw(st.booleans())
        request.triggers.on_merge = draw(st.booleans())
        if draw(st.booleans()):
            request.triggers.schedule.cron = draw(field(crons, texts, chaos))
            request.triggers.schedule.timezone = draw(field(zones, texts, chaos))
        for upstream in draw(st.lists(ids, max_size=2)):
            request.triggers.on_completion.add(upstream_job_id=upstream, statuses=draw(statuses))
    if draw(st.booleans()):
        small = field(st.integers(0, 10), int32, chaos)
        s = request.settings
        s.threads, s.timeout_seconds, s.retry_max_attempts = draw(small), draw(small), draw(small)
        s.missed_run_grace_seconds, s.priority = draw(field(st.integers(-1, 600), int32, chaos)), draw(small)
        s.target_name = draw(field(st.sampled_from(["", "prod"]), texts, chaos))
        s.git_branch = draw(field(st.sampled_from(["", "main", "release/1.2"]), texts, chaos))
        s.retry_on_step_failure = draw(st.booleans())
        env_keys = field(st.sampled_from(["DBT_TARGET", "A", "_X1"]), texts, chaos)
        s.environment.update(draw(st.dictionaries(env_keys, texts, max_size=3)))
    return request


async def counts(adb: AsyncDb) -> tuple[int, int, int, int]:
    return (
        await scalar(adb, "SELECT count(*) FROM jobs"),
        await scalar(adb, "SELECT count(*) FROM job_completion_triggers"),
        await scalar(adb, "SELECT count(*) FROM runs"),
        await scalar(adb, "SELECT coalesce(sum(version), 0) FROM jobs"),
    )


# 60 examples, each a CreateJob over gRPC and three counts: under 10 s at load 3-6, 28 s at
# load 10-37, where the default 20 s cut it off mid-example (hypothesis then reports it as flaky).
@pytest.mark.timeout(120)
@EXAMPLES
@given(request=job_requests())
async def test_create_job_answers_properly_and_rejections_write_nothing(
    client: Client, adb: AsyncDb, request: jobs_pb2.CreateJobRequest
) -> None:
    before = await counts(adb)
    code, details = await status_of(client.jobs.CreateJob(request))
    event(code.name)
    assert code in PROPER, (code, details)
    after = await counts(adb)
    if code is grpc.StatusCode.OK:
        assert after[0] == before[0] + 1
    else:
        assert after == before, details
        assert ":" in details  # names what was wrong


@st.composite
def trigger_requests(draw: st.DrawFn, job_ids: list[int]) -> runs_pb2.TriggerRunRequest:
    chaos = draw(st.sampled_from([0, 15, 50, 100]))
    request = runs_pb2.TriggerRunRequest(
        job_id=draw(field(st.sampled_from(job_ids), ids, chaos)),
        trigger=draw(
            field(
                st.sampled_from([0, 2, 3, 4, 5]).map(common_pb2.Trigger.ValueType),
                st.integers(-1, 9).map(common_pb2.Trigger.ValueType),  # unknown numbers too
                chaos,
            )
        ),
        cause=draw(field(names, texts, chaos)),
        idempotency_key=draw(field(st.sampled_from(["", "k1", "k2"]), texts, chaos)),
    )
    if draw(st.booleans()):
        small = field(st.integers(0, 50), int32, chaos)
        o = request.overrides
        o.steps.extend(draw(field(steps | st.just([]), st.lists(texts, max_size=3), chaos)))
        o.threads, o.timeout_seconds, o.pull_request_number = draw(small), draw(small), draw(small)
        o.git_branch = draw(field(st.sampled_from(["", "main", "feature/x"]), texts, chaos))
        o.git_sha = draw(field(st.sampled_from(["", "abcdef0"]), texts, chaos))
        o.schema = draw(field(st.sampled_from(["", "dev", "1bad"]), texts, chaos))
    return request


@pytest.fixture
async def trigger_jobs(client: Client, other: Client, adb: AsyncDb) -> list[int]:
    """A job of every kind the trigger rules tell apart, and one of another account."""
    deploy = await client.jobs.CreateJob(deploy_job("deploy"))
    ci = await client.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(name="ci", job_type=common_pb2.JOB_TYPE_CI, steps=["true"])
    )
    merge = await client.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(name="merge", job_type=common_pb2.JOB_TYPE_MERGE, steps=["true"])
    )
    deactivated = await client.jobs.CreateJob(deploy_job("deactivated"))
    await adb.execute(
        "UPDATE jobs SET deactivated_at = now(), deactivation_reason = 'failing', version = version + 1 WHERE id = %s",
        (deactivated.id,),
    )
    theirs = await other.jobs.CreateJob(deploy_job("theirs"))
    return [deploy.id, ci.id, merge.id, deactivated.id, theirs.id]


@pytest.fixture
def accepted_runs() -> set[int]:
    return set()


@EXAMPLES
@given(data=st.data())
async def test_trigger_run_answers_properly_and_rejections_write_nothing(
    client: Client, adb: AsyncDb, trigger_jobs: list[int], accepted_runs: set[int], data: st.DataObject
) -> None:
    request = data.draw(trigger_requests(trigger_jobs))
    before = await counts(adb)
    try:
        run = await client.runs.TriggerRun(request)
    except grpc.aio.AioRpcError as exc:
        event(exc.code().name)
        assert exc.code() in PROPER, (exc.code(), exc.details())
        assert await counts(adb) == before, exc.details()
        return
    event("OK")
    after = await counts(adb)
    assert run.job_id == request.job_id and run.account_id == client.account_id
    assert request.job_id != trigger_jobs[-1], "another account's job was triggered"
    if run.id in accepted_runs:  # an idempotent replay
        assert after[2] == before[2]
    else:
        assert after[2] == before[2] + 1
        accepted_runs.add(run.id)
