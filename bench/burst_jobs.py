"""The top-of-the-hour burst, shared by every system: N job definitions whose cron fires at the
same minute, and the clock that makes that minute arrive a few seconds from now.

Cron has minute resolution, so waiting for a real minute boundary would cost up to a minute per
repetition. Instead a system whose cron is minute-grained (Celery beat, the single-loop queuer)
reads a clock shifted by ``offset``: the cron minute ``fire_at`` arrives exactly at the real instant
``due``. Only the clock a scheduler reads is shifted; its algorithm is untouched, and every lag is
measured against the real ``due``.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg


@dataclass(frozen=True)
class BurstClock:
    due: float  # real unix time at which every job is due
    fire_at: int  # the cron minute (unix seconds, a multiple of 60) in the scheduler's clock

    @property
    def offset(self) -> float:
        """Seconds to add to the real time to get the scheduler's clock."""
        return self.fire_at - self.due

    @property
    def cron(self) -> str:
        """A five-field expression that fires once a day, at ``fire_at``."""
        moment = datetime.fromtimestamp(self.fire_at, UTC)
        return f"{moment.minute} {moment.hour} * * *"


def plan_burst(lead: float) -> BurstClock:
    """Due ``lead`` seconds from now, at the next cron minute at least a minute ahead."""
    due = time.time() + lead
    fire_at = int(math.ceil(due / 60.0) * 60) + 60
    return BurstClock(due=due, fire_at=fire_at)


def insert_burst_jobs(database_url: str, n: int, cron: str, accounts: int = 1) -> None:
    """N active deploy jobs with ``cron`` (UTC), spread over ``accounts`` accounts, in one COPY."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        with conn.transaction():
            account_ids = [
                row[0]
                for row in conn.execute(
                    "INSERT INTO accounts (name, run_slots) SELECT 'bench-' || g, 1000"
                    " FROM generate_series(1, %s) g RETURNING id",
                    (accounts,),
                )
            ]
            buffer = io.StringIO()
            for i in range(n):
                buffer.write(f'{account_ids[i % accounts]}\tjob-{i}\tdeploy\t{{"dbt build"}}\t{cron}\tUTC\n')
            with conn.cursor().copy("COPY jobs (account_id, name, job_type, steps, cron, timezone) FROM STDIN") as copy:
                copy.write(buffer.getvalue())
        conn.execute("ANALYZE jobs")
