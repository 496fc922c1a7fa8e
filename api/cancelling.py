"""Cancelling a run on request: the one home of that rule, for gRPC and REST alike."""

from __future__ import annotations

import logging

from api.lookup import existing_run
from api.rows import Run
from api.store import Store
from runplane.adapters import instruments
from runplane.basics.errors import FailedPrecondition
from runplane.basics.types import AccountId, RunStatus

log = logging.getLogger(__name__)
CANCELLED_BEFORE_START = "Cancelled on request before it started."


async def cancel_run(store: Store, account_id: AccountId, run_id: int) -> Run:
    """Cancel a queued run at once, or ask the runner of a starting/running one to stop; the run after.

    A finished run is FailedPrecondition; a run of another account is NotFound.
    """
    # A run may move between the statements (queued -> starting, or back after a failed
    # launch); each statement is a compare-and-set, so retrying settles it.
    for _ in range(5):
        async with store.connection() as conn:
            row = await store.cancel_queued_run(conn, account_id, run_id, CANCELLED_BEFORE_START)
            if row is None:
                row = await store.request_cancel(conn, account_id, run_id)
            if row is not None:
                log.info("run cancel requested", extra={"account_id": account_id, "run_id": run_id})
                if row.status == RunStatus.CANCELLED:
                    instruments.cancellations.add(1, {"reason": "user"})
                return row
            current = await existing_run(store, conn, account_id, run_id)
            if RunStatus(current.status).is_terminal:
                raise FailedPrecondition(f"run {run_id} already finished ({RunStatus(current.status).name.lower()})")
    raise FailedPrecondition(f"run {run_id} keeps changing status; try again")
