"""Dispatch in batches across accounts, on the real Postgres, Redis and RabbitMQ: many accounts in one
pass, two dispatchers over overlapping accounts, duplicate pickups, an account locked by another
dispatcher, and the serial rule inside a batch."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import psycopg
import pytest
import redis

from dispatcher.launcher import LaunchRequest, LaunchResult
from dispatcher.service import Dispatcher
from runplane.adapters.bus import AmqpBus
from runplane.adapters.db import open_pool
from runplane.adapters.locks import RedisAccountLocks
from runplane.basics.settings import Settings
from runplane.basics.types import AccountId, RunStatus
from runplane.runs.pickups import pickup, pickup_accounts, pickups
from runplane.v1 import bus_pb2
from tests.support.launchers import HoldingLauncher
from tests.support.pickups import waiting_pickup_accounts
from tests.support.polling import eventually, wait_for
from tests.support.records import Conn, create_account, create_job, queue_run, rows, run_row

pytestmark = pytest.mark.usefixtures("_cleanup_bus")


def active_per_account(db: Conn) -> dict[int, int]:
    return {
        int(r["account_id"]): int(r["n"])
        for r in rows(db, "SELECT account_id, count(*) AS n FROM runs WHERE status IN (2, 3) GROUP BY account_id")
    }


def test_many_accounts_are_packed_into_few_pickups() -> None:
    messages = pickups([*range(1200, 0, -1), 7, 7])
    assert [len(m.account_ids) for m in messages] == [500, 500, 200]
    assert [a for m in messages for a in m.account_ids] == list(range(1, 1201))
    # A Pickup of one account from an older sender is read as well.
    assert pickup_accounts(bus_pb2.Pickup(account_id=9)) == [9]
    assert pickup_accounts(pickup([3, 4])) == [3, 4]


async def test_one_pass_starts_the_runs_of_many_accounts_within_each_accounts_slots(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    accounts = [create_account(db, run_slots=slots, memory_mb=256 * slots) for slots in (1, 2, 3) * 10]
    queued = {
        account: [queue_run(db, create_job(db, account, name=f"job {i}")) for i in range(3)] for account in accounts
    }
    launcher = HoldingLauncher()
    pool = await open_pool(settings.database_url)
    try:
        dispatcher = Dispatcher(settings, pool, None, locks, launcher, dispatcher_id="d1")
        await dispatcher.on_pickups([pickup(accounts[:15]), pickup(accounts[10:])])
    finally:
        await pool.close()
    slots = {
        account: int(rows(db, "SELECT run_slots FROM accounts WHERE id = %s", (account,))[0]["run_slots"])
        for account in accounts
    }
    assert active_per_account(db) == slots  # every account filled exactly its slots
    for account, runs in queued.items():
        assert [run_row(db, r)["status"] for r in runs] == [RunStatus.STARTING] * slots[account] + [
            RunStatus.QUEUED
        ] * (3 - slots[account])
    started = rows(db, "SELECT id, account_id, runner_token_hash, dispatcher_id FROM runs WHERE status = 2")
    assert len({bytes(r["runner_token_hash"]) for r in started}) == len(started)  # a token per run
    assert {r["dispatcher_id"] for r in started} == {"d1"}
    # Each launch carries its own account's memory and its own token.
    memory = {account: slots[account] * 256 for account in accounts}
    assert sorted(r.run_id for r in launcher.requests) == sorted(int(r["id"]) for r in started)
    assert all(r.memory_mb == memory[r.account_id] and r.token for r in launcher.requests)
    assert len({r.token for r in launcher.requests}) == len(launcher.requests)


async def test_two_dispatchers_over_overlapping_accounts_never_exceed_a_slot_or_start_a_run_twice(
    db: Conn, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    accounts = [create_account(db, run_slots=2) for _ in range(40)]
    for account in accounts:
        for i in range(4):
            queue_run(db, create_job(db, account, name=f"job {i}"))
    launchers = [HoldingLauncher(), HoldingLauncher()]
    # Each dispatcher has Redis locks of its own prefix, so the two really meet on the account rows.
    own_locks = [
        RedisAccountLocks.from_url(settings.redis_url, prefix=f"{settings.redis_prefix}:{i}", ttl_ms=5000)
        for i in range(2)
    ]
    pool = await open_pool(settings.database_url, max_size=4)
    try:
        dispatchers = [
            Dispatcher(settings, pool, None, own_locks[i], launchers[i], dispatcher_id=f"d{i}") for i in range(2)
        ]
        with caplog.at_level(logging.INFO, logger="dispatcher.service"):
            for _ in range(3):
                await asyncio.gather(
                    dispatchers[0].dispatch([AccountId(a) for a in accounts[:30]]),
                    dispatchers[1].dispatch([AccountId(a) for a in reversed(accounts[10:])]),
                )
    finally:
        await pool.close()
        for lock in own_locks:
            await lock.close()
    # No pass was lost to a deadlock or a lock timeout.
    assert not [r for r in caplog.records if r.name == "dispatcher.service" and r.levelno >= logging.INFO]
    assert active_per_account(db) == dict.fromkeys(accounts, 2)
    launched = Counter(r.run_id for launcher in launchers for r in launcher.requests)
    assert len(launched) == 80 and set(launched.values()) == {1}


async def test_a_duplicate_or_stale_pickup_changes_nothing(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    accounts = [create_account(db, run_slots=1) for _ in range(3)]
    runs = [queue_run(db, create_job(db, account)) for account in accounts]
    launcher = HoldingLauncher()
    pool = await open_pool(settings.database_url)
    try:
        dispatcher = Dispatcher(settings, pool, None, locks, launcher)
        twice = pickup(accounts)
        await dispatcher.on_pickups([twice, twice, pickup([accounts[0]])])
        before = rows(db, "SELECT id, status, dispatched_at, launch_attempts, runner_token_hash FROM runs ORDER BY id")
        await dispatcher.on_pickups([twice])  # delivered again later
    finally:
        await pool.close()
    assert sorted(r.run_id for r in launcher.requests) == runs
    assert (
        rows(db, "SELECT id, status, dispatched_at, launch_attempts, runner_token_hash FROM runs ORDER BY id") == before
    )


async def test_an_account_another_dispatcher_holds_is_handed_back_and_started_later(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    held, free = create_account(db, run_slots=1), create_account(db, run_slots=1)
    first, second = (queue_run(db, create_job(db, held, name=f"job {i}")) for i in range(2))
    other = queue_run(db, create_job(db, free))
    pool = await open_pool(settings.database_url)
    bus = await AmqpBus.connect(settings.amqp_url)
    row_holder = psycopg.connect(settings.database_url)
    try:
        holder = Dispatcher(settings, pool, bus, locks, HoldingLauncher(), dispatcher_id="holder")
        later = Dispatcher(settings, pool, bus, locks, HoldingLauncher(), dispatcher_id="later")
        # The holder's pass waits inside its transaction (the account row is held here), its Redis lock taken.
        row_holder.execute("SELECT id FROM accounts WHERE id = %s FOR UPDATE", (held,))
        holding = asyncio.create_task(holder.dispatch([AccountId(held)]))
        lock_key = locks.key(held)
        await asyncio.to_thread(wait_for, lambda: _redis_has(settings, lock_key), timeout=10, what="the holder's lock")
        # Meanwhile a pickup for both accounts reaches the other dispatcher: it starts what it can.
        assert [s.run_id for s in await later.dispatch([AccountId(held), AccountId(free)])] == [other]
        row_holder.commit()
        assert [s.run_id for s in await holding] == [first]
        # The holder hands the account back: a Pickup for it waits on the bus.
        assert await waiting_pickup_accounts(settings) == [held]
        db.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (first,))
        await later.on_pickups([pickup([held])])
    finally:
        row_holder.close()
        await bus.close()
        await pool.close()
    assert run_row(db, second)["status"] == RunStatus.STARTING
    assert run_row(db, second)["dispatcher_id"] == "later"


def _redis_has(settings: Settings, key: str) -> bool:
    client = redis.Redis.from_url(settings.redis_url)
    try:
        return bool(client.exists(key))
    finally:
        client.close()


async def test_the_serial_rule_holds_inside_a_batch(db: Conn, settings: Settings, locks: RedisAccountLocks) -> None:
    accounts = [create_account(db, run_slots=5) for _ in range(4)]
    jobs = {account: create_job(db, account) for account in accounts}
    runs = {account: [queue_run(db, jobs[account], trigger="api") for _ in range(3)] for account in accounts}
    busy = accounts[0]
    db.execute("UPDATE runs SET status = 3 WHERE id = %s", (runs[busy][0],))
    launcher = HoldingLauncher()
    pool = await open_pool(settings.database_url)
    try:
        await Dispatcher(settings, pool, None, locks, launcher).dispatch([AccountId(a) for a in accounts])
    finally:
        await pool.close()
    assert sorted(r.run_id for r in launcher.requests) == sorted(runs[a][0] for a in accounts[1:])
    waiting = [run_row(db, r)["waiting_reason"] for a in accounts for r in runs[a][1:]]
    assert waiting == ["job_already_running"] * 8


class _GatedLauncher(HoldingLauncher):
    """Holds every launch until released, counting how many are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.peak = 0
        self.go = asyncio.Event()

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await self.go.wait()
            return await super().launch(request)
        finally:
            self.in_flight -= 1


