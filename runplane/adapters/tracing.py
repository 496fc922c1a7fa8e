"""Traces: spans for trigger → queue → pickup → dispatch → launch → runner steps.

Context travels in W3C ``traceparent`` form: in gRPC metadata, in AMQP message headers, and on the
run row itself (``runs.trace_parent``), because a Pickup names an account, not a run, and a runner
may start long after the message that led to it. Export is OTLP when an endpoint is configured and
off otherwise (the API's no-op tracer costs nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

log = logging.getLogger(__name__)

_provider: TracerProvider | None = None


def setup_tracing(service: str, otlp_endpoint: str) -> TracerProvider | None:
    """Install the tracer provider of this process when ``otlp_endpoint`` is set. Entry points only."""
    global _provider
    if not otlp_endpoint or _provider is not None:
        return _provider
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": f"runplane-{service}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint, insecure=True)))
    trace.set_tracer_provider(provider)
    _provider = provider
    log.info("tracing to OTLP", extra={"endpoint": otlp_endpoint})
    return provider


def shutdown_tracing() -> None:
    """Flush spans before the process exits."""
    if _provider is not None:
        _provider.shutdown()


def recording() -> bool:
    """Whether this process has a tracer provider that records spans (hot paths skip making spans otherwise)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def current_traceparent() -> str:
    """The current span's context as a ``traceparent`` string ('' when there is none)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


def inject(headers: dict[str, object] | None = None) -> dict[str, object]:
    """Headers carrying the current trace context (for AMQP messages and gRPC metadata)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    out: dict[str, object] = dict(headers or {})
    out.update(carrier)
    return out


def extract(carrier: Mapping[str, object] | str | None) -> context.Context:
    """A context from headers, or from a bare ``traceparent`` string."""
    if not carrier:
        return context.Context()
    if isinstance(carrier, str):
        return propagate.extract({"traceparent": carrier})
    return propagate.extract({k: str(v) for k, v in carrier.items()})
