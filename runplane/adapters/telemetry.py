"""Metrics: OpenTelemetry instruments in every service, exported for Prometheus on ``/metrics``.

Services create instruments with ``opentelemetry.metrics.get_meter(__name__)`` at import time; the
API's proxy meters attach them to the provider that ``setup_metrics`` installs in the entry point.
The instruments themselves are declared in ``runplane.adapters.instruments``.
"""

from __future__ import annotations

import logging

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import start_http_server

log = logging.getLogger(__name__)

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
        readers.append(PrometheusMetricReader(scope_info_enabled=False))
        start_http_server(port=port, addr=host)
        log.info("metrics endpoint up", extra={"port": port})
    provider = MeterProvider(
        metric_readers=readers,
        resource=Resource.create({"service.name": f"runplane-{service}"}),
    )
    metrics.set_meter_provider(provider)
    _installed = provider
    return provider
