"""Faults of the services themselves, one at a time, under a running system on private servers:
kill -9 and SIGSTOP of each service type, poison messages, a schedule that never fires, runs whose
dispatcher died between its commit and the launch. After each, a run queued at once succeeds; at the
end every cron occurrence of the whole module has exactly one run and every run ended once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from functools import partial

import aio_pika
import psutil
import pytest

from runplane.adapters.bus import Topology
from runplane.basics.cron import next_fire
from runplane.basics.settings import Settings
from tests.faults.world import (
    EVERY_MINUTE,
    WITH_STANDBYS,
    World,
    fire_done,
    fire_queued,
    make_world,
    probe_run,
    run_delay_p99,
)
from tests.support.polling import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(300)]

# The bound after a fire within which its runs are queued once faults have healed: DESIGN.md's B, with
# this suite's faster heartbeats, claim timeout and reconcile, is about 32 s.
QUEUED_WITHIN = 60.0


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with make_world(WITH_STANDBYS) as w:
        yield w


def report(world: World, fault: str, fault_at: float, seconds: float) -> None:
    print(
        f"\nfault report: {fault}: a run queued at the fault succeeded after {seconds:.2f} s;"
        f" run delay p99 of the minute around it {run_delay_p99(world, fault_at)} s"
    )


def leader(world: World) -> str:
    """The service name of the orchestrator that leads now."""
    with world.db() as conn:
        row = conn.execute("SELECT leader FROM orchestrator_term").fetchone()
    pid = int(str(row[0]).rsplit("-", 1)[1]) if row and row[0] else -1
    return next(name for name, process in world.services.processes if process.pid == pid)


@pytest.mark.parametrize("service", ["queuer-worker-1", "leader", "scheduler", "dispatcher"])
def test_kill_9(world: World, service: str) -> None:
    name = leader(world) if service == "leader" else service
    fault_at = time.time()
    os.kill(world.process(name).pid, signal.SIGKILL)
    world.process(name).wait(10)
    if service == "scheduler":
        # One scheduler loop runs, with no standby: its supervisor (`runplane up`, Kubernetes) starts
        # it again, and until then only the queuers' cron Pickups would reach the probe's account.
        world.restart(name)
        seconds = probe_run(world, fault_at)
    else:  # a standby or a twin serves meanwhile; the supervisor's restart comes after
        seconds = probe_run(world, fault_at)
        world.restart(name)  # as `runplane up` does
    report(world, f"kill -9 {service}", fault_at, seconds)
    assert world.exited() == [], world.logs()


@pytest.mark.parametrize("service", ["queuer-worker-2", "leader", "scheduler", "dispatcher-2"])
def test_sigstop(world: World, service: str) -> None:
    name = leader(world) if service == "leader" else service
    process = world.process(name)
    fault_at = time.time()
    process.send_signal(signal.SIGSTOP)
    try:
        if service != "scheduler":  # the scheduler loop sends the probe's Pickup: it waits for SIGCONT
            seconds = probe_run(world, fault_at)
        time.sleep(max(0.0, 8 - (time.time() - fault_at)))
    finally:
        process.send_signal(signal.SIGCONT)
    if service == "scheduler":
        seconds = probe_run(world, fault_at)
    report(world, f"SIGSTOP 8 s {service}", fault_at, seconds)
    assert world.exited() == [], world.logs()


def test_poison_messages_are_dead_lettered_and_stop_no_consumer(world: World) -> None:
    topology = Topology(Settings().bus_prefix)

    async def publish() -> int:
        """The dead-letter queue's count before the poison goes out (consumers may move it at once)."""
        connection = await aio_pika.connect(world.rabbit.url)
        async with connection:
            channel = await connection.channel()
            dead = await channel.declare_queue(topology.dead_letter, durable=True)
            count = int(dead.declaration_result.message_count or 0)
            for queue in (topology.assign, topology.pickup, topology.orchestrator):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"\xff\x00garbage", type="Assign" if queue == topology.assign else "Nonsense"),
                    routing_key=queue,
                )
            return count

    before = asyncio.run(publish())
    fault_at = time.time()

    async def dead_letters() -> int:
        connection = await aio_pika.connect(world.rabbit.url)
        async with connection:
            channel = await connection.channel()
            dead = await channel.declare_queue(topology.dead_letter, durable=True)
            return int(dead.declaration_result.message_count or 0)

    try:
        wait_for(lambda: asyncio.run(dead_letters()) - before >= 3, 30, what="three messages in the dead-letter queue")
    except AssertionError:
        print(world.logs())
        raise
    report(world, "poison messages", fault_at, probe_run(world, fault_at))
    assert world.exited() == [], world.logs()


