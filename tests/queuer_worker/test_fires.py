"""Cron runs queued by real processes across two minute boundaries.

One scenario, to keep the suite short (each boundary is up to a minute away):

- boundary 1, normal operation: every job due is queued once with trigger lag p99 <= 1 s, and a
  Pickup goes out for each account; updates made just before (cron, time zone, deactivate, soft
  and hard delete) were applied by the owners within 2 s and decide what fires.
- boundary 2, under churn: a worker is killed with SIGKILL one second before it and a fourth
  worker joins around it. The dead worker's jobs are reassigned within 3 heartbeat intervals, its
  fire that fell in the gap is queued exactly once, the jobs are rebalanced within ±10%, and no
  fire is missed or duplicated across the moves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aio_pika
import pytest

from runplane.bus import Topology, decode
from runplane.settings import Settings
from runplane.v1 import bus_pb2
from tests.orchestrator.test_ownership import NEVER_SOON, all_claimed, within, workers_agree
from tests.support.queuer import (
    FAST,
    Cluster,
    Db,
    claimed_counts,
    duplicate_keys,
    insert_accounts,
    insert_jobs,
    ownership,
    update_job,
    wait_for,
)

pytestmark = pytest.mark.slow

HEARTBEAT = float(FAST["RUNPLANE_ORCHESTRATOR__HEARTBEAT_INTERVAL"])
EVERY_MINUTE = "* * * * *"


@pytest.fixture
async def cluster(settings: Settings, service_env: dict[str, str], db: Db) -> AsyncIterator[Cluster]:
    c = Cluster(settings, service_env)
    try:
        yield c
    finally:
        await c.cleanup(db)


async def sleep_until(moment: float) -> None:
    """The scenario's own timeline: act at a planned instant."""
    await asyncio.sleep(max(0.0, moment - time.time()))


