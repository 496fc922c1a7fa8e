"""The orchestrator's metrics: counters of what it sends, and gauges read from the leader's state.

Instruments are declared in ``runplane.adapters.instruments`` (one catalogue for every service and the
dashboard); this module only feeds them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from runplane.adapters import instruments

jobs_assigned = instruments.orchestrator_assigned
jobs_updated = instruments.orchestrator_updates
jobs_revoked = instruments.orchestrator_revoked
workers_declared_dead = instruments.workers_declared_dead
workers_drifted = instruments.workers_drifted


def observe(
    term: Callable[[], int],
    heartbeat_ages: Callable[[], dict[str, float]],
    jobs_owned: Callable[[], dict[str, int]],
) -> None:
    """Register the gauges read from the leader's state: term, leadership, heartbeat age, jobs per worker."""

    def term_cb(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(term())

    def leader_cb(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(1)  # only the leader registers; losing the lock ends the process

    def age_cb(_options: CallbackOptions) -> Iterable[Observation]:
        for worker_id, age in heartbeat_ages().items():
            yield Observation(age, {"worker": worker_id})

    def owned_cb(_options: CallbackOptions) -> Iterable[Observation]:
        for worker_id, count in jobs_owned().items():
            yield Observation(count, {"worker": worker_id})

    instruments.observe_gauge("runplane.orchestrator.term", term_cb)
    instruments.observe_gauge("runplane.orchestrator.leader", leader_cb)
    instruments.observe_gauge("runplane.worker.heartbeat_age", age_cb)
    instruments.observe_gauge("runplane.orchestrator.worker_jobs_owned", owned_cb)
