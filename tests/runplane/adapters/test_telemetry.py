"""Metrics reach Prometheus: a process that records into runplane's instruments serves them on
/metrics, with Prometheus names, units and the delay buckets, readable by a real text parser."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.support.polling import wait_for
from tests.support.ports import free_port

SCRIPT = """
import sys, time
from runplane.adapters.telemetry import setup_metrics
from runplane.adapters import instruments as m
setup_metrics("test", int(sys.argv[1]), host="127.0.0.1")
attrs = {"trigger": "schedule", "job_type": "deploy"}
for delay in (3.0, 30.0, 90.0):
    m.run_delay.record(delay, attrs)
m.runs_finished.add(2, {"status": "success", "trigger": "api", "job_type": "deploy"})
m.queued_runs.set(5)
print("ready", flush=True)
time.sleep(60)
"""


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def test_instruments_are_scraped_with_prometheus_names_and_buckets() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        body = wait_for(lambda: _scrape(port), 15, what="/metrics to answer")
        families = list(text_string_to_metric_families(body))

        def sample(name: str, **labels: str) -> float:
            found = [
                s.value for f in families for s in f.samples
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
            ]  # fmt: skip
            assert len(found) == 1, (name, labels, found)
            return float(found[0])

        attrs = {"job_type": "deploy", "trigger": "schedule"}
        assert sample("runplane_run_delay_seconds_count", **attrs) == 3
        assert sample("runplane_run_delay_seconds_sum", **attrs) == 123.0
        # The on-time split is computable from the buckets: 1 run ≤ 25 s, 2 ≤ 60 s, 3 in all.
        assert sample("runplane_run_delay_seconds_bucket", le="25", **attrs) == 1
        assert sample("runplane_run_delay_seconds_bucket", le="60", **attrs) == 2
        assert sample("runplane_runs_finished_total", status="success", trigger="api", job_type="deploy") == 2
        assert sample("runplane_runs_queued_now") == 5
        assert "otel_scope_name" not in body
    finally:
        proc.kill()
        proc.communicate()
