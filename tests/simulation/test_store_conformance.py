"""The in-memory twins the simulator runs on answer as the real Postgres adapters do: the same checks
run on both (the ownership store's compare-and-set claims and one row per job; the runs store's one
run per idempotency key)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import psycopg
import pytest

from orchestrator import rows
from orchestrator.leadership import LeadershipLost
from orchestrator.ownership_store import OwnershipStore, PostgresOwnershipStore
from queuer_worker.firing import prepare
from queuer_worker.heap import Due
from queuer_worker.runs_store import PostgresRunsStore, RunsStore
from runplane.adapters.db import open_pool
from runplane.basics.stamps import Stamp
from tests.simulation.twins import DefinitionColumns, MemoryDatabase, MemoryOwnershipStore, MemoryRunsStore
from tests.support.queuer import insert_accounts, insert_jobs, update_job

EVERY_MINUTE = "* * * * *"
EVERY_TWO_MINUTES = "*/2 * * * *"
FIRE = 1_700_000_040


class Jobs(Protocol):
    account_id: int  # the account of every job added

    def add(self, cron: str | None = EVERY_MINUTE) -> int: ...

    def change(self, job_id: int, **fields: object) -> None:
        """Set columns (cron, paused) and bump the version, as the API does."""
        ...

    def delete_for_good(self, job_id: int) -> None: ...


@dataclass
class Ports:
    store: OwnershipStore
    runs: RunsStore
    jobs: Jobs
    elect: Callable[[], int]  # a standby's election: the term bumped, as leadership.start_term does


class PostgresJobs:
    def __init__(self, db: psycopg.Connection[tuple[object, ...]]) -> None:
        self.db = db
        [self.account_id] = insert_accounts(db, 1)

    def add(self, cron: str | None = EVERY_MINUTE) -> int:
        return insert_jobs(self.db, 1, cron=cron, accounts=[self.account_id])[0]

    def change(self, job_id: int, **fields: object) -> None:
        if "paused" in fields:
            paused_at = "now()" if fields.pop("paused") else "NULL"
            self.db.execute(f"UPDATE jobs SET paused_at = {paused_at}, version = version + 1 WHERE id = %s", (job_id,))
        if fields:
            update_job(self.db, job_id, **cast(dict[str, Any], fields))

    def delete_for_good(self, job_id: int) -> None:
        self.db.execute("DELETE FROM jobs WHERE id = %s", (job_id,))


class MemoryJobs:
    def __init__(self, db: MemoryDatabase) -> None:
        self.db = db
        self.account_id = 1

    def add(self, cron: str | None = EVERY_MINUTE) -> int:
        return self.db.add_job(self.account_id, cron).id

    def change(self, job_id: int, **fields: object) -> None:
        self.db.change_job(job_id, **fields)

    def delete_for_good(self, job_id: int) -> None:
        del self.db.jobs[job_id]


@pytest.fixture(params=["memory", "postgres"])
async def ports(request: pytest.FixtureRequest) -> AsyncIterator[Ports]:
    if request.param == "memory":
        memory = MemoryDatabase(now=time.time)
        term = memory.bump_term()
        yield Ports(
            MemoryOwnershipStore(memory, term), MemoryRunsStore(memory, "w"), MemoryJobs(memory), memory.bump_term
        )
        return
    database_url: str = request.getfixturevalue("database_url")
    db: psycopg.Connection[tuple[object, ...]] = request.getfixturevalue("db")
    pool = await open_pool(database_url, min_size=1, max_size=2, name="conformance")
    try:

        def elect() -> int:
            [(term,)] = db.execute("UPDATE orchestrator_term SET term = term + 1 RETURNING term").fetchall()
            return int(cast(int, term))

        store = PostgresOwnershipStore(pool, database_url, elect())
        yield Ports(store, PostgresRunsStore(pool), PostgresJobs(db), elect)
    finally:
        await pool.close()


def every_minute(job_id: int, fire: int) -> Due:
    return Due(job_id, fire, EVERY_MINUTE, "UTC")


def _columns(ports: Ports, job: int, *, version: int = 1, cron: str | None = EVERY_MINUTE) -> DefinitionColumns:
    """What the store says of a job added by ``ports.jobs`` (its defaults), as a definition's columns."""
    return (job, ports.jobs.account_id, version, cron, "UTC", 300, "deploy", 0, 0, 0, False)