async def test_launches_run_concurrently_within_the_bound_and_each_run_is_launched_once(
    db: Conn, settings: Settings, locks: RedisAccountLocks
) -> None:
    accounts = [create_account(db, run_slots=2) for _ in range(6)]
    runs = [queue_run(db, create_job(db, account, name=f"job {i}")) for account in accounts for i in range(2)]
    settings.dispatcher.launch_concurrency = 3
    launcher = _GatedLauncher()
    pool = await open_pool(settings.database_url)
    try:
        dispatcher = Dispatcher(settings, pool, None, locks, launcher)
        # Two passes at once share the process's bound.
        passes = asyncio.gather(
            dispatcher.dispatch([AccountId(a) for a in accounts[:3]]),
            dispatcher.dispatch([AccountId(a) for a in accounts[3:]]),
        )
        await eventually(lambda: launcher.in_flight == 3, 10, what="three launches in flight")
        launcher.go.set()
        started = await passes
    finally:
        await pool.close()
    assert launcher.peak == 3  # never more in flight than the bound, across both passes
    assert sorted(r.run_id for r in launcher.requests) == sorted(runs)
    assert sorted(run.run_id for done in started for run in done) == sorted(runs)
    recorded = rows(db, "SELECT id, pod_name FROM runs ORDER BY id")
    assert [(r["id"], r["pod_name"]) for r in recorded] == [(run, f"held-{run}") for run in sorted(runs)]
