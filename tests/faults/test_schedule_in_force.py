"""A queuer worker frozen across a fire second while its jobs' schedules change, on real processes:
every run is for an occurrence of the schedule in force at its instant, none is lost and none is
doubled.

Jobs whose cron changes to one that excludes the fire's minute five seconds before it, and jobs
paused 4.6 s before the fire and resumed 5.7 s after it, all held by a worker frozen (SIGSTOP) from
ten seconds before the fire to ten after: the leader declares it dead and gives its jobs away, and
when it thaws its heap still holds the schedules from before the freeze.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from runplane.basics.cron import next_fire
from tests.faults.invariants import Db
from tests.faults.world import BASIC, EVERY_MINUTE, World, make_world
from tests.support.polling import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(420)]

EDITED = 20
PAUSED = 20
FROZEN_FROM = 10.0  # seconds before the fire
THAWED_AT = 10.0  # seconds after it


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with make_world([*BASIC, ("orchestrator", "orchestrator-standby")], cron_jobs=12) as w:
        yield w


def add_jobs(conn: Db, n: int) -> list[int]:
    account = int(conn.execute("SELECT min(id) FROM accounts").fetchone()[0])  # type: ignore[index]
    return [
        int(r[0])
        for r in conn.execute(
            "INSERT INTO jobs (account_id, name, job_type, steps, cron) SELECT %s, 'changing-' || g, 'deploy',"
            " ARRAY['true'], %s FROM generate_series(1, %s) g RETURNING id",
            (account, EVERY_MINUTE, n),
        ).fetchall()
    ]


def owners(conn: Db, job_ids: list[int]) -> dict[int, str]:
    return {
        int(job_id): str(worker)
        for job_id, worker in conn.execute(
            "SELECT job_id, worker_id FROM job_ownership WHERE state = 'claimed' AND job_id = ANY(%s)", (job_ids,)
        )
    }


def runs_at(conn: Db, job_ids: list[int], fire: int) -> dict[int, int]:
    return {
        int(job_id): int(n)
        for job_id, n in conn.execute(
            "SELECT job_id, count(*) FROM runs WHERE trigger = 'schedule' AND job_id = ANY(%s)"
            " AND scheduled_at = to_timestamp(%s) GROUP BY job_id",
            (job_ids, fire),
        )
    }


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def test_a_worker_frozen_while_its_jobs_change_fires_only_what_the_schedule_in_force_allows(world: World) -> None:
    with world.db() as conn:
        edited, paused = add_jobs(conn, EDITED), add_jobs(conn, PAUSED)
        changing = edited + paused
        wait_for(lambda: len(owners(conn, changing)) == len(changing), 60, what="the new jobs claimed")
        # The fire: a minute boundary far enough ahead to set the freeze up before it.
        fire = next_fire(EVERY_MINUTE, "UTC", time.time() + FROZEN_FROM + 5)
        # A cron that excludes the fire's minute and includes the next one.
        excluding = "1-59/2 * * * *" if (fire // 60) % 2 == 0 else "*/2 * * * *"
        held = owners(conn, changing)
        victim_id = max(set(held.values()), key=lambda w: sum(1 for o in held.values() if o == w))
        # A worker's id is host-pid-suffix.
        victim = next(p for _, p in world.services.processes if victim_id.rsplit("-", 2)[1] == str(p.pid))
        frozen_jobs = [j for j, w in held.items() if w == victim_id]

        sleep_until(fire - FROZEN_FROM)
        victim.send_signal(signal.SIGSTOP)
        try:
            sleep_until(fire - 5.0)
            conn.execute(
                "UPDATE jobs SET cron = %s, version = version + 1, updated_at = now() WHERE id = ANY(%s)",
                (excluding, edited),
            )
            sleep_until(fire - 4.6)
            conn.execute("UPDATE jobs SET paused_at = now(), version = version + 1 WHERE id = ANY(%s)", (paused,))
            sleep_until(fire + 5.7)
            conn.execute("UPDATE jobs SET paused_at = NULL, version = version + 1 WHERE id = ANY(%s)", (paused,))
            sleep_until(fire + THAWED_AT)
        finally:
            victim.send_signal(signal.SIGCONT)

        after = fire + 60  # an occurrence of every schedule in force then
        wait_for(
            lambda: len(runs_at(conn, [*world.jobs, *changing], after)) == len(world.jobs) + len(changing),
            90,
            what="every job's run of the minute after",
        )
        not_allowed = runs_at(conn, changing, fire)
        steady_at_fire = runs_at(conn, world.jobs, fire)
        doubled = [
            (job_id, n)
            for at in (fire, after)
            for job_id, n in runs_at(conn, [*world.jobs, *changing], at).items()
            if n > 1
        ]
        lost = [j for j in world.jobs if j not in steady_at_fire]
        report = world.invariants(after)
    print(
        f"\nfault report: worker frozen {FROZEN_FROM + THAWED_AT:.0f} s across a fire holding {len(frozen_jobs)}"
        f" of {len(changing)} changing jobs: runs the schedule in force did not allow {len(not_allowed)},"
        f" lost {len(lost)}, doubled {len(doubled)}"
    )
    assert frozen_jobs, "the frozen worker held none of the changing jobs"
    assert not_allowed == {}, f"runs at a minute their schedule then excluded: {not_allowed}\n{world.logs()}"
    assert lost == [] and doubled == [], world.logs()
    assert report.key_duplicates == 0 and not report.duplicated, report
    assert world.exited() == [], world.logs()
