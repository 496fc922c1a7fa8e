"""OpenTelemetry instruments of the orchestrator (exporting them is the entry point's business)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

meter = metrics.get_meter(__name__)

jobs_assigned = meter.create_counter("runplane.orchestrator.jobs_assigned", description="Jobs sent in Assign messages")
jobs_updated = meter.create_counter("runplane.orchestrator.jobs_updated", description="Jobs sent in Update messages")
jobs_revoked = meter.create_counter("runplane.orchestrator.jobs_revoked", description="Jobs sent in Revoke messages")
workers_declared_dead = meter.create_counter(
    "runplane.orchestrator.workers_dead", description="Queuer workers declared dead after missing heartbeats"
)


def observe(
    term: Callable[[], int],
    heartbeat_ages: Callable[[], dict[str, float]],
    jobs_owned: Callable[[], dict[str, int]],
) -> None:
    """Register the gauges read from the leader's state: term, heartbeat age and jobs per worker."""

    def term_cb(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(term())

    def age_cb(_options: CallbackOptions) -> Iterable[Observation]:
        for worker_id, age in heartbeat_ages().items():
            yield Observation(age, {"worker_id": worker_id})

    def owned_cb(_options: CallbackOptions) -> Iterable[Observation]:
        for worker_id, count in jobs_owned().items():
            yield Observation(count, {"worker_id": worker_id})

    meter.create_observable_gauge("runplane.orchestrator.term", callbacks=[term_cb], description="Leader's term")
    meter.create_observable_gauge(
        "runplane.orchestrator.heartbeat_age",
        unit="s",
        callbacks=[age_cb],
        description="Seconds since each worker's heartbeat",
    )
    meter.create_observable_gauge(
        "runplane.orchestrator.jobs_owned", callbacks=[owned_cb], description="Jobs each worker reports owning"
    )
