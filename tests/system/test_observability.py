"""Observability end to end on the real system (`runplane up`): after cron runs, a run now, a
cancellation, a failure and a wait for a slot, every service's /metrics agrees with the run rows,
and one trace runs from TriggerRun through the bus and the dispatcher to the runner's steps."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import psycopg
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, runs_pb2, runs_pb2_grpc
from tests.support.polling import wait_for
from tests.support.ports import free_ports

pytestmark = pytest.mark.slow
SERVICES = 7  # api, orchestrator, 2 queuer workers, scheduler, 2 dispatchers


@dataclass
class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver: what the services export lands here."""

    spans: list[tuple[str, str, str]] = field(default_factory=list)  # (trace_id, service, span name)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def Export(self, request: Any, context: Any) -> Any:
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next(
                    (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
                )
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append((span.trace_id.hex(), service, span.name))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    servicer = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    # opentelemetry-proto's generated gRPC module has no annotations: its registration is typed here.
    add_servicer: Callable[[Collector, grpc.Server], None] = trace_service_pb2_grpc.add_TraceServiceServicer_to_server
    add_servicer(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(grace=None).wait()


def _scrape(ports: list[int]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of every service, summed across services per name and labels."""
    total: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
        for family in text_string_to_metric_families(body):
            for s in family.samples:
                total[(s.name, tuple(sorted(s.labels.items())))] += s.value
    return total


def _sum(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(
        v for (n, ls), v in samples.items() if n == name and all(dict(ls).get(k) == x for k, x in labels.items())
    )


def test_metrics_and_traces_agree_with_the_runs(
    service_env: dict[str, str], database_url: str, db: psycopg.Connection[tuple[Any, ...]],
    collector: tuple[Collector, int],
) -> None:  # fmt: skip
    spans, otlp_port = collector
    api_port, *metrics_ports = free_ports(SERVICES + 1)
    env = dict(service_env)
    env.update(
        RUNPLANE_API__PORT=str(api_port),
        RUNPLANE_METRICS_PORT=str(metrics_ports[0]),
        RUNPLANE_OTLP_ENDPOINT=f"127.0.0.1:{otlp_port}",
        RUNPLANE_DRAIN_SECONDS="5",
        RUNPLANE_ORCHESTRATOR__HEARTBEAT_INTERVAL="1.0",
        RUNPLANE_ORCHESTRATOR__RECONCILE_INTERVAL="2",
    )
    admin = subprocess.run(
        [sys.executable, "-m", "runplane", "admin", "create-account", "--name", "obs", "--run-slots", "1"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    token = json.loads(admin.stdout)["token"]
    up = subprocess.Popen(
        [sys.executable, "-m", "runplane", "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{api_port}")
    try:
        metadata = (("authorization", f"Bearer {token}"),)
        jobs = jobs_pb2_grpc.JobServiceStub(channel)
        runs = runs_pb2_grpc.RunServiceStub(channel)
        grpc.channel_ready_future(channel).result(timeout=60)

        def create(name: str, steps: list[str], cron: str = "") -> int:
            triggers = jobs_pb2.JobTriggers(schedule=jobs_pb2.CronSchedule(cron=cron) if cron else None)
            job = jobs.CreateJob(
                jobs_pb2.CreateJobRequest(
                    name=name, job_type=common_pb2.JOB_TYPE_DEPLOY, steps=steps, triggers=triggers
                ),
                metadata=metadata, timeout=10,
            )  # fmt: skip
            return int(job.id)

        slow, failing = create("slow", ["sleep 2"]), create("failing", ["echo failing; exit 3"])
        cron_job = create("every-minute", ["echo scheduled"], cron="* * * * *")
        # A client span: its trace must reach the runner.
        traceparent_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
        traced = (*metadata, ("traceparent", f"00-{traceparent_trace}-00f067aa0ba902b7-01"))
        manual = runs_pb2.TriggerRunRequest
        first = runs.TriggerRun(manual(job_id=slow, trigger=common_pb2.TRIGGER_MANUAL), metadata=traced, timeout=10)
        failed = runs.TriggerRun(
            manual(job_id=failing, trigger=common_pb2.TRIGGER_MANUAL), metadata=metadata, timeout=10
        )
        third = runs.TriggerRun(manual(job_id=slow, trigger=common_pb2.TRIGGER_MANUAL), metadata=metadata, timeout=10)
        cancelled = runs.CancelRun(runs_pb2.CancelRunRequest(run_id=third.id), metadata=metadata, timeout=10)
        assert cancelled.status == common_pb2.RUN_STATUS_CANCELLED

        def status(run_id: int) -> int:
            return int(runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id), metadata=metadata, timeout=10).status)

        wait_for(
            lambda: status(first.id) == 10 and status(failed.id) == 20,
            60,
            interval=0.25,
            what="run now and the failing run",
        )
        wait_for(
            lambda: db.execute("SELECT count(*) FROM runs WHERE job_id = %s AND status = 10", (cron_job,)).fetchone()
            == (1,),
            75,
            interval=0.25,
            what="a cron run to succeed",
        )  # fmt: skip
        # No more cron fires, so the rows stop changing; then let the scheduler loop record them all.
        jobs.UpdateJob(
            jobs_pb2.UpdateJobRequest(job_id=cron_job, name="every-minute", job_type=common_pb2.JOB_TYPE_DEPLOY,
                                      steps=["echo scheduled"]),
            metadata=metadata, timeout=10,
        )  # fmt: skip
        wait_for(
            lambda: db.execute("SELECT count(*) FROM runs WHERE observed <> 7 OR status < 10").fetchone() == (0,),
            30,
            interval=0.25,
            what="every run terminal and recorded",
        )  # fmt: skip
        # The loop records a batch's instruments just after committing its flags: scrape until they show.
        counted = db.execute("SELECT count(*), count(started_at) FROM runs").fetchone()

        def recorded() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            samples = _scrape(metrics_ports)
            totals = (_sum(samples, "runplane_runs_finished_total"), _sum(samples, "runplane_runs_started_total"))
            return samples if counted is not None and totals == tuple(counted) else None

        samples = wait_for(recorded, 15, interval=0.25, what="the metrics to count every recorded run")
        rows = db.execute(
            """SELECT count(*),
                      count(*) FILTER (WHERE status = 10), count(*) FILTER (WHERE status = 20),
                      count(*) FILTER (WHERE status = 30),
                      count(started_at),
                      coalesce(sum(extract(epoch FROM started_at - scheduled_at)), 0)::float8,
                      coalesce(sum(extract(epoch FROM started_at - dispatched_at)), 0)::float8,
                      coalesce(sum(extract(epoch FROM dispatched_at - queued_at))
                               FILTER (WHERE started_at IS NOT NULL), 0)::float8,
                      count(*) FILTER (WHERE trigger = 'schedule')
                 FROM runs"""
        ).fetchone()  # fmt: skip
        assert rows is not None and samples is not None
        queued, success, error, cancelled_n, started, delay_sum, prep_sum, wait_sum, scheduled = rows
        assert scheduled >= 1 and started >= 3
        assert _sum(samples, "runplane_runs_queued_total") == queued
        assert _sum(samples, "runplane_runs_queued_total", trigger="schedule") == scheduled
        assert _sum(samples, "runplane_runs_finished_total", status="success") == success
        assert _sum(samples, "runplane_runs_finished_total", status="error") == error == 1
        assert _sum(samples, "runplane_runs_finished_total", status="cancelled") == cancelled_n == 1
        assert _sum(samples, "runplane_runs_cancelled_total", reason="user") == 1
        assert _sum(samples, "runplane_runs_started_total") == started
        assert _sum(samples, "runplane_run_delay_seconds_count") == started
        assert _sum(samples, "runplane_run_delay_seconds_sum") == pytest.approx(delay_sum, abs=1e-3 * started)
        assert _sum(samples, "runplane_prep_time_seconds_sum") == pytest.approx(prep_sum, abs=1e-3 * started)
        assert _sum(samples, "runplane_wait_time_seconds_sum") == pytest.approx(wait_sum, abs=1e-3 * started)
        order = db.execute(
            "SELECT (SELECT finished_at FROM runs WHERE id = %s) <= (SELECT started_at FROM runs WHERE id = %s)",
            (first.id, failed.id),
        ).fetchone()
        assert order == (True,)  # the failing run waited for the slow run's slot
        assert _sum(samples, "runplane_pickups_published_total") >= 1
        assert _sum(samples, "runplane_orchestrator_leader") == 1
        assert _sum(samples, "runplane_orchestrator_term") >= 1
        ages = [v for (n, _), v in samples.items() if n == "runplane_worker_heartbeat_age_seconds"]
        assert len(ages) == 2 and all(0 <= age < 10 for age in ages)  # both live workers, heard recently
        assert len([n for (n, _) in samples if n == "runplane_worker_jobs_owned"]) == 2
        assert _sum(samples, "runplane_runs_queued_now") == 0

        def traced_spans() -> set[str]:
            with spans.lock:
                return {f"{service}:{name}" for trace_id, service, name in spans.spans if trace_id == traceparent_trace}

        expected = {
            "runplane-api:TriggerRun",
            "runplane-dispatcher:dispatch",
            "runplane-runner:run",
            "runplane-runner:step 1",
        }
        wait_for(traced_spans, 30, until=expected.issubset, interval=0.25, what=f"spans {expected}")
    finally:
        channel.close()
        up.send_signal(signal.SIGTERM)
        try:
            up.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.communicate()
