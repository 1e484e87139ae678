"""OpenTelemetry traces that follow one request from device to cloud.

The W3C ``traceparent`` travels in the OIP request parameters; each node opens a span as a
child of it and forwards its own context upstream. Spans go wherever the process's tracer
provider sends them: nowhere by default (the API's no-op provider), a JSON-lines file with
``configure_file_exporter``, or an in-memory exporter in tests.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

_CARRIER_KEY = "traceparent"


@contextlib.contextmanager
def span(name: str, traceparent: str | None, attributes: Mapping[str, Any]) -> Iterator[None]:
    """A span that continues the caller's trace (if ``traceparent`` is given)."""
    from opentelemetry import context, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = (TraceContextTextMapPropagator().extract({_CARRIER_KEY: traceparent})
              if traceparent else context.get_current())
    tracer = trace.get_tracer("tierlink")
    with tracer.start_as_current_span(name, context=parent, attributes=dict(attributes)):
        yield


def prepare() -> None:
    """Load what a span needs now (a node calls this before it serves): the first import of
    OpenTelemetry costs tens of milliseconds, which a first request must not pay out of its
    deadline."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    trace.get_tracer("tierlink")
    TraceContextTextMapPropagator()


def current_traceparent() -> str | None:
    """The ``traceparent`` to send upstream from inside the current span (None if no-op)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get(_CARRIER_KEY)


def configure_file_exporter(path: Path, service_name: str) -> None:
    """Record this process's spans as JSON lines in ``path`` (a real OTLP collector can
    replace this in production; none is packaged for our machines)."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class _JsonLines(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            with path.open("a") as fh:
                for s in spans:
                    fh.write(json.dumps(json.loads(s.to_json())) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(SimpleSpanProcessor(_JsonLines()))
    trace.set_tracer_provider(provider)
