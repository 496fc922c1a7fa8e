"""The queuer worker's metrics. Instruments are declared in ``runplane.instruments``.

Runs queued and their trigger lag are not counted here: the scheduler loop makes them from the run
rows once per run, whoever queued it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from runplane import instruments

messages_applied = instruments.worker_messages


def runs_superseded(count: int) -> None:
    """Older queued cron runs cancelled as over-scheduled."""
    instruments.cancellations.add(count, {"reason": "over_scheduled"})


def observe_jobs_owned(worker_id: str, count: Callable[[], int]) -> None:
    """Register the gauge of jobs this worker owns."""

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(count(), {"worker": worker_id})

    instruments.observe_gauge("runplane.worker.jobs_owned", callback)
