"""Every metric runplane exports, in one place (names, units, labels), so services, the dashboard
and the tests agree.

OpenTelemetry names map to Prometheus ones: ``runplane.run_delay`` with unit ``s`` is scraped as
``runplane_run_delay_seconds``; counters gain ``_total``. Labels are low-cardinality only: trigger,
job type, status, reason — never a job or run id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Observation, _Gauge

_meter = metrics.get_meter("runplane")


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Literal["histogram", "counter", "gauge"]
    unit: str

    def prometheus_names(self) -> set[str]:
        """The series names the Prometheus exporter writes for this instrument."""
        base = self.name.replace(".", "_") + ("_seconds" if self.unit == "s" else "")
        match self.kind:
            case "histogram":
                return {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
            case "counter":
                return {f"{base}_total"}
            case "gauge":
                return {base}


CATALOGUE: list[MetricSpec] = []


def _histogram(name: str, *, unit: str, description: str, buckets: tuple[float, ...]) -> Histogram:
    CATALOGUE.append(MetricSpec(name, "histogram", unit))
    return _meter.create_histogram(
        name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets
    )


def _counter(name: str, description: str) -> Counter:
    CATALOGUE.append(MetricSpec(name, "counter", ""))
    return _meter.create_counter(name, description=description)


def _gauge(name: str, description: str, unit: str = "") -> _Gauge:
    CATALOGUE.append(MetricSpec(name, "gauge", unit))
    return _meter.create_gauge(name, unit=unit, description=description)


def prometheus_names() -> set[str]:
    """Every series name runplane exports (for the dashboard's check)."""
    return set().union(*(spec.prometheus_names() for spec in CATALOGUE))


# Buckets resolve the on-time split operators watch: ≤ 25 s, 25–60 s, > 60 s.
DELAY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 60, 120, 300, 600, 1800, 3600)
DURATION_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600)

# -- histograms: the timestamps of DESIGN.md made into delays; labels: trigger, job_type ----------
trigger_lag = _histogram(
    "runplane.trigger_lag", unit="s", description="queued_at - scheduled_at: how accurate queuing is",
    buckets=DELAY_BUCKETS,
)  # fmt: skip
wait_time = _histogram(
    "runplane.wait_time", unit="s", description="dispatched_at - queued_at: waiting for run slots and serial execution",
    buckets=DELAY_BUCKETS,
)  # fmt: skip
prep_time = _histogram(
    "runplane.prep_time", unit="s", description="started_at - dispatched_at: making the environment",
    buckets=DELAY_BUCKETS,
)  # fmt: skip
run_delay = _histogram(
    "runplane.run_delay", unit="s", description="started_at - scheduled_at: on time when <= 60 s",
    buckets=DELAY_BUCKETS,
)  # fmt: skip
run_duration = _histogram(
    "runplane.run_duration", unit="s", description="finished_at - started_at",
    buckets=DURATION_BUCKETS,
)  # fmt: skip

# -- counters ------------------------------------------------------------------------------------
runs_queued = _counter("runplane.runs.queued", "Runs inserted (trigger, job_type)")
runs_started = _counter("runplane.runs.started", "Runs claimed by a runner (trigger, job_type)")
runs_finished = _counter("runplane.runs.finished", "Runs that reached a terminal status (status, trigger, job_type)")
cancellations = _counter(
    "runplane.runs.cancelled",
    description=(
        "Cancellations by reason: over_scheduled, superseded_no_slot, superseded_system_behind (alert: runplane "
        "was behind), superseded_merge, user, job_deleted, overlap_replaced"
    ),
)
retries = _counter("runplane.runs.retried", "Retry runs queued (reason)")
occurrences_skipped = _counter(
    "runplane.occurrences.skipped", "Cron occurrences that got no run, recorded as skipped (reason, policy)"
)
deactivations = _counter("runplane.jobs.deactivated", "Jobs deactivated after failing")
pickups_published = _counter("runplane.pickups.published", "Accounts named by the Pickups sent (source)")
pickups_dropped = _counter(
    "runplane.pickups.dropped", "Pickups dropped because another dispatcher held the account lock"
)
pool_launches = _counter(
    "runplane.pool.launches",
    "Runs launched, by whether a started runner of a warm pool was waiting for the run (served: warm) or the run "
    "waited for a runner to start (served: cold) (pool: none when no pool fits the run; cluster, served)",
)
lock_attempts = _counter("runplane.dispatcher.lock_attempts", "Account lock attempts (result: acquired, held)")
launch_failures = _counter("runplane.launch.failures", "Failed launches (launcher, retryable)")
bus_redeliveries = _counter(
    "runplane.bus.redeliveries", "Bus messages delivered again after a consumer died (message_type)"
)
bus_dead_lettered = _counter(
    "runplane.bus.dead_lettered",
    "Bus messages moved to the dead-letter queue after failing every delivery (message_type, queue_kind)",
)
orchestrator_assigned = _counter("runplane.orchestrator.assigned", "Jobs sent in Assign")
orchestrator_updates = _counter("runplane.orchestrator.updates", "Jobs sent in Update messages")
orchestrator_revoked = _counter("runplane.orchestrator.revoked", "Jobs sent in Revoke messages")
workers_declared_dead = _counter("runplane.orchestrator.workers_dead", "Queuer workers declared dead")
workers_drifted = _counter(
    "runplane.orchestrator.workers_drifted",
    "Queuer workers found not holding exactly what they own, told to drop everything and take their jobs again",
)
webhook_attempts = _counter(
    "runplane.webhooks.attempts", "Outgoing webhook delivery attempts (result: delivered, failed)"
)
worker_messages = _counter(
    "runplane.worker.messages", "Assign/Update/Revoke messages a worker received (kind, applied)"
)
worker_stalls = _counter(
    "runplane.worker.stalls_waited",
    "Times a queuer worker found itself declared dead after standing still, and held its fires for the leader",
)

