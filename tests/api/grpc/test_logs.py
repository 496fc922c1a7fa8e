"""StreamRunLogs: reading what is there, following a live run to its end, clients and servers going away.

The runner is simulated by writing its rows directly.
"""

from __future__ import annotations

import asyncio

import grpc

from api.process import RunningApi
from runplane.v1 import runs_pb2
from tests.api.conftest import AsyncDb, Client, deploy_job
from tests.support.polling import eventually


async def queued_run(client: Client) -> int:
    job = await client.jobs.CreateJob(deploy_job())
    return (await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))).id


async def write_chunk(adb: AsyncDb, run_id: int, seq: int, text: str, step: int = 0) -> None:
    await adb.execute(
        "INSERT INTO run_log_chunks (run_id, seq, step_index, text) VALUES (%s, %s, %s, %s)", (run_id, seq, step, text)
    )


async def collect(client: Client, request: runs_pb2.StreamRunLogsRequest) -> list[runs_pb2.LogChunk]:
    return [chunk async for chunk in client.runs.StreamRunLogs(request)]


async def test_without_follow_the_stream_returns_what_is_there(client: Client, adb: AsyncDb) -> None:
    run_id = await queued_run(client)
    for seq in (1, 2, 3):
        await write_chunk(adb, run_id, seq, f"line {seq}\n", step=seq // 2)
    chunks = await asyncio.wait_for(collect(client, runs_pb2.StreamRunLogsRequest(run_id=run_id)), 10)
    assert [(c.seq, c.step_index, c.text) for c in chunks] == [
        (1, 0, "line 1\n"),
        (2, 1, "line 2\n"),
        (3, 1, "line 3\n"),
    ]
    assert all(c.created_at.seconds > 0 for c in chunks)
    resumed = await collect(client, runs_pb2.StreamRunLogsRequest(run_id=run_id, after_seq=2))
    assert [c.seq for c in resumed] == [3]


async def test_long_logs_arrive_whole_and_in_order(client: Client, adb: AsyncDb) -> None:
    run_id = await queued_run(client)
    async with adb.cursor() as cur:
        await cur.executemany(
            "INSERT INTO run_log_chunks (run_id, seq, step_index, text) VALUES (%s, %s, 0, %s)",
            [(run_id, seq, f"{seq}\n") for seq in range(1, 1201)],
        )
    chunks = await asyncio.wait_for(collect(client, runs_pb2.StreamRunLogsRequest(run_id=run_id)), 20)
    assert [c.seq for c in chunks] == list(range(1, 1201))


async def test_follow_streams_a_live_run_until_it_ends(client: Client, adb: AsyncDb) -> None:
    run_id = await queued_run(client)
    await write_chunk(adb, run_id, 1, "starting\n")
    received: list[runs_pb2.LogChunk] = []
    seen = asyncio.Event()

    async def follow() -> None:
        async for chunk in client.runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=run_id, follow=True)):
            received.append(chunk)
            seen.set()

    follower = asyncio.create_task(follow(), name="follow-logs")
    try:
        await asyncio.wait_for(seen.wait(), 10)
        await adb.execute("UPDATE runs SET status = 3, started_at = now() WHERE id = %s", (run_id,))
        for seq in (2, 3):
            seen.clear()
            await write_chunk(adb, run_id, seq, f"step {seq}\n", step=1)
            await asyncio.wait_for(seen.wait(), 10)
        assert not follower.done(), "the stream ended while the run was still running"
        # The runner writes its last chunk, then the final status.
        await write_chunk(adb, run_id, 4, "done\n", step=1)
        await adb.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (run_id,))
        await asyncio.wait_for(follower, 10)
    finally:
        follower.cancel()
    assert [c.seq for c in received] == [1, 2, 3, 4]
    assert received[-1].text == "done\n"


async def test_following_a_finished_run_returns_its_logs_and_ends(client: Client, adb: AsyncDb) -> None:
    run_id = await queued_run(client)
    await write_chunk(adb, run_id, 1, "only line\n")
    await adb.execute("UPDATE runs SET status = 20, finished_at = now() WHERE id = %s", (run_id,))
    chunks = await asyncio.wait_for(collect(client, runs_pb2.StreamRunLogsRequest(run_id=run_id, follow=True)), 10)
    assert [c.text for c in chunks] == ["only line\n"]


async def test_a_follower_that_goes_away_leaves_the_server_serving(
    api: RunningApi, client: Client, adb: AsyncDb
) -> None:
    run_id = await queued_run(client)
    await write_chunk(adb, run_id, 1, "x\n")
    stream = client.runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=run_id, follow=True))
    first = await asyncio.wait_for(stream.read(), 10)
    assert isinstance(first, runs_pb2.LogChunk) and first.seq == 1
    stream.cancel()
    # The server's handler ends (the leak check of the test harness would see it otherwise) and
    # its pooled connection comes back: every connection can still be used.
    for _ in range(12):
        assert (await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))).id == run_id

    def pool_idle() -> bool:
        stats = api.pool.get_stats()
        return stats["pool_available"] == stats["pool_size"]

    await eventually(pool_idle, 5, what="every pooled connection back")


async def test_followers_end_cleanly_when_the_server_drains(api: RunningApi, client: Client, adb: AsyncDb) -> None:
    run_id = await queued_run(client)
    await write_chunk(adb, run_id, 1, "x\n")
    stream = client.runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=run_id, follow=True))
    first = await asyncio.wait_for(stream.read(), 10)
    assert isinstance(first, runs_pb2.LogChunk) and first.seq == 1
    # A follower holding the drain would keep it for the whole minute of grace.
    await asyncio.wait_for(api.stop(grace=60.0), 10)
    assert await stream.read() is grpc.aio.EOF  # type: ignore[attr-defined]  # grpc-stubs do not declare grpc.aio.EOF
    assert await stream.code() is grpc.StatusCode.OK
