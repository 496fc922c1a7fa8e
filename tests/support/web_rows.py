"""Rows the web pages' tests arrange straight in the database: jobs, runs with their stamps, steps,
and a dbt step's run_results.json."""

from __future__ import annotations

from tests.api.conftest import AsyncDb, scalar


async def insert_job(db: AsyncDb, account_id: int, name: str = "nightly", **cols: object) -> int:
    cols.setdefault("steps", ["echo hello"])
    keys = ", ".join(["account_id", "name", "job_type", *cols])
    marks = ", ".join(["%s"] * (3 + len(cols)))
    query = f"INSERT INTO jobs ({keys}) VALUES ({marks}) RETURNING id"
    return int(await scalar(db, query, account_id, name, "deploy", *cols.values()))


async def insert_runs(
    db: AsyncDb, account_id: int, job_id: int, count: int, *, status: int = 10, delay: float = 5
) -> list[int]:
    """``count`` runs queued a minute apart (newest last), each started ``delay`` s after its schedule."""
    cur = await db.execute(
        """
        INSERT INTO runs (account_id, job_id, job_type, status, trigger, idempotency_key, takes_slot,
                          scheduled_at, queued_at, dispatched_at, started_at, finished_at)
        SELECT %(account)s, %(job)s, 'deploy', %(status)s, 'schedule',
               concat_ws('-', 'web', %(job)s, g, %(delay)s, %(status)s), true,
               t, t + interval '1 second', t + interval '2 seconds',
               CASE WHEN %(status)s = 1 THEN NULL ELSE t + make_interval(secs => %(delay)s) END,
               CASE WHEN %(status)s IN (10, 20, 30) THEN t + make_interval(secs => %(delay)s + 30) END
          FROM generate_series(1, %(count)s) g, LATERAL (SELECT now() - make_interval(mins => %(count)s - g + 1) AS t) s
        RETURNING id
        """,
        {"account": account_id, "job": job_id, "status": status, "count": count, "delay": delay},
    )
    return [row[0] for row in await cur.fetchall()]


async def insert_steps(db: AsyncDb, run_id: int, *steps: tuple[str, int, bool]) -> None:
    """The run's steps as ``(command, status, started)``; a step not started has no times."""
    for index, (command, status, started) in enumerate(steps):
        await db.execute(
            "INSERT INTO run_steps (run_id, step_index, command, status, exit_code, started_at, finished_at)"
            " VALUES (%s, %s, %s, %s, %s, CASE WHEN %s THEN now() END, CASE WHEN %s AND %s <> 1 THEN now() END)",
            (run_id, index, command, status, {10: 0, 20: 1}.get(status), started, started, status),
        )


RUN_RESULTS = {
    "results": [
        {"unique_id": "model.shop.orders", "status": "success", "execution_time": 1.5,
         "adapter_response": {"rows_affected": 12}, "message": "SELECT 12"},
        {"unique_id": "test.shop.not_null_orders_id", "status": "fail", "execution_time": 0.25,
         "adapter_response": {}, "message": "Got 3 results, configured to fail if != 0"},
    ]
}  # fmt: skip
