"""The in-memory twins the simulator runs on answer as the real Postgres adapters do: the same checks
run on both (the ownership store's compare-and-set claims and one row per job; the runs store's one
run per idempotency key)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol, cast

import psycopg
import pytest

from orchestrator.leadership import LeadershipLost
from orchestrator.ownership_store import OwnershipStore, PostgresOwnershipStore
from queuer_worker.firing import prepare
from queuer_worker.runs_store import PostgresRunsStore, RunsStore
from runplane.adapters.db import open_pool
from runplane.basics.stamps import Stamp
from tests.simulation.twins import MemoryDatabase, MemoryOwnershipStore, MemoryRunsStore
from tests.support.queuer import insert_jobs, update_job

EVERY_MINUTE = "* * * * *"
FIRE = 1_700_000_040


class Jobs(Protocol):
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

    def add(self, cron: str | None = EVERY_MINUTE) -> int:
        return insert_jobs(self.db, 1, cron=cron)[0]

    def change(self, job_id: int, **fields: object) -> None:
        if fields.pop("paused", False):
            self.db.execute("UPDATE jobs SET paused_at = now(), version = version + 1 WHERE id = %s", (job_id,))
        if fields:
            update_job(self.db, job_id, **fields)

    def delete_for_good(self, job_id: int) -> None:
        self.db.execute("DELETE FROM jobs WHERE id = %s", (job_id,))


class MemoryJobs:
    def __init__(self, db: MemoryDatabase) -> None:
        self.db = db

    def add(self, cron: str | None = EVERY_MINUTE) -> int:
        return self.db.add_job(1, cron).id

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


async def test_a_new_job_is_recorded_once(ports: Ports) -> None:
    job, unscheduled = ports.jobs.add(), ports.jobs.add(cron=None)
    first = await ports.store.assign_new([job, unscheduled], Stamp(1, 1), 100)
    assert [r["job_id"] for r in first] == [job]
    assert await ports.store.assign_new([job], Stamp(1, 2), 200) == []  # one ownership row per job
    [row] = await ports.store.ownership([job])
    assert (row["worker_id"], row["state"], row["term"], row["clock"]) == (None, "pending", 1, 1)
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
    [still] = await ports.store.ownership([job])
    assert (still["worker_id"], still["state"], still["clock"]) == (None, "pending", 1)
    assert await ports.store.ownership([other]) == []
    assert await ports.store.workers() == []


async def test_a_claim_takes_only_what_is_pending_under_its_very_stamp(ports: Ports) -> None:
    job = ports.jobs.add()
    await ports.store.assign_new([job], Stamp(1, 1), 100)
    assert await ports.store.claim("w1", [job], Stamp(1, 2)) == []  # another Assign's stamp
    assert await ports.store.claim("w1", [job], Stamp(0, 1)) == []  # an older term
    [taken] = await ports.store.claim("w1", [job], Stamp(1, 1))
    assert (taken["job_id"], taken["version"], taken["job_version"]) == (job, 1, 1)
    assert await ports.store.claim("w2", [job], Stamp(1, 1)) == []  # claimed already
    assert await ports.store.claim("w1", [job], Stamp(1, 1)) == []
    assert await ports.store.owned_by("w1") == [job]
    assert await ports.store.claimed_counts() == {"w1": 1}
    assert await ports.store.claimed_by_worker() == {"w1": [job]}


async def test_an_assign_aimed_at_one_worker_is_claimed_by_it_alone(ports: Ports) -> None:
    job = ports.jobs.add()
    await ports.store.assign_new([job], Stamp(1, 1), 100)
    await ports.store.claim("w1", [job], Stamp(1, 1))
    await ports.store.sent_versions([job], [1], 150)
    await ports.store.upsert_pending([job], [1], "w2", Stamp(1, 5), 300)
    [row] = await ports.store.definitions([job], "w2", claimed=False)
    assert row["fires_after"] == 150  # a job that had an owner keeps it
    assert await ports.store.definitions([job], "w2", claimed=True) == []
    assert await ports.store.claim("w3", [job], Stamp(1, 5)) == []
    assert await ports.store.claim("w2", [job], Stamp(1, 5)) != []
    await ports.store.sent_versions([job], [1], 120)
    [row] = await ports.store.definitions([job], "w2", claimed=True)
    assert row["fires_after"] == 150  # never moves back


async def test_drift_names_every_job_whose_ownership_is_wrong(ports: Ports) -> None:
    unowned, paused, changed, gone = ports.jobs.add(), ports.jobs.add(), ports.jobs.add(), ports.jobs.add()
    assert await ports.store.drift() == sorted([unowned, paused, changed, gone])
    await ports.store.assign_new([paused, changed, gone], Stamp(1, 1), 100)
    await ports.store.claim("w1", [paused, changed, gone], Stamp(1, 1))
    ports.jobs.change(paused, paused=True)
    ports.jobs.change(changed, cron="*/2 * * * *")
    ports.jobs.delete_for_good(gone)
    assert await ports.store.drift() == sorted([unowned, paused, changed, gone])
    states = {r["job_id"]: r for r in await ports.store.job_states([paused, changed, gone])}
    assert (states[paused]["schedulable"], states[paused]["owned"]) == (False, True)
    assert (states[changed]["version"], states[changed]["sent_version"]) == (2, 1)
    assert (states[gone]["schedulable"], states[gone]["owned"], states[gone]["worker_id"]) == (False, True, "w1")
    await ports.store.delete_ownership([paused, gone])
    assert await ports.store.owners() == ["w1"]


async def test_a_buried_worker_stays_dead_until_it_registers(ports: Ports) -> None:
    await ports.store.heartbeat("w1", 0, 0)
    await ports.store.mark_dead("w1")
    await ports.store.beat("w1", 3, 7)
    assert await ports.store.workers() == [{"worker_id": "w1", "state": "dead"}]
    await ports.store.heartbeat("w1", 0, 0)
    assert await ports.store.workers() == [{"worker_id": "w1", "state": "alive"}]


async def test_stale_pending_is_what_waited_longer_than_the_timeout(ports: Ports) -> None:
    job = ports.jobs.add()
    await ports.store.assign_new([job], Stamp(1, 1), 100)
    assert await ports.store.stale_pending(3600) == []
    await asyncio.sleep(0.01)
    [row] = await ports.store.stale_pending(0)
    assert (row["job_id"], row["worker_id"], row["term"], row["clock"]) == (job, None, 1, 1)


async def test_a_fire_queued_twice_is_one_run(ports: Ports) -> None:
    job, paused = ports.jobs.add(), ports.jobs.add()
    ports.jobs.change(paused, paused=True)
    first = await ports.runs.queue_runs(prepare([(job, FIRE), (paused, FIRE)]))
    assert first.queued == 1
    again = await ports.runs.queue_runs(prepare([(job, FIRE), (job, FIRE + 60)]))
    assert again.queued == 1  # only the new fire
