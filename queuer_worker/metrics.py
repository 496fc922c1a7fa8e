"""OpenTelemetry instruments of the queuer worker (exporting them is the entry point's business)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

meter = metrics.get_meter(__name__)

trigger_lag = meter.create_histogram(
    "runplane.queuer.trigger_lag", unit="s", description="queued_at - scheduled_at of each cron run queued"
)
runs_queued = meter.create_counter("runplane.queuer.runs_queued", description="Cron runs inserted")
runs_superseded = meter.create_counter(
    "runplane.queuer.runs_superseded", description="Older queued cron runs cancelled as over-scheduled"
)
messages_applied = meter.create_counter(
    "runplane.queuer.messages", description="Assign/Update/Revoke messages by kind and whether they were applied"
)


def observe_jobs_owned(worker_id: str, count: Callable[[], int]) -> None:
    """Register the gauge of jobs this worker owns."""

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(count(), {"worker_id": worker_id})

    meter.create_observable_gauge(
        "runplane.queuer.jobs_owned", callbacks=[callback], description="Jobs this queuer worker owns"
    )
