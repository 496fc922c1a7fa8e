"""This test process's metrics, read in memory: the instruments are global, as in a service, so one
meter provider is installed once per session (OpenTelemetry refuses a second)."""

from __future__ import annotations

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint


@pytest.fixture(scope="session")
def metric_reader() -> InMemoryMetricReader:
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def counted(reader: InMemoryMetricReader, name: str, **attributes: str) -> float:
    """The sum of the points of counter ``name`` whose attributes include ``attributes``."""
    data = reader.get_metrics_data()
    return sum(
        point.value
        for resource in (data.resource_metrics if data else [])
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
        if isinstance(point, NumberDataPoint)
        and all((point.attributes or {}).get(k) == v for k, v in attributes.items())
    )