def next_boundary(after: float) -> int:
    return (int(after) // 60 + 1) * 60


def runs_at(db: Db, boundary: int) -> dict[int, int]:
    rows = db.execute(
        "SELECT job_id, count(*) FROM runs WHERE trigger = 'schedule' AND scheduled_at = to_timestamp(%s)"
        " GROUP BY job_id",
        (boundary,),
    )
    return {int(job_id): int(n) for job_id, n in rows}


def lag_p99(db: Db, boundary: int) -> float:
    row = db.execute(
        "SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM queued_at - scheduled_at))"
        " FROM runs WHERE scheduled_at = to_timestamp(%s)",
        (boundary,),
    ).fetchone()
    assert row is not None and row[0] is not None
    return float(row[0])


async def pickups(settings: Settings) -> set[int]:
    """Accounts named by the Pickups waiting on the pickup queue (nobody consumes it here)."""
    connection = await aio_pika.connect(settings.amqp_url)
    accounts: set[int] = set()
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(Topology(settings.bus_prefix).pickup, durable=True)
        while (message := await queue.get(fail=False, no_ack=True)) is not None:
            pickup = decode(message.type, message.body)
            assert isinstance(pickup, bus_pb2.Pickup)
            accounts.add(pickup.account_id)
    finally:
        await connection.close()
    return accounts


@pytest.mark.timeout(200)  # two minute boundaries
async def test_cron_runs_on_time_through_updates_failover_and_rebalancing(
    cluster: Cluster, db: Db, settings: Settings
) -> None:
    accounts = insert_accounts(db, 10)
    steady = insert_jobs(db, 300, cron=EVERY_MINUTE, accounts=accounts)
    to_yearly, to_deactivate, to_soft_delete, to_hard_delete = insert_jobs(db, 4, cron=EVERY_MINUTE, accounts=accounts)
    to_every_minute = insert_jobs(db, 1, cron=NEVER_SOON, accounts=accounts)[0]
    cluster.orchestrator()
    workers = [cluster.worker() for _ in range(3)]
    await wait_for(lambda: all_claimed(db, 305) and workers_agree(db), 40, what="jobs claimed")

    b1 = next_boundary(time.time() + 12)
    # Fires at minute (b1 + 30) of every hour in UTC: in Asia/Kolkata (UTC+05:30) that is b1 itself.
    kolkata_minute = (datetime.fromtimestamp(b1, UTC).minute + 30) % 60
    to_kolkata = insert_jobs(db, 1, cron=f"{kolkata_minute} * * * *", accounts=accounts)[0]
    await wait_for(lambda: all_claimed(db, 306) and workers_agree(db), 10, what="the new job claimed")

    # -- updates, applied by the owners within 2 s -----------------------------------------------
    changed_at = time.monotonic()
    update_job(db, to_yearly, cron=NEVER_SOON)
    update_job(db, to_every_minute, cron=EVERY_MINUTE)
    update_job(db, to_kolkata, timezone="Asia/Kolkata")
    db.execute("UPDATE jobs SET deactivated_at = now(), version = version + 1 WHERE id = %s", (to_deactivate,))
    db.execute("UPDATE jobs SET deleted_at = now(), version = version + 1 WHERE id = %s", (to_soft_delete,))
    db.execute("DELETE FROM jobs WHERE id = %s", (to_hard_delete,))
    gone = {to_deactivate, to_soft_delete, to_hard_delete}
    await wait_for(
        lambda: gone.isdisjoint(ownership(db)) and all_claimed(db, 303) and workers_agree(db),
        2.0,
        interval=0.05,
        what="the owners to apply the updates",
    )
    assert time.monotonic() - changed_at <= 2.0

    # -- boundary 1: on time ---------------------------------------------------------------------
    assert time.time() < b1 - 1, "setup overran the first boundary"
    expected = {*steady, to_every_minute, to_kolkata}
    await wait_for(lambda: set(runs_at(db, b1)) >= expected, b1 - time.time() + 10, what="runs at boundary 1")
    fired = runs_at(db, b1)
    assert set(fired) == expected  # nothing for the yearly, deactivated or deleted jobs
    assert set(fired.values()) == {1}
    assert lag_p99(db, b1) <= 1.0
    assert await pickups(settings) >= set(accounts)

    # -- boundary 2: a worker dies just before it, another joins around it -----------------------
    b2 = b1 + 60
    victim = workers[0]
    await sleep_until(b2 - 3.0)
    cluster.worker()
    await sleep_until(b2 - 1.0)
    victim_id = db.execute(
        "SELECT worker_id FROM queuer_workers WHERE worker_id LIKE %s", (f"%-{victim.pid}-%",)
    ).fetchone()[0]
    victim_jobs = {j for j, (w, _) in ownership(db).items() if w == victim_id}
    assert victim_jobs
    killed_at = time.monotonic()
    cluster.kill9(victim)
    await wait_for(
        lambda: victim_id not in {w for w, _ in ownership(db).values()},
        3 * HEARTBEAT + 1.0,
        interval=0.05,
        what="the dead worker's jobs to be reassigned",
    )
    reassigned_after = time.monotonic() - killed_at
    assert reassigned_after <= 3 * HEARTBEAT + 1.0  # silent for 3 intervals, plus the detection tick

    expected_b2 = {*steady, to_every_minute}
    await wait_for(lambda: set(runs_at(db, b2)) >= expected_b2, 20, what="runs at boundary 2")
    await wait_for(
        lambda: len(claimed_counts(db)) == 3 and within(claimed_counts(db), 303 / 3) and workers_agree(db),
        30,
        what="rebalanced over the three live workers",
    )
    fired = runs_at(db, b2)
    assert set(fired) - {to_kolkata} == expected_b2  # the gap fire of the dead worker's jobs too
    assert set(fired.values()) == {1}
    assert victim_jobs & set(fired)
    assert duplicate_keys(db) == 0
    assert all(runs_at(db, b1)[j] == 1 for j in expected)
