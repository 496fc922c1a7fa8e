"""RunnerService against the real Postgres: what a run token allows, and that refused calls change nothing.

A token works for its own run only, and only while the run is starting (to claim it) or running
under the lease its claim took. Used for another run it is PERMISSION_DENIED; after the run ended,
or after the lease was taken over, FAILED_PRECONDITION. Every refusal leaves the run, its steps,
logs and artifacts as they were. Retried calls that already took effect answer OK and change
nothing; steps out of order are refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from psycopg.types.json import Jsonb

from api.process import RunningApi
from api.runner.service import RunnerService
from api.store import Store
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import Settings
from runplane.basics.tokens import new_run_token
from runplane.basics.types import RunStatus
from runplane.v1 import common_pb2, runner_pb2, runner_pb2_grpc
from tests.conftest import TEST_SECRET_KEYS
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run, rows, run_row

pytestmark = pytest.mark.usefixtures("_cleanup_bus")

LEASE = "test-runner:1"


@dataclass
class Runner:
    stub: runner_pb2_grpc.RunnerServiceAsyncStub
    run_id: int
    token: str
    lease_id: str = LEASE

    def md(self, token: str | None = None) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {token or self.token}"),)


@pytest.fixture
async def channel(runner_api: RunningApi) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{runner_api.runner_port}") as chan:
        yield chan


def starting_run(db: Conn, steps: list[str], **job: Any) -> tuple[int, str]:
    account = create_account(db, name=f"acct-{len(rows(db, 'SELECT id FROM accounts'))}")
    run_id = queue_run(db, create_job(db, account, steps=steps, **job))
    return run_id, make_starting(db, run_id)


async def claimed(db: Conn, channel: grpc.aio.Channel, steps: list[str] | None = None, **job: Any) -> Runner:
    run_id, token = starting_run(db, steps or ["echo a", "echo b"], **job)
    runner = Runner(runner_pb2_grpc.RunnerServiceStub(channel), run_id, token)
    await runner.stub.Claim(runner_pb2.ClaimRequest(run_id=run_id, lease_id=LEASE), metadata=runner.md())
    return runner


def snapshot(db: Conn, run_id: int) -> tuple[Any, ...]:
    """Everything a runner can change about a run."""
    return (
        run_row(db, run_id),
        rows(db, "SELECT * FROM run_steps WHERE run_id = %s ORDER BY step_index", (run_id,)),
        rows(db, "SELECT seq, step_index, text FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,)),
        rows(db, "SELECT path, step_index, content FROM artifacts WHERE run_id = %s ORDER BY path", (run_id,)),
    )


async def every_write(runner: Runner, token: str | None = None, run_id: int | None = None) -> list[grpc.StatusCode]:
    """Each write a runner makes, with ``token`` and ``run_id``; the status code of each."""
    md, rid, lease = runner.md(token), run_id or runner.run_id, runner.lease_id
    calls: list[Awaitable[object]] = [
        runner.stub.RenewLease(runner_pb2.LeaseRequest(run_id=rid, lease_id=lease), metadata=md),
        runner.stub.ReadCancel(runner_pb2.LeaseRequest(run_id=rid, lease_id=lease), metadata=md),
        runner.stub.AppendLogs(
            runner_pb2.AppendLogsRequest(
                run_id=rid, lease_id=lease, chunks=[runner_pb2.RunnerLogChunk(seq=99, step_index=0, text="x")]
            ),
            metadata=md,
        ),
        runner.stub.SetStepStatus(
            runner_pb2.SetStepStatusRequest(
                run_id=rid, lease_id=lease, step_index=0, state=runner_pb2.STEP_STATE_STARTED
            ),
            metadata=md,
        ),
        runner.stub.UploadArtifact(
            runner_pb2.UploadArtifactRequest(
                run_id=rid, lease_id=lease, step_index=0, path="target/x.json", content=b"{}"
            ),
            metadata=md,
        ),
        runner.stub.Finish(
            runner_pb2.FinishRequest(run_id=rid, lease_id=lease, status=common_pb2.RUN_STATUS_SUCCESS), metadata=md
        ),
        runner.stub.Claim(runner_pb2.ClaimRequest(run_id=rid, lease_id=lease), metadata=md),
    ]
    codes = []
    for call in calls:
        try:
            await call
            codes.append(grpc.StatusCode.OK)
        except grpc.aio.AioRpcError as exc:
            codes.append(exc.code())
    return codes


async def test_claim_gives_the_whole_run_with_secrets_for_the_runner_only(db: Conn, channel: grpc.aio.Channel) -> None:
    run_id, token = starting_run(
        db, ["echo 1"], environment={"PLAIN": "p"}, secrets={"DBT_ENV_SECRET_PW": "pw-1"}, timeout_seconds=9
    )
    stub = runner_pb2_grpc.RunnerServiceStub(channel)
    md = (("authorization", f"Bearer {token}"),)
    spec = await stub.Claim(runner_pb2.ClaimRequest(run_id=run_id, lease_id=LEASE), metadata=md)
    assert (spec.run_id, list(spec.steps), spec.timeout_seconds, spec.lease_id) == (run_id, ["echo 1"], 9, LEASE)
    assert dict(spec.environment) == {"PLAIN": "p", "DBT_ENV_SECRET_PW": "pw-1"}
    assert list(spec.masked_values) == ["pw-1"]
    assert spec.lease_seconds > 0 and spec.heartbeat_interval > 0
    row = run_row(db, run_id)
    assert (row["status"], row["lease_owner"]) == (RunStatus.RUNNING, LEASE)
    # A retried claim (the answer was lost) gets the same spec; a second runner is refused.
    again = await stub.Claim(runner_pb2.ClaimRequest(run_id=run_id, lease_id=LEASE), metadata=md)
    assert again == spec
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Claim(runner_pb2.ClaimRequest(run_id=run_id, lease_id="someone-else"), metadata=md)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert run_row(db, run_id) == row


async def test_the_warm_up_at_start_changes_no_run(db: Conn, runner_api: RunningApi, settings: Settings) -> None:
    run_id, _ = starting_run(db, ["echo 1"])
    before = rows(db, "SELECT * FROM runs ORDER BY id"), rows(db, "SELECT * FROM run_steps ORDER BY run_id")
    service = RunnerService(Store(runner_api.pool), runner_api.pickups, settings.runner, None)
    await service.warm_up()
    assert (rows(db, "SELECT * FROM runs ORDER BY id"), rows(db, "SELECT * FROM run_steps ORDER BY run_id")) == before
    assert run_row(db, run_id)["status"] == RunStatus.STARTING  # still there to claim with its token


async def test_a_token_for_another_run_is_denied_and_changes_nothing(db: Conn, channel: grpc.aio.Channel) -> None:
    mine = await claimed(db, channel)
    other = await claimed(db, channel)
    before = snapshot(db, other.run_id), snapshot(db, mine.run_id)
    codes = await every_write(mine, run_id=other.run_id)  # my token, their run
    assert set(codes) == {grpc.StatusCode.PERMISSION_DENIED}
    codes = await every_write(mine, token=new_run_token())  # a made-up token for my run
    assert set(codes) == {grpc.StatusCode.PERMISSION_DENIED}
    assert (snapshot(db, other.run_id), snapshot(db, mine.run_id)) == before


async def test_run_account_names_the_tokens_account_only_while_its_run_is_leased(
    db: Conn, channel: grpc.aio.Channel
) -> None:
    mine, other = await claimed(db, channel), await claimed(db, channel)
    accounts = {r["id"]: r["account_id"] for r in rows(db, "SELECT id, account_id FROM runs")}
    assert accounts[mine.run_id] != accounts[other.run_id]

    async def account_of(runner: Runner, run_id: int, token: str | None = None, lease: str = LEASE) -> object:
        request = runner_pb2.LeaseRequest(run_id=run_id, lease_id=lease)
        try:
            return (await runner.stub.RunAccount(request, metadata=runner.md(token))).account_id
        except grpc.aio.AioRpcError as exc:
            return exc.code()

    assert await account_of(mine, mine.run_id) == accounts[mine.run_id]
    assert await account_of(mine, other.run_id) is grpc.StatusCode.PERMISSION_DENIED  # my token, their run
    assert await account_of(mine, mine.run_id, token=new_run_token()) is grpc.StatusCode.PERMISSION_DENIED
    assert await account_of(mine, mine.run_id, lease="another") is grpc.StatusCode.FAILED_PRECONDITION
    finish = runner_pb2.FinishRequest(run_id=mine.run_id, lease_id=LEASE, status=common_pb2.RUN_STATUS_SUCCESS)
    await mine.stub.Finish(finish, metadata=mine.md())
    assert await account_of(mine, mine.run_id) is grpc.StatusCode.FAILED_PRECONDITION


async def test_no_token_is_unauthenticated(db: Conn, channel: grpc.aio.Channel) -> None:
    runner = await claimed(db, channel)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await runner.stub.RenewLease(runner_pb2.LeaseRequest(run_id=runner.run_id, lease_id=LEASE))
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_a_token_is_spent_once_its_run_ended(db: Conn, channel: grpc.aio.Channel) -> None:
    runner = await claimed(db, channel)
    finish = runner_pb2.FinishRequest(run_id=runner.run_id, lease_id=LEASE, status=common_pb2.RUN_STATUS_SUCCESS)
    await runner.stub.Finish(finish, metadata=runner.md())
    await runner.stub.Finish(finish, metadata=runner.md())  # a retried finish that took effect: OK, no change
    before = snapshot(db, runner.run_id)
    assert before[0]["status"] == RunStatus.SUCCESS
    codes = await every_write(runner)
    assert set(codes[:5]) == {grpc.StatusCode.FAILED_PRECONDITION}
    assert codes[5] == grpc.StatusCode.OK  # Finish(SUCCESS) again: the same retry
    assert codes[6] == grpc.StatusCode.FAILED_PRECONDITION  # Claim
    assert snapshot(db, runner.run_id) == before


async def test_a_token_is_useless_once_the_lease_was_taken_over(db: Conn, channel: grpc.aio.Channel) -> None:
    runner = await claimed(db, channel)
    # The reaper declared the runner lost and another runner holds the run now (as after a takeover).
    db.execute("UPDATE runs SET lease_owner = 'the-new-runner' WHERE id = %s", (runner.run_id,))
    before = snapshot(db, runner.run_id)
    codes = await every_write(runner)
    assert set(codes) == {grpc.StatusCode.FAILED_PRECONDITION}
    assert snapshot(db, runner.run_id) == before


async def test_a_relaunch_issues_a_new_token_and_the_old_one_is_dead(db: Conn, channel: grpc.aio.Channel) -> None:
    run_id, old = starting_run(db, ["echo"])
    db.execute("UPDATE runs SET status = 1 WHERE id = %s", (run_id,))  # the launch failed: queued again
    new = make_starting(db, run_id)
    stub = runner_pb2_grpc.RunnerServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Claim(
            runner_pb2.ClaimRequest(run_id=run_id, lease_id=LEASE), metadata=(("authorization", f"Bearer {old}"),)
        )
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    await stub.Claim(
        runner_pb2.ClaimRequest(run_id=run_id, lease_id=LEASE), metadata=(("authorization", f"Bearer {new}"),)
    )
    assert run_row(db, run_id)["status"] == RunStatus.RUNNING


async def test_retries_are_idempotent_and_steps_go_in_order(db: Conn, channel: grpc.aio.Channel) -> None:
    runner = await claimed(db, channel, steps=["one", "two", "three"])
    stub, md, rid = runner.stub, runner.md(), runner.run_id

    def step(index: int, state: runner_pb2.StepState.ValueType, **kw: Any) -> runner_pb2.SetStepStatusRequest:
        return runner_pb2.SetStepStatusRequest(run_id=rid, lease_id=LEASE, step_index=index, state=state, **kw)

    with pytest.raises(grpc.aio.AioRpcError) as refused:  # step 1 before step 0 ended
        await stub.SetStepStatus(step(1, runner_pb2.STEP_STATE_STARTED), metadata=md)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # finishing a step that never started
        await stub.SetStepStatus(step(0, runner_pb2.STEP_STATE_FINISHED, status=10, exit_code=0), metadata=md)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # no such step
        await stub.SetStepStatus(step(3, runner_pb2.STEP_STATE_STARTED), metadata=md)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    logs = runner_pb2.AppendLogsRequest(
        run_id=rid, lease_id=LEASE, chunks=[runner_pb2.RunnerLogChunk(seq=1, step_index=0, text="hello\n")]
    )
    # Each call twice: the second is a retry after a lost answer, answered OK without a change.
    for call in (
        lambda: stub.SetStepStatus(step(0, runner_pb2.STEP_STATE_STARTED), metadata=md),
        lambda: stub.AppendLogs(logs, metadata=md),
        lambda: stub.SetStepStatus(step(0, runner_pb2.STEP_STATE_FINISHED, status=20, exit_code=3), metadata=md),
        lambda: stub.SetStepStatus(step(1, runner_pb2.STEP_STATE_SKIPPED), metadata=md),
    ):
        await call()
        await call()
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # the same step finished otherwise
        await stub.SetStepStatus(step(0, runner_pb2.STEP_STATE_FINISHED, status=10, exit_code=0), metadata=md)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    query = "SELECT step_index, status, exit_code, skipped FROM run_steps WHERE run_id = %s ORDER BY 1"
    # Skipped steps keep their queued status and say they never started.
    assert [(s["step_index"], s["status"], s["exit_code"], s["skipped"]) for s in rows(db, query, (rid,))] == [
        (0, 20, 3, False),
        (1, 1, None, True),
        (2, 1, None, True),
    ]
    assert [r["text"] for r in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s", (rid,))] == ["hello\n"]


def give_environment(db: Conn, run_id: int, *, password: str, git_token: str) -> None:
    """A project and environment for the run's job, their secrets stored encrypted as the API stores them."""
    box = SecretBox.from_keys(TEST_SECRET_KEYS)
    account_id, job_id = run_row(db, run_id)["account_id"], run_row(db, run_id)["job_id"]
    project = db.execute(
        "INSERT INTO projects (account_id, name, repository_url, git_credential_kind, git_credential)"
        " VALUES (%s, 'shop', 'https://git.example.com/shop.git', 'token', %s) RETURNING id",
        (account_id, box.encrypt(git_token)),
    ).fetchone()
    assert project is not None
    environment = db.execute(
        "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
        " connection, connection_secrets, schema_name) VALUES (%s, %s, 'prod', 'deployment', '1.10', 'postgres',"
        " %s, %s, 'analytics') RETURNING id",
        (account_id, project[0], Jsonb({"host": "db.example.com"}), Jsonb({"password": box.encrypt(password)})),
    ).fetchone()
    assert environment is not None
    db.execute("UPDATE jobs SET environment_id = %s WHERE id = %s", (environment[0], job_id))