async def test_a_new_job_is_recorded_once(ports: Ports) -> None:
    job, unscheduled = ports.jobs.add(), ports.jobs.add(cron=None)
    first = await ports.store.assign_new([job, unscheduled], Stamp(1, 1), 100)
    assert first == [rows.Definition(*_columns(ports, job))]
    assert await ports.store.assign_new([job], Stamp(1, 2), 200) == []  # one ownership row per job
    assert await ports.store.ownership([job]) == [rows.Ownership(job, None, "pending", 1, 1, 1, 1)]
    assert await ports.store.pending_definitions([job], None) == [rows.OwnedDefinition(*_columns(ports, job), 100)]
    assert await ports.store.claimed_versions() == [rows.ClaimedVersion(None, job, 1, "pending", 1, 1)]
    assert await ports.store.pending_count() == 1
    assert await ports.store.drift() == []


async def test_a_deposed_leader_writes_nothing(ports: Ports) -> None:
    """Once a standby is elected, every write of the leader before it is refused (it reads still)."""
    job, other = ports.jobs.add(), ports.jobs.add()
    assert len(await ports.store.assign_new([job], Stamp(1, 1), 100)) == 1
    ports.elect()
    writes = [
        ports.store.claim("w1", [job], Stamp(1, 1)),
        ports.store.assign_new([other], Stamp(1, 2), 100),
        ports.store.upsert_pending([job], [1], "w2", Stamp(1, 3), 100),
        ports.store.delete_ownership([job]),
        ports.store.heartbeat("w1", 0, 0),
        ports.store.mark_dead("w1"),
    ]
    for write in writes:
        with pytest.raises(LeadershipLost):
            await write
    assert await ports.store.ownership([job]) == [rows.Ownership(job, None, "pending", 1, 1, 1, 1)]
    assert await ports.store.ownership([other]) == []
    assert await ports.store.workers() == []


async def test_a_claim_takes_only_what_is_pending_under_its_very_stamp(ports: Ports) -> None:
    job = ports.jobs.add()
    await ports.store.assign_new([job], Stamp(1, 1), 100)
    assert await ports.store.claim("w1", [job], Stamp(1, 2)) == []  # another Assign's stamp
    assert await ports.store.claim("w1", [job], Stamp(0, 1)) == []  # an older term
    assert await ports.store.claim("w1", [job], Stamp(1, 1)) == [rows.ClaimTaken(job, 1, 1)]
    assert await ports.store.claim("w2", [job], Stamp(1, 1)) == []  # claimed already
    assert await ports.store.claim("w1", [job], Stamp(1, 1)) == []
    assert await ports.store.owned_by("w1") == [job]
    assert await ports.store.claimed_counts() == {"w1": 1}
    assert await ports.store.claimed_by_worker() == {"w1": [job]}
    assert await ports.store.claimed_versions() == [rows.ClaimedVersion("w1", job, 1, "claimed", 1, 1)]


async def test_an_assign_aimed_at_one_worker_is_claimed_by_it_alone(ports: Ports) -> None:
    job = ports.jobs.add()
    await ports.store.assign_new([job], Stamp(1, 1), 100)
    await ports.store.claim("w1", [job], Stamp(1, 1))
    await ports.store.sent_versions([job], [1], 150)
    await ports.store.upsert_pending([job], [1], "w2", Stamp(1, 5), 300)
    defined = _columns(ports, job)
    # A job that had an owner keeps its fires_after.
    assert await ports.store.definitions([job], "w2", claimed=False) == [
        rows.StampedDefinition(*defined, 150, 1, 5, "pending")
    ]
    assert await ports.store.pending_definitions([job], "w2") == [rows.OwnedDefinition(*defined, 150)]
    assert await ports.store.pending_definitions([job], None) == []
    assert await ports.store.definitions([job], "w2", claimed=True) == []
    assert await ports.store.claim("w3", [job], Stamp(1, 5)) == []
    assert await ports.store.claim("w2", [job], Stamp(1, 5)) != []
    await ports.store.sent_versions([job], [1], 120)
    # fires_after never moves back.
    assert await ports.store.definitions([job], "w2", claimed=True) == [
        rows.StampedDefinition(*defined, 150, 1, 5, "claimed")
    ]


