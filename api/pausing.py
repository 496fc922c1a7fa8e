"""Pausing and unpausing a job: the one home of the rule, for gRPC's ``PauseJob``/``UnpauseJob``,
REST's ``.../jobs/{id}/pause/`` and ``.../unpause/``, and the job page's button.

A paused job keeps its definition and its state (active or deactivated) but nothing automatic queues
it: not its schedule (the orchestrator revokes it, and ``queue_runs`` re-checks), not the completion
of an upstream job, not Git events, not automatic retries. Run now and API triggers still queue
it, and such a run records ``job_paused``. Runs already queued are left as they are.

A pause keeps a note: who paused the job (the caller's token, as every door names it) and why (the
caller's words); the job shows both until it is unpaused.
"""

from __future__ import annotations

import logging

from api.lookup import existing_job
from api.rows import JobWithEnvironment
from api.store import Store
from api.validation import MAX_PAUSE_NOTE, positive_id, text
from runplane.basics.types import AccountId, JobId

log = logging.getLogger(__name__)


async def set_paused(
    store: Store, account_id: AccountId, job_id: int, *, paused: bool, who: str = "", note: str = ""
) -> JobWithEnvironment:
    """Pause (or unpause) the job; the job as it is now. Idempotent: a paused job stays paused (with
    the note of its first pause)."""
    job = JobId(positive_id(job_id, "job_id"))
    note = text(note.strip(), "note", max_length=MAX_PAUSE_NOTE)
    async with store.transaction() as conn:
        changed = await store.set_job_paused(conn, account_id, job, paused, who=who, note=note)
        row = await existing_job(store, conn, account_id, job)
    if changed:
        log.info(
            "job paused" if paused else "job unpaused",
            extra={"account_id": account_id, "job_id": job, "who": who, "note": note[:200]},
        )
    return row