async def test_claim_carries_the_dbt_context_its_secrets_decrypted_and_masked(
    db: Conn, channel: grpc.aio.Channel
) -> None:
    run_id, token = starting_run(db, ["dbt build"], secrets={"DBT_ENV_SECRET_X": "job-secret"})
    give_environment(db, run_id, password="pw-warehouse", git_token="ghp-token")
    stub = runner_pb2_grpc.RunnerServiceStub(channel)
    md = (("authorization", f"Bearer {token}"),)
    spec = await stub.Claim(runner_pb2.ClaimRequest(run_id=run_id, lease_id=LEASE), metadata=md)

    assert spec.HasField("dbt")
    assert dict(spec.dbt.connection) == {"host": "db.example.com"}
    assert dict(spec.dbt.connection_secrets) == {"password": "pw-warehouse"}
    assert spec.dbt.git_credential == "ghp-token" and spec.dbt.schema == "analytics"
    assert sorted(spec.masked_values) == ["ghp-token", "job-secret", "pw-warehouse"]
    stored = str(rows(db, "SELECT * FROM environments")) + str(rows(db, "SELECT * FROM projects"))
    assert "pw-warehouse" not in stored and "ghp-token" not in stored


async def test_a_dbt_runs_claim_lists_its_setup_steps_before_its_commands(db: Conn, channel: grpc.aio.Channel) -> None:
    run_id, token = starting_run(db, ["dbt seed", "dbt build"])
    give_environment(db, run_id, password="pw", git_token="t")
    db.execute("UPDATE jobs SET generate_docs = true FROM runs WHERE runs.job_id = jobs.id AND runs.id = %s", (run_id,))
    stub = runner_pb2_grpc.RunnerServiceStub(channel)
    md = (("authorization", f"Bearer {token}"),)
    spec = await stub.Claim(runner_pb2.ClaimRequest(run_id=run_id, lease_id=LEASE), metadata=md)

    setup = ["Clone git repository", "Create profile from connection postgres", "Invoke dbt deps"]
    assert list(spec.steps) == [*setup, "dbt seed", "dbt build", "dbt docs generate"]
    assert spec.setup_steps == 3 and list(spec.optional_steps) == [5]
    stored = rows(
        db, "SELECT step_index, command, setup, optional FROM run_steps WHERE run_id = %s ORDER BY 1", (run_id,)
    )
    assert [(r["command"], r["setup"], r["optional"]) for r in stored] == [
        *[(name, True, False) for name in setup],
        ("dbt seed", False, False),
        ("dbt build", False, False),
        ("dbt docs generate", False, True),
    ]