def test_a_schedule_that_never_fires_is_its_jobs_error(world: World) -> None:
    with world.db() as conn:
        row = conn.execute(
            "INSERT INTO jobs (account_id, name, job_type, steps, cron)"
            " SELECT account_id, 'never', 'deploy', ARRAY['true'], '0 0 31 2 *' FROM jobs WHERE id = %s RETURNING id",
            (world.jobs[0],),
        ).fetchone()
    assert row is not None
    never = int(row[0])
    fault_at = time.time()

    def deactivated() -> bool:
        with world.db() as conn:
            found = conn.execute("SELECT deactivation_reason FROM jobs WHERE id = %s", (never,)).fetchone()
        return bool(found and "never fires" in found[0])

    wait_for(deactivated, 30, what="the job to be deactivated with its reason")
    report(world, "a schedule that never fires", fault_at, probe_run(world, fault_at))
    assert world.exited() == [], world.logs()


def test_runs_whose_dispatcher_died_before_the_launch_are_released_within_seconds(world: World) -> None:
    # What a dispatcher killed between its commit and the launch leaves: starting runs of a
    # dispatcher that no longer heartbeats.
    with world.db() as conn:
        ids = [
            int(r[0])
            for r in conn.execute(
                "INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at,"
                " status, dispatched_at, launch_attempts, dispatcher_id)"
                " SELECT account_id, id, job_type, 'api', 'orphan:' || id, true, now(), 2, now(), 1, 'gone:1'"
                " FROM jobs WHERE id = ANY(%s) RETURNING id",
                (world.jobs[:4],),
            ).fetchall()
        ]
    fault_at = time.time()

    def all_succeeded() -> float | None:
        with world.db() as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 10), extract(epoch FROM max(finished_at)) FROM runs"
                " WHERE id = ANY(%s)",
                (ids,),
            ).fetchone()
        return float(row[1]) if row and row[0] == len(ids) else None

    # Within a minute: released by the dead dispatcher's heartbeat, not by the 120 s start timeout.
    done = wait_for(all_succeeded, 60, what="the orphaned runs to be relaunched and succeed")
    assert done is not None
    report(world, "runs orphaned by a dead dispatcher", fault_at, float(done) - fault_at)


def _load_jobs(world: World, count: int) -> list[int]:
    """``count`` jobs with no schedule over the module's accounts, to keep the dispatchers busy."""
    with world.db() as conn:
        rows = conn.execute(
            "INSERT INTO jobs (account_id, name, job_type, steps)"
            " SELECT j.account_id, 'load-' || g, 'deploy', ARRAY['true']"
            " FROM generate_series(1, %s) g JOIN jobs j ON j.id = (%s::bigint[])[1 + g %% 2] RETURNING id",
            (count, world.jobs[:2]),
        ).fetchall()
    return [int(r[0]) for r in rows]


def _busy(world: World, jobs: list[int]) -> None:
    """Keep runs of ``jobs`` queued, so the dispatchers are mostly inside a pass."""
    with world.db() as conn:
        conn.execute(
            "INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at)"
            " SELECT j.account_id, j.id, j.job_type, 'api', 'load:' || j.id || ':' || clock_timestamp(), true, now()"
            " FROM jobs j WHERE j.id = ANY(%s) AND NOT EXISTS"
            " (SELECT 1 FROM runs r WHERE r.job_id = j.id AND r.status = 1)",
            (jobs,),
        )


def _queue_one(world: World, account_id: int) -> int:
    with world.db() as conn:
        row = conn.execute(
            "INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at)"
            " SELECT account_id, id, job_type, 'api', 'one:' || id || ':' || clock_timestamp(), true, now()"
            " FROM jobs WHERE account_id = %s ORDER BY id LIMIT 1 RETURNING id",
            (account_id,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _succeeded(world: World, run_id: int) -> bool:
    with world.db() as conn:
        row = conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,)).fetchone()
    return row is not None and row[0] == 10


def _state(world: World, backend: int) -> str:
    with world.db() as conn:
        row = conn.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchone()
    return str(row[0]) if row else ""


def _in_transaction(world: World, backend: int) -> bool:
    with world.db() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND xact_start IS NOT NULL", (backend,)
        ).fetchone()
    return bool(row and row[0])


