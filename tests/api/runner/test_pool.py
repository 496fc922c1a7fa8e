"""WaitForRun against the real Postgres: how a warm pool Pod gets a run, and what its token is worth.

The rows are made and assigned with the dispatcher's own statements (``dispatcher/kubernetes``),
as the warm pools and the pooled launcher do. A pool Pod's token lets it wait for one run: the run
is handed over with a new run token (the dispatcher's is dead from then on) and the pool token is
spent. A run that moved on before the Pod asked is not taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from api.process import RunningApi
from dispatcher.kubernetes.pool import QUERIES
from runplane.basics.tokens import new_run_token, token_hash
from runplane.basics.types import RunStatus
from runplane.v1 import runner_pb2, runner_pb2_grpc
from tests.support.polling import eventually
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run, run_row

POOL, CLUSTER = "small", "east"


@pytest.fixture
async def stub(runner_api: RunningApi) -> AsyncIterator[runner_pb2_grpc.RunnerServiceAsyncStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{runner_api.runner_port}") as chan:
        yield runner_pb2_grpc.RunnerServiceStub(chan)


def pool_pod(db: Conn, name: str) -> str:
    """A pool Pod's row, as the warm pools make it; its token."""
    token = new_run_token()
    params = {"name": name, "cluster": CLUSTER, "pool": POOL, "token_hash": token_hash(token)}
    db.execute(QUERIES["pool_runner_created"], params)
    return token


def assign(db: Conn, run_id: int, attempt: int = 1, silent: float = 10.0) -> str | None:
    """What the pooled launcher does: the freshest waiting Pod gets the run."""
    params = {"cluster": CLUSTER, "pool": POOL, "run_id": run_id, "attempt": attempt, "silent": silent}
    row = db.execute(QUERIES["assign_pool_runner"], params).fetchone()
    return None if row is None else str(row[0])


def starting_run(db: Conn) -> tuple[int, str]:
    run_id = queue_run(db, create_job(db, create_account(db), steps=["echo hi"]))
    return run_id, make_starting(db, run_id)


async def wait(
    stub: runner_pb2_grpc.RunnerServiceAsyncStub, token: str, seconds: float
) -> runner_pb2.WaitForRunResponse:
    return await stub.WaitForRun(
        runner_pb2.WaitForRunRequest(wait_seconds=seconds), metadata=(("authorization", f"Bearer {token}"),)
    )


async def claim(stub: runner_pb2_grpc.RunnerServiceAsyncStub, run_id: int, token: str) -> grpc.StatusCode:
    try:
        await stub.Claim(
            runner_pb2.ClaimRequest(run_id=run_id, lease_id="pool:1"), metadata=(("authorization", f"Bearer {token}"),)
        )
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_a_waiting_pod_is_heard_and_gets_nothing_until_a_run_is_given_to_it(
    db: Conn, stub: runner_pb2_grpc.RunnerServiceAsyncStub
) -> None:
    token = pool_pod(db, "pod-a")
    answer = await wait(stub, token, 0.3)
    assert answer.run_id == 0 and not answer.token
    seen = db.execute("SELECT seen_at FROM pool_runners WHERE name = 'pod-a'").fetchone()
    assert seen is not None and seen[0] is not None  # its heartbeat: it may be given a run now


async def test_a_run_given_to_a_waiting_pod_is_handed_over_with_a_new_token(
    db: Conn, stub: runner_pb2_grpc.RunnerServiceAsyncStub
) -> None:
    token = pool_pod(db, "pod-a")
    await wait(stub, token, 0)  # heard from
    run_id, dispatcher_token = starting_run(db)
    heard = db.execute("SELECT seen_at FROM pool_runners WHERE name = 'pod-a'").fetchone()
    waiting = asyncio.create_task(wait(stub, token, 10))
    await eventually(  # the call came in: its heartbeat is newer than the last call's
        lambda: db.execute("SELECT seen_at FROM pool_runners WHERE name = 'pod-a'").fetchone() != heard,
        5,
        what="the waiting call to reach the runner API",
    )
    assert not waiting.done()  # held open while nothing is given
    assert assign(db, run_id) == "pod-a"
    answer = await asyncio.wait_for(waiting, 5)

    assert answer.run_id == run_id and answer.token.startswith("rpr_")
    assert await claim(stub, run_id, dispatcher_token) == grpc.StatusCode.PERMISSION_DENIED  # replaced
    assert await claim(stub, run_id, answer.token) == grpc.StatusCode.OK
    assert run_row(db, run_id)["status"] == RunStatus.RUNNING
    with pytest.raises(grpc.aio.AioRpcError) as spent:  # one run per Pod: the pool token is worth nothing now
        await wait(stub, token, 0)
    assert spent.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_token_that_is_no_pool_pods_is_refused(db: Conn, stub: runner_pb2_grpc.RunnerServiceAsyncStub) -> None:
    _, run_token = starting_run(db)
    for token in (new_run_token(), run_token):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await wait(stub, token, 0)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_run_relaunched_before_the_pod_asked_is_not_taken(
    db: Conn, stub: runner_pb2_grpc.RunnerServiceAsyncStub
) -> None:
    token = pool_pod(db, "pod-a")
    await wait(stub, token, 0)
    run_id, _ = starting_run(db)
    assert assign(db, run_id) == "pod-a"
    db.execute("UPDATE runs SET status = 1 WHERE id = %s", (run_id,))  # back to the queue ...
    relaunch_token = make_starting(db, run_id)  # ... and launched again (attempt 2) elsewhere
    before = run_row(db, run_id)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await wait(stub, token, 0)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert run_row(db, run_id) == before
    assert await claim(stub, run_id, relaunch_token) == grpc.StatusCode.OK  # the new launch's runner still can


async def test_a_silent_pod_gets_no_run_and_a_busy_one_none_twice(
    db: Conn, stub: runner_pb2_grpc.RunnerServiceAsyncStub
) -> None:
    never_called = pool_pod(db, "pod-silent")  # created, never heard from
    assert never_called
    run_id, _ = starting_run(db)
    assert assign(db, run_id) is None  # no waiting Pod: the launcher makes a cold Pod
    token = pool_pod(db, "pod-a")
    await wait(stub, token, 0)
    assert assign(db, run_id) == "pod-a"
    other_run, _ = starting_run(db)
    assert assign(db, other_run) is None  # pod-a has its run
