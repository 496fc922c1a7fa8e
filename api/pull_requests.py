"""Closing a pull request: its CI jobs' schemas are dropped (by runs), its CI runs stopped.

One home for gRPC's ``ClosePullRequest``, REST's ``.../pull-requests/{number}/close/`` and the Git
webhooks (GitHub ``pull_request`` closed, GitLab merge request close or merge). The rule itself is
:mod:`runplane.runs.pull_requests`.
"""

from __future__ import annotations

import logging

from api.pickup_publisher import PickupPublisher
from api.rows import RunWithEnvironment
from api.store import Store
from api.validation import bounded
from runplane.basics.errors import NotFound
from runplane.basics.types import AccountId
from runplane.runs.pull_requests import queue_schema_drop, schema_jobs_of_pull_request

log = logging.getLogger(__name__)

MAX_PULL_REQUEST_NUMBER = 2**31 - 1


async def close_pull_request(
    store: Store,
    pickups: PickupPublisher,
    account_id: AccountId,
    pull_request_number: int,
    *,
    job_ids: list[int],
    why: str,
    require_jobs: bool = True,
) -> list[RunWithEnvironment]:
    """Queue a schema drop run for each CI job (among ``job_ids``; empty: every one) that built a
    schema for the pull request; the runs queued (none when every drop is queued already).

    With ``require_jobs`` a job of ``job_ids`` that is not there is NotFound (a webhook's list may
    name jobs deleted since: it passes False).
    """
    bounded(pull_request_number, "pull_request_number", 1, MAX_PULL_REQUEST_NUMBER)
    runs: list[RunWithEnvironment] = []
    async with store.connection() as conn:
        missing = set(job_ids) - await store.live_job_ids(conn, account_id, job_ids) if job_ids else set()
        if missing and require_jobs:
            raise NotFound(f"job {min(missing)} not found")
        for job_id in await schema_jobs_of_pull_request(conn, account_id, pull_request_number, job_ids):
            drop = await queue_schema_drop(conn, job_id=job_id, pull_request_number=pull_request_number, why=why)
            if drop is not None:
                row = await store.get_run(conn, account_id, drop.run_id)
                assert row is not None
                runs.append(row)
    if runs:
        await pickups.publish(account_id)
    log.info(
        "pull request closed",
        extra={"account_id": account_id, "pull_request": pull_request_number, "drop_runs": [r.id for r in runs]},
    )
    return runs