def _blocked_by(world: World, holder: int) -> list[int]:
    """Backends waiting for a lock the backend ``holder`` holds."""
    with world.db() as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (holder,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def _dispatcher_of(world: World, backend: int) -> str | None:
    """The dispatcher whose connection is the Postgres backend ``backend``, if one is."""
    with world.db() as conn:
        row = conn.execute("SELECT client_port FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchone()
    if row is None:
        return None
    for name, process in dict(world.services.processes).items():
        if name.startswith("dispatcher") and process.poll() is None:
            ports = {c.laddr.port for c in psutil.Process(process.pid).net_connections(kind="tcp")}
            if row[0] in ports:
                return name
    return None


def test_a_dispatcher_frozen_inside_its_transaction_holds_nothing_for_long(world: World) -> None:
    # Deterministically inside: a dispatch pass waits for an account row this test holds; the
    # dispatcher is stopped while it waits, then the row is let go, so the pass gets it and sits in
    # its transaction with a frozen client.
    load = _load_jobs(world, 24)
    with world.db() as holder:
        holder.execute("BEGIN")
        row = holder.execute("SELECT pg_backend_pid(), max(id) FROM accounts").fetchone()
        assert row is not None
        holder_pid, account = int(row[0]), int(row[1])
        holder.execute("SELECT id FROM accounts WHERE id = %s FOR NO KEY UPDATE", (account,))
        _busy(world, load)
        blocked = wait_for(
            lambda: [b for b in _blocked_by(world, holder_pid) if _dispatcher_of(world, b)],
            60,
            what="a dispatch pass waiting for the held account row",
            interval=0.05,
        )[0]
        name = _dispatcher_of(world, blocked)
        assert name is not None
        process = world.process(name)
        process.send_signal(signal.SIGSTOP)
        holder.execute("COMMIT")
    frozen_backend = blocked
    wait_for(
        lambda: _state(world, frozen_backend) == "idle in transaction",
        10,
        what="the frozen pass to hold its transaction",
        interval=0.05,
    )
    fault_at = time.time()
    try:
        # The other dispatcher serves every account meanwhile, the frozen one's accounts included.
        seconds = probe_run(world, fault_at)
        with world.db() as conn:
            accounts = [int(r[0]) for r in conn.execute("SELECT DISTINCT account_id FROM jobs ORDER BY 1")]
        for account_id in accounts:
            run_id = _queue_one(world, account_id)
            wait_for(partial(_succeeded, world, run_id), 60, what=f"a run of account {account_id} to succeed")
        # Postgres ended the frozen transaction (idle_in_transaction_session_timeout): no lock is left.
        backend = frozen_backend
        wait_for(lambda: not _in_transaction(world, backend), 30, what="the server to end the frozen transaction")
    finally:
        process.send_signal(signal.SIGCONT)
    wait_for(lambda: world.ready(name)[0], 60, what="the thawed dispatcher to be ready again")
    report(world, "a dispatcher frozen inside its transaction", fault_at, seconds)
    assert world.exited() == [], world.logs()


@pytest.mark.timeout(600)
def test_every_cron_occurrence_has_exactly_one_run(world: World) -> None:
    """Every fire since the module began, its faults included, up to the first fire after the faults,
    has exactly one run, and each of those runs ended once.

    Two bounds, not one: that fire's runs are queued within the protocol's bound after it (DESIGN.md,
    "Exactly once, on time"), whatever the machine's load; their ending is dispatch and runners on a
    machine the rest of the suite may saturate, so it gets the time that takes (minutes then), never
    a step back to an earlier fire."""
    fire = next_fire(EVERY_MINUTE, "UTC", time.time())
    try:
        wait_for(
            lambda: fire_queued(world, fire),
            fire - time.time() + QUEUED_WITHIN,
            what=f"every job's run of {fire} to be queued",
        )
        wait_for(lambda: fire_done(world, fire), 300, what=f"the runs of {fire} to end")
        wait_for(lambda: world.invariants(until=fire).ok, 60, what="every run of those fires to end")
    except AssertionError:
        print(world.logs())
        print(_ownership_view(world, fire))
        raise
    result = world.invariants(until=fire)
    assert result.ok, result
    healed = [
        line
        for name in ("orchestrator", "orchestrator-standby")
        for line in world.services.log_text(name).splitlines()
        if "does not hold what it owns" in line
    ]
    print(f"\nfault report: a queuer worker was found not holding jobs it owns {len(healed)} times", *healed, sep="\n")


def _ownership_view(world: World, fire: int) -> str:
    """What to read when fires are missing: who owns each job of a missing fire, and what each worker
    reports holding, next to what it owns."""
    with world.db() as conn:
        missing = conn.execute(
            "SELECT o.job_id, o.worker_id, o.state FROM job_ownership o WHERE NOT EXISTS (SELECT 1 FROM runs r"
            " WHERE r.job_id = o.job_id AND r.trigger = 'schedule' AND r.scheduled_at = to_timestamp(%s))",
            (fire,),
        ).fetchall()
        workers = conn.execute(
            "SELECT w.worker_id, w.state, w.jobs_owned, (SELECT count(*) FROM job_ownership o"
            " WHERE o.worker_id = w.worker_id AND o.state = 'claimed') FROM queuer_workers w ORDER BY 1"
        ).fetchall()
    lines = [f"jobs with no run of {fire} (job, owner, state): {missing}"]
    lines += [f"worker {w}: {state}, reports holding {held}, owns {owned}" for w, state, held, owned in workers]
    return "\n".join(lines)
