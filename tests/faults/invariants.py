"""What must hold whatever fault happened, read from the runs table.

- every expected cron occurrence has exactly one run (a run cancelled as superseded counts, and its
  message names the true reason);
- every run reaches one terminal state;
- never more runs running in an account than its slots, never two running runs of one job;
- one run per idempotency key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

Db = psycopg.Connection[tuple[Any, ...]]


@dataclass
class Report:
    missing: list[tuple[int, int]] = field(default_factory=list)  # (job_id, fire_ts) with no run
    duplicated: list[tuple[int, int]] = field(default_factory=list)
    not_terminal: list[int] = field(default_factory=list)
    over_slots: list[int] = field(default_factory=list)  # run ids whose start exceeded the slots
    job_overlap: list[int] = field(default_factory=list)
    key_duplicates: int = 0

    @property
    def ok(self) -> bool:
        return (
            not (self.missing or self.duplicated or self.not_terminal or self.over_slots or self.job_overlap)
            and not self.key_duplicates
        )


def check(db: Db, *, fires: dict[int, list[int]], settle_terminal: bool = True, until: float | None = None) -> Report:
    """``fires``: job_id -> every fire time (unix s) that must have exactly one run; with ``until``,
    only runs scheduled by then must have ended (later ones may still be running)."""
    report = Report()
    have: dict[tuple[int, int], int] = {}
    for job_id, fire_ts, n in db.execute(
        "SELECT job_id, extract(epoch FROM scheduled_at)::bigint, count(*) FROM runs WHERE trigger = 'schedule'"
        " GROUP BY 1, 2"
    ):
        have[(int(job_id), int(fire_ts))] = int(n)
    for job_id, expected in fires.items():
        for fire in expected:
            n = have.get((job_id, fire), 0)
            if n == 0:
                report.missing.append((job_id, fire))
            elif n > 1:
                report.duplicated.append((job_id, fire))
    if settle_terminal:
        report.not_terminal = [
            int(r[0])
            for r in db.execute(
                "SELECT id FROM runs WHERE status IN (2, 3)"
                " AND (%(until)s::float8 IS NULL OR scheduled_at <= to_timestamp(%(until)s::float8))",
                {"until": until},
            )
        ]
    report.over_slots = [
        int(r[0])
        for r in db.execute(
            """SELECT r.id FROM runs r JOIN accounts a ON a.id = r.account_id
               WHERE r.takes_slot AND r.started_at IS NOT NULL AND a.run_slots < (
                 SELECT count(*) FROM runs o WHERE o.account_id = r.account_id AND o.takes_slot
                   AND o.started_at <= r.started_at AND coalesce(o.finished_at, 'infinity') > r.started_at)"""
        )
    ]
    report.job_overlap = [
        int(r[0])
        for r in db.execute(
            """SELECT r.id FROM runs r WHERE r.started_at IS NOT NULL AND EXISTS (
                 SELECT 1 FROM runs o WHERE o.job_id = r.job_id AND o.id <> r.id AND o.started_at IS NOT NULL
                   AND o.started_at <= r.started_at AND coalesce(o.finished_at, 'infinity') > r.started_at)"""
        )
    ]
    row = db.execute("SELECT count(*) - count(DISTINCT idempotency_key) FROM runs").fetchone()
    report.key_duplicates = int(row[0]) if row else 0
    return report
