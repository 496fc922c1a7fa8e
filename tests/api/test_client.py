"""The command-line client (``python -m api.client``) against the in-process server."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from api.server import RunningApi
from tests.api.conftest import AsyncDb, Client


def client_env(service_env: dict[str, str], api: RunningApi, token: str) -> dict[str, str]:
    return {
        **service_env,
        "RUNPLANE_TOKEN": token,
        "RUNPLANE_API__HOST": "127.0.0.1",
        "RUNPLANE_API__PORT": str(api.port),
    }


async def start(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "api.client",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish(proc: asyncio.subprocess.Process, timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def run_client(env: dict[str, str], *args: str) -> dict[str, Any]:
    code, out, err = await finish(await start(env, *args))
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


async def test_create_trigger_get_list_cancel(
    api: RunningApi, client: Client, service_env: dict[str, str], adb: AsyncDb
) -> None:
    env = client_env(service_env, api, client.token)
    job = await run_client(
        env, "create-job", "--name", "cli", "--step", "echo 1", "--step", "echo 2", "--cron", "0 6 * * *",
        "--timezone", "Europe/Amsterdam",
    )  # fmt: skip
    assert job["name"] == "cli" and job["steps"] == ["echo 1", "echo 2"]
    assert job["triggers"]["schedule"] == {"cron": "0 6 * * *", "timezone": "Europe/Amsterdam"}
    run = await run_client(env, "trigger", job["id"])
    assert run["status"] == "RUN_STATUS_QUEUED" and run["jobId"] == job["id"]
    assert (await run_client(env, "get-run", run["id"]))["id"] == run["id"]
    listed = await run_client(env, "list-runs", "--job", job["id"])
    assert [r["id"] for r in listed["runs"]] == [run["id"]]
    cancelled = await run_client(env, "cancel", run["id"])
    assert cancelled["status"] == "RUN_STATUS_CANCELLED"
    code, _, err = await finish(await start({**env, "RUNPLANE_TOKEN": "wrong"}, "get-run", run["id"]))
    assert code == 1 and "UNAUTHENTICATED" in err


async def test_trigger_follow_prints_the_logs_then_the_outcome(
    api: RunningApi, client: Client, service_env: dict[str, str], adb: AsyncDb
) -> None:
    env = client_env(service_env, api, client.token)
    job = await run_client(env, "create-job", "--name", "followed", "--step", "echo hi")
    proc = await start(env, "trigger", job["id"], "--follow")
    try:
        deadline = time.monotonic() + 30
        while (run_id := await _run_of(adb, int(job["id"]))) is None:
            assert time.monotonic() < deadline and proc.returncode is None, "the client did not trigger a run"
            await asyncio.sleep(0.05)
        await adb.execute("UPDATE runs SET status = 3, started_at = now() WHERE id = %s", (run_id,))
        await adb.execute(
            "INSERT INTO run_log_chunks (run_id, seq, step_index, text) VALUES (%s, 1, 0, 'hi from the runner\n')",
            (run_id,),
        )
        await adb.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (run_id,))
    finally:
        code, out, err = await finish(proc)
    assert code == 0, err
    assert "hi from the runner" in err
    assert json.loads(out)["status"] == "RUN_STATUS_SUCCESS"


async def _run_of(adb: AsyncDb, job_id: int) -> int | None:
    cur = await adb.execute("SELECT id FROM runs WHERE job_id = %s", (job_id,))
    row = await cur.fetchone()
    return None if row is None else int(row[0])
