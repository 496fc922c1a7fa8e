"""A schedule that never fires is its job's error, never the queuer's.

``0 0 31 2 *`` (the 31st of February) has no next fire. Such a job (saved before validation refused
it) must be deactivated with its reason, its message acked, and every worker left running the others.
"""

from __future__ import annotations

import pytest

from runplane.basics.cron import NeverFires, next_fire, validate_fires
from runplane.basics.errors import InvalidArgument
from tests.support.polling import eventually
from tests.support.queuer import NEVER_SOON, Cluster, Db, insert_jobs, ownership

NEVER = ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4 *"]


@pytest.mark.parametrize("expr", NEVER)
def test_validation_refuses_a_schedule_that_never_fires(expr: str) -> None:
    with pytest.raises(NeverFires):
        next_fire(expr, "UTC", 1_790_000_000)
    with pytest.raises(InvalidArgument, match="never fires"):
        validate_fires(expr, "UTC", "triggers.schedule.cron")


def test_a_leap_day_schedule_is_accepted_across_a_century() -> None:
    # From March 2096 the next 29th of February is in 2104 (2100 is not a leap year).
    validate_fires("0 0 29 2 *", "UTC", now=4_081_795_200)  # 2099-05-07
    validate_fires("0 0 29 2 *", "Europe/Amsterdam")


@pytest.mark.slow
async def test_a_job_that_never_fires_is_deactivated_and_the_workers_live_on(queuers: Cluster, db: Db) -> None:
    accounts = [
        int(r[0]) for r in db.execute("INSERT INTO accounts (name, run_slots) VALUES ('a', 2), ('b', 2) RETURNING id")
    ]
    good = insert_jobs(db, 40, cron=NEVER_SOON, accounts=accounts)
    bad = [insert_jobs(db, 1, cron=expr, accounts=accounts[:1])[0] for expr in NEVER]
    workers = [queuers.worker(), queuers.worker()]
    queuers.orchestrator()

    def bad_deactivated() -> bool:
        rows = db.execute(
            "SELECT deactivated_at IS NOT NULL, deactivation_reason FROM jobs WHERE id = ANY(%s)", (bad,)
        ).fetchall()
        return all(row[0] and "never fires" in row[1] for row in rows)

    try:
        await eventually(bad_deactivated, 30, what="the never-firing jobs to be deactivated with their reason")
        await eventually(
            lambda: all(ownership(db).get(j, (None, ""))[1] == "claimed" for j in good),
            30,
            what="every other job claimed",
        )
    except AssertionError:
        print(queuers.logs())
        raise
    assert all(w.poll() is None for w in workers), queuers.logs()
    # The schedule is the job's error: no worker holds it, and saving a fixed schedule brings it back.
    assert not any(ownership(db).get(j, (None, ""))[1] == "claimed" for j in bad)
    db.execute(
        "UPDATE jobs SET cron = %s, deactivated_at = NULL, deactivation_reason = '', version = version + 1"
        " WHERE id = %s",
        (NEVER_SOON, bad[0]),
    )
    await eventually(lambda: ownership(db).get(bad[0], (None, ""))[1] == "claimed", 30, what="the fixed job claimed")
    assert all(w.poll() is None for w in workers), queuers.logs()