# -- gauges --------------------------------------------------------------------------------------
queued_runs = _gauge("runplane.runs.queued_now", "Runs queued right now")
oldest_queued_age = _gauge("runplane.runs.oldest_queued_age", "Age of the oldest queued run", unit="s")
running_runs = _gauge("runplane.runs.running_now", "Runs starting or running right now")
slots_in_use = _gauge("runplane.slots.in_use", "Run slots taken, all accounts")
stuck_runs = _gauge(
    "runplane.runs.stuck_now",
    "Runs starting for longer than the start timeout, or running with an expired lease (the reaper's work)",
)
accounts_by_on_time_ratio = _gauge(
    "runplane.accounts.by_on_time_ratio",
    "Accounts whose on-time ratio over the last window is at most at_most (0.5, 0.8, 0.9, 0.95, 0.99; 1 counts "
    "every account with runs in the window). A few series whatever the number of accounts; runplane status names "
    "the worst ones",
)
intake_bound = _gauge(
    "runplane.dispatcher.intake_bound",
    "Runs a dispatcher may hold at once: its cluster's room, and its create rate times kubernetes.intake_horizon "
    "(cluster)",
)
create_rate = _gauge(
    "runplane.dispatcher.create_rate",
    "Runs per second a dispatcher launches, measured over its batches of launches (EWMA; cluster)",
)
pool_idle = _gauge(
    "runplane.pool.idle", "Started runners of a pool not given a run yet: waiting or starting (pool, cluster)"
)
pool_target = _gauge("runplane.pool.target", "The size a pool is being brought to (pool, cluster)")
pool_forecast = _gauge(
    "runplane.pool.forecast",
    "The most runs of a pool's kind due in one minute within its lead time, cron fires and API rate (pool, cluster)",
)
pool_queued = _gauge("runplane.pool.queued", "Due runs queued for a pool's kind (pool, cluster)")
pool_lead_time = _gauge(
    "runplane.pool.lead_time", "Seconds before a minute a pool holds that minute's forecast (pool, cluster)", unit="s"
)

# -- gauges read from a process's own state when scraped (callbacks given by the service) ---------
OBSERVED_GAUGES: dict[str, tuple[str, str]] = {  # name -> (description, unit)
    "runplane.worker.jobs_owned": ("Jobs a queuer worker holds in its heap (worker)", ""),
    "runplane.orchestrator.worker_jobs_owned": ("Jobs each live worker reports owning, as the leader sees it", ""),
    "runplane.worker.heartbeat_age": ("Seconds since the leader heard each live worker (worker)", "s"),
    "runplane.orchestrator.term": ("The leader's term", ""),
    "runplane.orchestrator.leader": ("1 while this process leads", ""),
}
CATALOGUE.extend(MetricSpec(name, "gauge", unit) for name, (_, unit) in OBSERVED_GAUGES.items())


def observe_gauge(name: str, callback: Callable[[CallbackOptions], Iterable[Observation]]) -> None:
    """Register the callback of one of :data:`OBSERVED_GAUGES`."""
    description, unit = OBSERVED_GAUGES[name]
    _meter.create_observable_gauge(name, callbacks=[callback], unit=unit, description=description)
