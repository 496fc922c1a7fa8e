"""Ownership across real processes: sharing, failover of workers and of the leader, rebalancing."""

from __future__ import annotations

import asyncio
import signal
from functools import reduce

import pytest

from orchestrator.leadership import LEASE_SECONDS
from runplane.adapters.bus import AmqpBus, Topology
from runplane.basics.ownership import job_digest
from runplane.basics.stamps import Stamp
from runplane.v1 import bus_pb2
from tests.support.polling import eventually
from tests.support.queuer import (
    NEVER_SOON,
    Cluster,
    Db,
    all_claimed,
    claimed_counts,
    insert_jobs,
    ownership,
    scalar,
    within,
    workers_agree,
)

pytestmark = pytest.mark.slow


def term(db: Db) -> int:
    return int(scalar(db, "SELECT term FROM orchestrator_term"))


async def test_three_workers_share_3000_jobs(queuers: Cluster, db: Db) -> None:
    job_ids = insert_jobs(db, 3000, cron=NEVER_SOON)
    for _ in range(3):
        queuers.worker()
    queuers.orchestrator()

    def shared() -> bool:
        counts = claimed_counts(db)
        return all_claimed(db, 3000) and len(counts) == 3 and within(counts, 1000) and workers_agree(db)

    await eventually(shared, 40, what="3,000 jobs claimed within ±10% of 1,000 per worker")
    owners = ownership(db)
    assert sorted(owners) == sorted(job_ids)
    assert len({w for w, _ in owners.values()}) == 3
    counts = claimed_counts(db)
    assert all(900 <= c <= 1100 for c in counts.values()), counts
    # What the workers hold (count and digest of job ids and versions) equals Postgres ownership.
    reported: dict[str, int] = dict(
        db.execute("SELECT worker_id, jobs_owned FROM queuer_workers WHERE state = 'alive'").fetchall()
    )
    assert reported == counts
    digest = reduce(lambda acc, j: acc ^ job_digest(j, 1), job_ids, 0)
    worker_digests = [d for (d,) in db.execute("SELECT owned_digest FROM queuer_workers WHERE state = 'alive'")]
    assert reduce(lambda a, b: a ^ b, worker_digests, 0) == digest


async def test_standby_takes_over_when_the_leader_is_killed(queuers: Cluster, db: Db) -> None:
    insert_jobs(db, 300, cron=NEVER_SOON)
    leader = queuers.orchestrator()
    await eventually(lambda: term(db) == 1, 20, what="term 1")
    standby = queuers.orchestrator()
    queuers.worker()
    queuers.worker()
    await eventually(lambda: all_claimed(db, 300) and workers_agree(db), 30, what="jobs claimed")
    before = ownership(db)

    queuers.kill9(leader)
    await eventually(lambda: term(db) == 2, 10, what="term 2 within 10 s of the kill")
    assert standby.poll() is None
    # The new leader keeps every ownership: nothing reassigned, the workers still agree with Postgres.
    await eventually(lambda: workers_agree(db), 5, what="workers agree with Postgres under the new leader")
    assert ownership(db) == before


async def test_a_paused_job_is_revoked_and_an_unpaused_one_assigned_again(queuers: Cluster, db: Db) -> None:
    jobs = insert_jobs(db, 20, cron=NEVER_SOON)
    queuers.orchestrator()
    queuers.worker()
    await eventually(lambda: all_claimed(db, 20) and workers_agree(db), 30)
    paused = jobs[:5]
    # What PauseJob writes: paused_at and a version bump (the NOTIFY the orchestrator hears).
    db.execute("UPDATE jobs SET paused_at = now(), version = version + 1 WHERE id = ANY(%s)", (paused,))
    await eventually(lambda: set(ownership(db)) == set(jobs[5:]) and workers_agree(db), 20, what="paused jobs revoked")
    db.execute("UPDATE jobs SET paused_at = NULL, version = version + 1 WHERE id = ANY(%s)", (paused,))
    await eventually(lambda: all_claimed(db, 20) and workers_agree(db), 20, what="unpaused jobs assigned again")


