"""The runner through a runner-API outage, and after losing its lease.

A short interruption (the API process stopped with SIGSTOP for a few seconds, well inside the
lease) must not fail the run: the runner retries its writes and the run ends as if nothing
happened, every log line stored once. A runner whose lease was taken over stops its steps and
writes nothing more.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from runner.service import run
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from tests.support.polling import eventually
from tests.support.processes import Services, wait_for_port
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run, rows, run_row
from tests.support.stalling_proxy import StallingProxy

pytestmark = pytest.mark.slow


def runner_settings(settings: Settings) -> Settings:
    # Renewals every second, a 10 s lease: a 3 s outage spans several renewals and log flushes.
    runner = settings.runner.model_copy(update={"heartbeat_interval": 1.0, "lease_seconds": 10.0})
    return settings.model_copy(update={"runner": runner})


def start_run(db: Conn, settings: Settings, steps: list[str]) -> tuple[int, asyncio.Task[int]]:
    """A run of a new account's job, made starting and given to a runner in this process."""
    run_id = queue_run(db, create_job(db, create_account(db), steps=steps))
    return run_id, asyncio.create_task(run(settings, run_id, make_starting(db, run_id)))


async def claimed(db: Conn, run_id: int) -> None:
    await eventually(lambda: run_row(db, run_id)["status"] == RunStatus.RUNNING, 30, what="the claim")


@pytest.mark.parametrize("outage", ["stopped", "restarted"])
async def test_a_short_api_outage_does_not_fail_the_run(
    db: Conn, services: Services, settings: Settings, outage: str
) -> None:
    settings = runner_settings(settings)
    api = services.start("api", name="api", RUNPLANE_RUNNER__LEASE_SECONDS="10")
    wait_for_port(settings.runner.api_address)
    steps = ["for i in 1 2 3 4 5 6 7 8; do echo line $i; sleep 0.5; done", "echo second step"]
    run_id, runner = start_run(db, settings, steps)
    try:
        await claimed(db, run_id)
        await asyncio.sleep(1.0)
        if outage == "stopped":  # the runner API hangs: calls wait, then are answered
            os.kill(api.pid, signal.SIGSTOP)
            await asyncio.sleep(3.0)
            os.kill(api.pid, signal.SIGCONT)
        else:  # the runner API is gone (connections refused), then back: calls are retried
            api.kill()
            api.wait()
            await asyncio.sleep(2.0)
            api = services.start("api", name="api-again")
        assert await asyncio.wait_for(runner, timeout=60) == 0
    finally:
        if api.poll() is None:
            os.kill(api.pid, signal.SIGCONT)
        if not runner.done():
            runner.cancel()
    row = run_row(db, run_id)
    assert row["status"] == RunStatus.SUCCESS, row["status_message"]
    text = "".join(
        r["text"] for r in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,))
    )
    assert text == "".join(f"line {i}\n" for i in range(1, 9)) + "second step\n"


async def test_a_connection_gone_silent_is_noticed_and_made_again(
    db: Conn, services: Services, settings: Settings
) -> None:
    # The runner's connection stops carrying anything, and nothing closes it (a NAT or conntrack
    # entry dropped on the way from a Pod). Keepalive pings find it dead and the runner connects
    # again; without them every call would wait out its deadline on it until the lease was gone.
    services.start("api", name="api", RUNPLANE_RUNNER__LEASE_SECONDS="40")
    wait_for_port(settings.runner.api_address)
    proxy = StallingProxy(settings.runner.api_address)
    await proxy.start()
    runner_settings = settings.model_copy(
        update={
            "runner": settings.runner.model_copy(
                update={"api_address": proxy.address, "heartbeat_interval": 1.0, "lease_seconds": 40.0}
            )
        }
    )
    run_id, runner = start_run(db, runner_settings, ["for i in $(seq 1 30); do echo line $i; sleep 0.5; done"])
    try:
        await claimed(db, run_id)
        await asyncio.sleep(1.0)
        proxy.stall()
        assert await asyncio.wait_for(runner, timeout=60) == 0
    finally:
        if not runner.done():
            runner.cancel()
        await proxy.close()
    row = run_row(db, run_id)
    assert row["status"] == RunStatus.SUCCESS, row["status_message"]
    assert proxy.connections >= 2  # connected again after the stall
    text = "".join(
        r["text"] for r in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,))
    )
    assert text == "".join(f"line {i}\n" for i in range(1, 31))


async def test_a_runner_that_lost_its_lease_writes_nothing_more(
    db: Conn, services: Services, settings: Settings
) -> None:
    settings = runner_settings(settings)
    services.start("api", name="api", RUNPLANE_RUNNER__LEASE_SECONDS="120")
    wait_for_port(settings.runner.api_address)
    run_id, runner = start_run(db, settings, ["while true; do echo tick; sleep 0.1; done", "echo never"])
    try:
        await eventually(
            lambda: rows(db, "SELECT 1 FROM run_log_chunks WHERE run_id = %s", (run_id,)),
            30,
            what="output",
        )
        db.execute("UPDATE runs SET lease_owner = 'a-rescuer' WHERE id = %s", (run_id,))  # taken over
        # Found out at the next poll or write: its two-minute lease is far from expiring.
        assert await asyncio.wait_for(runner, timeout=15) == 1  # no outcome: it was not ours any more
    finally:
        if not runner.done():
            runner.cancel()
    before = (
        run_row(db, run_id),
        rows(db, "SELECT * FROM run_steps WHERE run_id = %s ORDER BY step_index", (run_id,)),
        rows(db, "SELECT seq FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,)),
    )
    assert before[0]["status"] == RunStatus.RUNNING and before[0]["lease_owner"] == "a-rescuer"
    assert [s["status"] for s in before[1]] == [RunStatus.RUNNING, RunStatus.QUEUED]  # step 0 never finished by it
    await asyncio.sleep(1.0)
    after = (
        run_row(db, run_id),
        rows(db, "SELECT * FROM run_steps WHERE run_id = %s ORDER BY step_index", (run_id,)),
        rows(db, "SELECT seq FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,)),
    )
    assert after == before
