"""Named transitions read as SQL: what ``start_runs`` hands the launcher."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from runplane.basics.tokens import new_run_token, token_hash
from runplane.runs.transitions import TRANSITIONS
from runplane.sql import parse_queries
from tests.support.records import create_account, create_environment, create_job, queue_run

Db = psycopg.Connection[Any]


def _start(db: Db, run_ids: list[int]) -> dict[int, dict[str, Any]]:
    with db.cursor(row_factory=dict_row) as cur:
        cur.execute(
            TRANSITIONS["start_runs"],
            {
                "ids": run_ids,
                "schemas": [""] * len(run_ids),
                "token_hashes": [token_hash(new_run_token()) for _ in run_ids],
                "cluster": "",
                "dispatcher_id": "d1",
            },
        )
        return {int(row["id"]): row for row in cur.fetchall()}


def test_start_runs_names_the_dbt_a_run_asked_for_else_its_environments(db: Db) -> None:
    account_id = create_account(db, run_slots=5)
    job_id = create_job(db, account_id)
    db.execute(
        "UPDATE jobs SET environment_id = %s WHERE id = %s", (create_environment(db, account_id, "1.10"), job_id)
    )
    plain = queue_run(db, job_id)
    overridden = queue_run(db, job_id, overrides={"dbt_version": "1.9"})
    started = _start(db, [plain, overridden])
    assert started[plain]["dbt_version"] == "1.10"
    assert started[overridden]["dbt_version"] == "1.9"


def test_a_job_without_an_environment_has_no_dbt_unless_the_run_asks(db: Db) -> None:
    job_id = create_job(db, create_account(db, run_slots=5))
    plain, overridden = queue_run(db, job_id), queue_run(db, job_id, overrides={"dbt_version": "1.9"})
    started = _start(db, [plain, overridden])
    assert (started[plain]["dbt_version"], started[overridden]["dbt_version"]) == (None, "1.9")


SHIPPED = ("api", "runplane", "orchestrator", "queuer_worker", "scheduler", "dispatcher", "runner", "bench")
_UPDATE_RUNS = re.compile(
    r"UPDATE\s+runs\b(?:\s+\w+)?\s+SET\s+(.*?)(?:\bWHERE\b|\bFROM\b|\bRETURNING\b|$)", re.S | re.I
)
_SETS_STATUS = re.compile(r"(?:^|,)\s*(?:\w+\.)?status\s*=", re.I)


def test_every_change_of_a_runs_status_is_a_named_transition() -> None:
    """A statement that sets ``runs.status`` outside ``transitions.sql`` would be a second home of how
    a run moves from one status to another."""
    root = Path(__file__).resolve().parents[3]
    elsewhere = [
        f"{path.relative_to(root)}: {name}"
        for package in SHIPPED
        for path in sorted((root / package).rglob("*.sql"))
        if path.name != "transitions.sql" and "migrations" not in path.parts
        for name, sql in parse_queries(path.read_text(encoding="utf-8")).items()
        if any(_SETS_STATUS.search(update.group(1)) for update in _UPDATE_RUNS.finditer(sql))
    ]
    assert elsewhere == []