async def test_a_worker_declared_dead_that_returns_drops_everything(queuers: Cluster, db: Db) -> None:
    insert_jobs(db, 400, cron=NEVER_SOON)
    queuers.orchestrator()
    frozen = queuers.worker()
    queuers.worker()
    await eventually(lambda: all_claimed(db, 400) and len(claimed_counts(db)) == 2 and workers_agree(db), 30)
    worker_id = scalar(db, "SELECT worker_id FROM queuer_workers WHERE worker_id LIKE %s", (f"%-{frozen.pid}-%",))

    # A paused process sends no heartbeats: after 3 intervals it is dead and its jobs move.
    frozen.send_signal(signal.SIGSTOP)
    try:
        await eventually(lambda: worker_id not in {w for w, _ in ownership(db).values()} and all_claimed(db, 400), 10)
        assert scalar(db, "SELECT state FROM queuer_workers WHERE worker_id = %s", (worker_id,)) == "dead"
    finally:
        frozen.send_signal(signal.SIGCONT)
    # Back, it is told to drop what it held, registers again and gets a fair share; what every worker
    # holds still equals Postgres.
    await eventually(
        lambda: claimed_counts(db).get(worker_id, 0) > 0 and within(claimed_counts(db), 200) and workers_agree(db),
        40,
        what="the returning worker to re-register and be rebalanced",
    )
    assert all_claimed(db, 400)


async def test_workers_all_silent_at_once_are_not_declared_dead(queuers: Cluster, db: Db) -> None:
    # What a broker outage longer than the dead-worker timeout looks like to the leader: every worker
    # silent at once. That is the leader's deafness, not every worker's death: nobody is buried, and
    # back, every worker still holds exactly what it owns.
    insert_jobs(db, 200, cron=NEVER_SOON)
    queuers.orchestrator()
    workers = [queuers.worker(), queuers.worker()]
    await eventually(
        lambda: all_claimed(db, 200) and len(claimed_counts(db)) == 2 and workers_agree(db), 30, what="jobs claimed"
    )
    before = claimed_counts(db)
    for worker in workers:
        worker.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(10)  # over the dead-worker timeout (6 s) and then some
        assert scalar(db, "SELECT count(*) FROM queuer_workers WHERE state = 'alive'") == 2
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGCONT)
    await eventually(lambda: workers_agree(db), 20, what="every worker holding what it owns")
    assert claimed_counts(db) == before
    assert scalar(db, "SELECT count(*) FROM queuer_workers WHERE state = 'alive'") == 2


def leader_of_term(db: Db) -> str:
    return str(scalar(db, "SELECT leader FROM orchestrator_term"))


def terminate_lease_connection(db: Db) -> int:
    """End the connection a leader renews its lease on (its last statement was a renewal); only this
    test's database is looked at."""
    return len(
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND query LIKE '%%lease_expires_at = now() + make_interval%%' AND query NOT LIKE '%%term + 1%%'"
        ).fetchall()
    )


async def test_a_leader_that_loses_its_lease_connection_steps_down(queuers: Cluster, db: Db) -> None:
    leader = queuers.orchestrator()
    await eventually(lambda: term(db) == 1, 20, what="term 1")
    standby = queuers.orchestrator()
    await eventually(lambda: terminate_lease_connection(db) == 1, 10, what="the lease's connection ended")
    await eventually(lambda: term(db) == 2, 15 + LEASE_SECONDS, what="term 2")
    # The old leader stopped leading and stood by again: the process lives on. Whichever of the two
    # took term 2, the other takes over when it dies.
    assert leader.poll() is None and standby.poll() is None
    first, second = (leader, standby) if leader_of_term(db).endswith(f"-{leader.pid}") else (standby, leader)
    assert leader_of_term(db).endswith(f"-{first.pid}")
    queuers.kill9(first)
    await eventually(lambda: term(db) == 3, 20 + LEASE_SECONDS, what="term 3")
    assert leader_of_term(db).endswith(f"-{second.pid}")


