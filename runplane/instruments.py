"""Every metric runplane exports, in one place (names, units, labels), so services, the dashboard
and the tests agree.

OpenTelemetry names map to Prometheus ones: ``runplane.run_delay`` with unit ``s`` is scraped as
``runplane_run_delay_seconds``; counters gain ``_total``. Labels are low-cardinality only: trigger,
job type, status, reason — never a job or run id.
"""

from __future__ import annotations

from opentelemetry import metrics

_meter = metrics.get_meter("runplane")

# Buckets resolve the on-time split operators watch: ≤ 25 s, 25–60 s, > 60 s.
DELAY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 60, 120, 300, 600, 1800, 3600)
DURATION_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600)

# -- histograms: the timestamps of DESIGN.md made into delays; labels: trigger, job_type ----------
trigger_lag = _meter.create_histogram(
    "runplane.trigger_lag", unit="s", description="queued_at - scheduled_at: how accurate queuing is",
    explicit_bucket_boundaries_advisory=DELAY_BUCKETS,
)  # fmt: skip
wait_time = _meter.create_histogram(
    "runplane.wait_time", unit="s", description="dispatched_at - queued_at: waiting for run slots and serial execution",
    explicit_bucket_boundaries_advisory=DELAY_BUCKETS,
)  # fmt: skip
prep_time = _meter.create_histogram(
    "runplane.prep_time", unit="s", description="started_at - dispatched_at: making the environment",
    explicit_bucket_boundaries_advisory=DELAY_BUCKETS,
)  # fmt: skip
run_delay = _meter.create_histogram(
    "runplane.run_delay", unit="s", description="started_at - scheduled_at: on time when <= 60 s",
    explicit_bucket_boundaries_advisory=DELAY_BUCKETS,
)  # fmt: skip
run_duration = _meter.create_histogram(
    "runplane.run_duration", unit="s", description="finished_at - started_at",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)  # fmt: skip

# -- counters ------------------------------------------------------------------------------------
runs_queued = _meter.create_counter("runplane.runs.queued", description="Runs inserted (trigger, job_type)")
runs_started = _meter.create_counter(
    "runplane.runs.started", description="Runs claimed by a runner (trigger, job_type)"
)
runs_finished = _meter.create_counter(
    "runplane.runs.finished", description="Runs that reached a terminal status (status, trigger, job_type)"
)
cancellations = _meter.create_counter(
    "runplane.runs.cancelled",
    description="Cancellations by reason: over_scheduled, superseded_merge, user, job_deleted",
)
retries = _meter.create_counter("runplane.runs.retried", description="Retry runs queued (reason)")
deactivations = _meter.create_counter("runplane.jobs.deactivated", description="Jobs deactivated after failing")
pickups_published = _meter.create_counter("runplane.pickups.published", description="Pickups sent (source)")
pickups_dropped = _meter.create_counter(
    "runplane.pickups.dropped", description="Pickups dropped because another dispatcher held the account lock"
)
lock_attempts = _meter.create_counter(
    "runplane.dispatcher.lock_attempts", description="Account lock attempts (result: acquired, held)"
)
launch_failures = _meter.create_counter("runplane.launch.failures", description="Failed launches (launcher, retryable)")
bus_redeliveries = _meter.create_counter(
    "runplane.bus.redeliveries", description="Bus messages delivered again after a consumer died (message_type)"
)
orchestrator_assigned = _meter.create_counter("runplane.orchestrator.assigned", description="Jobs sent in Assign")
orchestrator_updates = _meter.create_counter("runplane.orchestrator.updates", description="Update messages sent")

# -- gauges --------------------------------------------------------------------------------------
queued_runs = _meter.create_gauge("runplane.runs.queued_now", description="Runs queued right now")
oldest_queued_age = _meter.create_gauge(
    "runplane.runs.oldest_queued_age", unit="s", description="Age of the oldest queued run"
)
running_runs = _meter.create_gauge("runplane.runs.running_now", description="Runs starting or running right now")
slots_in_use = _meter.create_gauge("runplane.slots.in_use", description="Run slots taken, all accounts")
jobs_owned = _meter.create_gauge("runplane.worker.jobs_owned", description="Jobs a queuer worker owns (worker)")
heartbeat_age = _meter.create_gauge(
    "runplane.worker.heartbeat_age", unit="s", description="Seconds since a worker's last heartbeat (worker)"
)
orchestrator_term = _meter.create_gauge("runplane.orchestrator.term", description="The leader's term")
orchestrator_leader = _meter.create_gauge("runplane.orchestrator.leader", description="1 while this process leads")