async def test_drift_names_every_job_whose_ownership_is_wrong(ports: Ports) -> None:
    unowned, paused, changed, gone = ports.jobs.add(), ports.jobs.add(), ports.jobs.add(), ports.jobs.add()
    assert await ports.store.drift() == sorted([unowned, paused, changed, gone])
    await ports.store.assign_new([paused, changed, gone], Stamp(1, 1), 100)
    await ports.store.claim("w1", [paused, changed, gone], Stamp(1, 1))
    ports.jobs.change(paused, paused=True)
    ports.jobs.change(changed, cron="*/2 * * * *")
    ports.jobs.delete_for_good(gone)
    assert await ports.store.drift() == sorted([unowned, paused, changed, gone])
    states = {r.job_id: r for r in await ports.store.job_states([unowned, paused, changed, gone])}
    owned_by_w1 = ("w1", "claimed", 1)
    assert states == {
        unowned: rows.JobState(*_columns(ports, unowned), True, False, None, None, None),
        paused: rows.JobState(*_columns(ports, paused, version=2), False, True, *owned_by_w1),
        changed: rows.JobState(*_columns(ports, changed, version=2, cron="*/2 * * * *"), True, True, *owned_by_w1),
        gone: rows.JobState(gone, *(None,) * 10, False, True, *owned_by_w1),  # deleted for good: no definition
    }
    await ports.store.delete_ownership([paused, gone])
    assert await ports.store.owners() == ["w1"]


async def test_a_buried_worker_stays_dead_until_it_registers(ports: Ports) -> None:
    await ports.store.heartbeat("w1", 0, 0)
    await ports.store.mark_dead("w1")
    await ports.store.beat("w1", 3, 7)
    assert await ports.store.workers() == [rows.Worker("w1", "dead")]
    await ports.store.heartbeat("w1", 0, 0)
    assert await ports.store.workers() == [rows.Worker("w1", "alive")]


async def test_stale_pending_is_what_waited_longer_than_the_timeout(ports: Ports) -> None:
    job = ports.jobs.add()
    await ports.store.assign_new([job], Stamp(1, 1), 100)
    assert await ports.store.stale_pending(3600) == []
    await asyncio.sleep(0.01)
    assert await ports.store.stale_pending(0) == [rows.StalePending(job, None, 1, 1)]


async def test_a_fire_queued_twice_is_one_run(ports: Ports) -> None:
    job, paused = ports.jobs.add(), ports.jobs.add()
    ports.jobs.change(paused, paused=True)
    first = await ports.runs.queue_runs(prepare([every_minute(job, FIRE), every_minute(paused, FIRE)]))
    assert first.queued == 1
    again = await ports.runs.queue_runs(prepare([every_minute(job, FIRE), every_minute(job, FIRE + 60)]))
    assert again.queued == 1  # only the new fire


async def test_a_fire_is_queued_only_under_the_schedule_in_force_at_its_instant(ports: Ports) -> None:
    job = ports.jobs.add()
    ports.jobs.change(job, cron=EVERY_TWO_MINUTES)
    future = (int(time.time()) // 120 + 2) * 120  # an occurrence of both schedules, after the change
    queued = await ports.runs.queue_runs(
        prepare([every_minute(job, FIRE), every_minute(job, future), Due(job, future + 120, EVERY_TWO_MINUTES, "UTC")])
    )
    # FIRE came before the change, under the first schedule; the later fires come under the new one.
    assert queued.queued == 2
    assert (await ports.runs.queue_runs(prepare([Due(job, future, EVERY_TWO_MINUTES, "UTC")]))).queued == 1


async def test_a_fire_while_its_job_was_paused_is_not_queued_once_it_is_resumed(ports: Ports) -> None:
    job = ports.jobs.add()
    ports.jobs.change(job, paused=True)
    paused_at = time.time()
    await asyncio.sleep(int(paused_at) + 1.05 - paused_at)  # a whole second passes while it is paused
    ports.jobs.change(job, paused=False)
    result = await ports.runs.queue_runs(prepare([every_minute(job, int(paused_at) + 1)]))
    assert result.queued == 0