async def test_a_frozen_leader_loses_its_lease_and_no_healthy_worker_is_buried(queuers: Cluster, db: Db) -> None:
    """A leader frozen with its connections open: the standby takes over once the lease runs out,
    not when the frozen process ends; and the heartbeats the frozen leader's consumer holds do not
    make the new leader declare a healthy worker dead."""
    insert_jobs(db, 100, cron=NEVER_SOON)
    leader = queuers.orchestrator()
    await eventually(lambda: term(db) == 1, 20, what="term 1")
    standby = queuers.orchestrator()
    workers = [queuers.worker() for _ in range(3)]
    await eventually(lambda: all_claimed(db, 100) and workers_agree(db), 40, what="jobs claimed")
    leader.send_signal(signal.SIGSTOP)
    try:
        await eventually(lambda: term(db) == 2, 15 + LEASE_SECONDS, what="the standby to take the lease")
        assert leader_of_term(db).endswith(f"-{standby.pid}")
        # The frozen leader's consumer is still attached, holding a prefetch of messages and handed
        # more by round robin: the new leader hears that and declares nobody dead meanwhile.
        bus = await AmqpBus.connect(queuers.settings.amqp_url)
        try:
            queue = Topology(queuers.settings.bus_prefix).orchestrator
            await eventually(lambda: bus.consumers(queue), 15, until=lambda n: n == 2, what="two consumers")
        finally:
            await bus.close()
        await eventually(
            lambda: "another consumer holds heartbeats" in queuers.logs(), 10, what="the new leader to notice"
        )
        # Heartbeats every second: a worker starved of them would be declared dead after three.
        await asyncio.sleep(10)
        assert scalar(db, "SELECT count(*) FROM queuer_workers WHERE state = 'dead'") == 0
    finally:
        leader.send_signal(signal.SIGCONT)
    await eventually(lambda: "stepped down" in queuers.logs(), 20, what="the thawed leader to step down")
    await eventually(lambda: workers_agree(db), 30, what="every worker holding what it owns")
    assert scalar(db, "SELECT count(*) FROM queuer_workers WHERE state = 'dead'") == 0
    assert term(db) == 2 and all(w.poll() is None for w in workers) and leader.poll() is None
    assert "queuer worker dead" not in queuers.logs()


async def test_a_worker_that_stops_holding_jobs_it_owns_is_sent_them_again(queuers: Cluster, db: Db) -> None:
    job_ids = insert_jobs(db, 50, cron=NEVER_SOON)
    queuers.orchestrator()
    queuers.worker()
    await eventually(lambda: all_claimed(db, 50) and workers_agree(db), 30, what="jobs claimed")
    worker_id = scalar(db, "SELECT worker_id FROM queuer_workers WHERE state = 'alive'")
    newest = Stamp(term(db), int(scalar(db, "SELECT max(clock) FROM job_ownership")) + 1)

    # A Revoke its leader never meant (as one that came late would be): the worker lets ten jobs go,
    # and Postgres still says it owns them, so nothing would ever fire them.
    lost = job_ids[:10]
    bus = await AmqpBus.connect(queuers.settings.amqp_url)
    try:
        revoke = bus_pb2.Revoke(stamp=newest.to_proto(), job_ids=lost)
        await bus.publish(Topology(queuers.settings.bus_prefix).worker(worker_id), revoke)
    finally:
        await bus.close()
    await eventually(
        lambda: scalar(db, "SELECT jobs_owned FROM queuer_workers WHERE worker_id = %s", (worker_id,)) == 40,
        10,
        what="the worker to report holding 40 jobs",
    )
    # The leader sees the digest differ for a claim timeout and assigns the worker its jobs again.
    await eventually(
        lambda: workers_agree(db) and all_claimed(db, 50) and claimed_counts(db) == {worker_id: 50},
        40,
        what="the worker to hold every job it owns again",
    )
    assert "does not hold what it owns" in queuers.logs()
