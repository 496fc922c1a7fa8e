"""Metrics: OpenTelemetry instruments in every service, exported for Prometheus on ``/metrics``.

Services create instruments with ``opentelemetry.metrics.get_meter(__name__)`` at import time; the
API's proxy meters attach them to the provider that ``setup_metrics`` installs in the entry point.
Histograms of delays (names ending in ``_seconds``) share buckets that resolve the on-time split
(≤ 25 s, 25–60 s, > 60 s) that operators watch.
"""

from __future__ import annotations

import logging

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from prometheus_client import start_http_server

log = logging.getLogger(__name__)

DELAY_BUCKETS_SECONDS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 60, 120, 300, 600, 1800, 3600, 7200,
)  # fmt: skip

_installed: MeterProvider | None = None


def setup_metrics(service: str, port: int, host: str = "0.0.0.0") -> MeterProvider | None:
    """Install the meter provider of this process; serve ``/metrics`` on ``port`` (0: no endpoint).

    Called once, by the entry point.
    """
    global _installed
    if _installed is not None:
        return _installed
    readers = []
    if port:
        readers.append(PrometheusMetricReader())
        start_http_server(port=port, addr=host)
        log.info("metrics endpoint up", extra={"port": port})
    provider = MeterProvider(
        metric_readers=readers,
        resource=Resource.create({"service.name": f"runplane-{service}"}),
        views=[
            View(
                instrument_type=Histogram,
                instrument_name="*_seconds",
                aggregation=ExplicitBucketHistogramAggregation(DELAY_BUCKETS_SECONDS),
            )
        ],
    )
    metrics.set_meter_provider(provider)
    _installed = provider
    return provider