async def test_a_plain_jobs_claim_has_no_setup_steps(db: Conn, channel: grpc.aio.Channel) -> None:
    run_id, token = starting_run(db, ["echo 1"])
    stub = runner_pb2_grpc.RunnerServiceStub(channel)
    spec = await stub.Claim(
        runner_pb2.ClaimRequest(run_id=run_id, lease_id=LEASE), metadata=(("authorization", f"Bearer {token}"),)
    )
    assert list(spec.steps) == ["echo 1"] and spec.setup_steps == 0
    assert [r["setup"] for r in rows(db, "SELECT setup FROM run_steps WHERE run_id = %s", (run_id,))] == [False]


async def test_the_checked_out_commit_is_recorded_under_the_lease_only(db: Conn, channel: grpc.aio.Channel) -> None:
    runner = await claimed(db, channel)
    sha = "0123456789abcdef0123456789abcdef01234567"
    record = runner_pb2.RecordGitShaRequest(run_id=runner.run_id, lease_id=LEASE, git_sha=sha)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await runner.stub.RecordGitSha(record, metadata=runner.md(new_run_token()))
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        bad = runner_pb2.RecordGitShaRequest(run_id=runner.run_id, lease_id=LEASE, git_sha="main; rm -rf /")
        await runner.stub.RecordGitSha(bad, metadata=runner.md())
    assert invalid.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert run_row(db, runner.run_id)["git_sha"] == ""
    await runner.stub.RecordGitSha(record, metadata=runner.md())
    assert run_row(db, runner.run_id)["git_sha"] == sha
