"""The queuer worker's metrics. Instruments are declared in ``runplane.adapters.instruments``.

Runs queued and their trigger lag are not counted here: the scheduler loop makes them from the run
rows once per run, whoever queued it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from runplane.adapters import instruments

messages_applied = instruments.worker_messages
stalls_waited = instruments.worker_stalls


# Why a superseded run was still waiting -> the cancellation reason operators see.
_SUPERSEDED_REASONS = {
    "job_running": "over_scheduled",
    "no_slot": "superseded_no_slot",
    "behind": "superseded_system_behind",
}


def runs_superseded(waiting: str, count: int) -> None:
    """Older queued cron runs cancelled by a newer one, by why they were still waiting.

    ``superseded_system_behind`` is runplane's own fault (no user cause): operators alert on it."""
    instruments.cancellations.add(count, {"reason": _SUPERSEDED_REASONS[waiting]})


def observe_jobs_owned(worker_id: str, count: Callable[[], int]) -> None:
    """Register the gauge of jobs this worker owns."""

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(count(), {"worker": worker_id})

    instruments.observe_gauge("runplane.worker.jobs_owned", callback)
