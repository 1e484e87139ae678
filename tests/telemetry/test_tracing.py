from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tierlink.telemetry import tracing


def test_span_continues_the_callers_trace_and_propagates_it():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    incoming = f"00-{trace_id}-00f067aa0ba902b7-01"
    original = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER = provider  # the test's own provider, restored below
    try:
        with tracing.span("tierlink.route", incoming, {"tierlink.node": "dev-1"}):
            outgoing = tracing.current_traceparent()
    finally:
        trace._TRACER_PROVIDER = original
    assert tracer is not None
    spans = exporter.get_finished_spans()
    assert len(spans) == 1 and format(spans[0].context.trace_id, "032x") == trace_id
    assert outgoing is not None and trace_id in outgoing and outgoing != incoming
