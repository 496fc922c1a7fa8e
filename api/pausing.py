"""Pausing and unpausing a job: the one home of the rule, for gRPC's ``PauseJob``/``UnpauseJob`` and
REST's ``.../jobs/{id}/pause/`` and ``.../unpause/``.

A paused job keeps its definition and its state (active or deactivated) but nothing automatic queues
it: not its schedule (the orchestrator revokes it, and ``queue_runs`` re-checks), not the completion
of an upstream job, not Git events, not automatic retries. Run now and API triggers still queue
it, and such a run records ``job_paused``. Runs already queued are left as they are.
"""

from __future__ import annotations

import logging

from api.lookup import existing_job
from api.rows import JobWithEnvironment
from api.store import Store
from api.validation import positive_id
from runplane.basics.types import AccountId, JobId

log = logging.getLogger(__name__)


async def set_paused(store: Store, account_id: AccountId, job_id: int, *, paused: bool) -> JobWithEnvironment:
    """Pause (or unpause) the job; the job as it is now. Idempotent: a paused job stays paused."""
    job = JobId(positive_id(job_id, "job_id"))
    async with store.transaction() as conn:
        changed = await store.set_job_paused(conn, account_id, job, paused)
        row = await existing_job(store, conn, account_id, job)
    if changed:
        log.info("job paused" if paused else "job unpaused", extra={"account_id": account_id, "job_id": job})
    return row
