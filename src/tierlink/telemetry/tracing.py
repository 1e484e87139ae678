"""OpenTelemetry traces that follow one request from device to cloud.

The W3C ``traceparent`` travels in the OIP request parameters; each node opens a
``tierlink.route`` span as a child of it and forwards its own context upstream. Inside it,
each stage of the request has a span of its own (the vocabulary is ``STAGES``): the
policy's plan, the scheduler's queue wait and the model's compute, the escalation decision,
an upstream call, a fallback, a hedge, a split's encode / transfer / decode, and the
store-and-forward of an asynchronous answer.

Spans go wherever the process's tracer provider sends them: nowhere by default (the API's
no-op provider, and the stage helpers here do nothing at all), over OTLP to a collector
with ``configure(TraceSettings(otlp_endpoint=...))``, or to a JSON-lines file. The
simulator runs the nodes' own dispatcher and scheduler: with tracing off they pay one
boolean test per stage.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CARRIER_KEY = "traceparent"
_TRACER = "tierlink"

# name -> what it covers; the waterfall (`tierlink trace show`) and the docs use the same.
STAGES: Mapping[str, str] = {
    "tierlink.route": "one node's handling of a routed request, start to answer",
    "tierlink.plan": "the policy's placement plan (the escalation path it chose)",
    "tierlink.queue": "waiting in the node's scheduler for a worker",
    "tierlink.compute": "the model (or a split's head or tail) running",
    "tierlink.escalation": "the confidence check after an answer: keep it or go up",
    "tierlink.upstream": "one call to an upstream node (the next node's spans are inside)",
    "tierlink.fallback": "a placement that failed or was skipped, and why",
    "tierlink.hedge": "a second call sent because the first ran late",
    "tierlink.split.encode": "a split's cut tensor encoded for the wire",
    "tierlink.split.transfer": "the encoded features sent to the tail's node and answered",
    "tierlink.split.decode": "the tail's node decoding the features",
    "tierlink.tail": "one node running a split's tail",
    "tierlink.model": "one node running a model asked for by name (not routed)",
    "tierlink.outbox.store": "an asynchronous answer written to the node's outbox",
    "tierlink.outbox.forward": "a batch of stored answers delivered to the control plane",
}

_enabled = False  # set by configure(): the stage helpers below cost nothing while False
_provider: Any = None
_tracer_obj: Any = None  # the provider's tracer, made once (a Tracer per call costs)


def _tracer() -> Any:
    global _tracer_obj
    if _tracer_obj is None:
        from opentelemetry import trace

        _tracer_obj = trace.get_tracer(_TRACER)
    return _tracer_obj


@dataclass(frozen=True)
class TraceSettings:
    """Where a process's spans go. ``otlp_endpoint``: a collector's base URL
    (``http://host:4318``; ``/v1/traces`` is added when no path is given) or, with
    ``protocol: grpc``, ``host:4317``. ``file``: JSON lines, one span per line.
    ``sample_ratio``: the share of new traces recorded (a child follows its parent)."""

    # an OTLP collector: http://host:4318, or host:4317 with grpc (none: no spans sent)
    otlp_endpoint: str | None = None
    protocol: str = "http/protobuf"  # how spans are sent to it: http/protobuf or grpc
    file: str | None = None
    # share of new traces recorded (0..1); a request that brings a trace follows its caller
    sample_ratio: float = 1.0

    @property
    def on(self) -> bool:
        return bool(self.otlp_endpoint or self.file)


PROTOCOLS = ("http/protobuf", "grpc")


def enabled() -> bool:
    return _enabled


def configure(settings: TraceSettings, service_name: str) -> None:
    """Send this process's spans where ``settings`` say (nothing when neither an endpoint
    nor a file is named). Call ``shutdown()`` before the process exits: spans are batched."""
    global _enabled, _provider
    if not settings.on:
        return
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                              sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
    if settings.otlp_endpoint:
        provider.add_span_processor(BatchSpanProcessor(
            _otlp_exporter(settings), schedule_delay_millis=500.0))
    if settings.file:
        provider.add_span_processor(SimpleSpanProcessor(_json_lines_exporter(Path(settings.file))))
    trace.set_tracer_provider(provider)
    _provider, _enabled = provider, True
    _reset_tracer()


@contextlib.contextmanager
def installed(provider: Any) -> Iterator[None]:
    """``provider`` takes this process's spans inside the block, the stage helpers on
    (tests: ``tierlink.testing.spans``). The API lets a provider be set only once per
    process, so the previous one is swapped back by hand."""
    global _enabled
    from opentelemetry import trace

    previous, was = trace._TRACER_PROVIDER, _enabled
    trace._TRACER_PROVIDER, _enabled = provider, True
    _reset_tracer()
    try:
        yield
    finally:
        trace._TRACER_PROVIDER, _enabled = previous, was
        _reset_tracer()


def shutdown() -> None:
    """Flush and close what ``configure`` opened (a no-op when it opened nothing)."""
    global _enabled, _provider
    if _provider is not None:
        _provider.shutdown()
    _provider, _enabled = None, False
    _reset_tracer()


def _recording() -> bool:
    """Tracing is on and this request's trace is sampled (a child of an unsampled span
    would be dropped anyway: it is not made)."""
    if not _enabled:
        return False
    from opentelemetry import trace

    return bool(trace.get_current_span().is_recording())


def _reset_tracer() -> None:
    global _tracer_obj
    _tracer_obj = None


def otlp_traces_url(endpoint: str) -> str:
    """``http://host:4318`` -> ``http://host:4318/v1/traces``; a URL with a path is kept."""
    from urllib.parse import urlsplit

    return endpoint if urlsplit(endpoint).path.strip("/") else endpoint.rstrip("/") + "/v1/traces"


def _otlp_exporter(settings: TraceSettings) -> Any:
    assert settings.otlp_endpoint is not None
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=settings.otlp_endpoint, insecure=True, timeout=5)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=otlp_traces_url(settings.otlp_endpoint), timeout=5)


def _json_lines_exporter(path: Path) -> Any:
    """The SDK's own JSON of each span, one per line (``tierlink trace show`` reads it)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonLines(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            with path.open("a") as fh:
                for s in spans:
                    fh.write(json.dumps(json.loads(s.to_json())) + "\n")
            return SpanExportResult.SUCCESS

    return JsonLines()


# -- spans -----------------------------------------------------------------------------------


@contextlib.contextmanager
def span(name: str, traceparent: str | None, attributes: Mapping[str, Any]) -> Iterator[Any]:
    """A span that continues the caller's trace (if ``traceparent`` is given); yields the
    span (None while tracing is off) so the caller can add what it learns."""
    if not _enabled and not traceparent:  # nothing to record and no trace to carry on
        yield None
        return
    from opentelemetry import context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = (TraceContextTextMapPropagator().extract({_CARRIER_KEY: traceparent})
              if traceparent else context.get_current())
    with _tracer().start_as_current_span(name, context=parent,
                                         attributes=dict(attributes)) as s:
        yield s if _enabled else None


@contextlib.contextmanager
def stage(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """A child of the current span for one stage (see ``STAGES``); yields the span, or None
    while tracing is off (then nothing is created at all)."""
    if not _recording():
        yield None
        return
    with _tracer().start_as_current_span(name, attributes=dict(attributes or {})) as s:
        yield s


def mark(name: str, attributes: Mapping[str, Any]) -> None:
    """A stage that is a moment, not a duration (a fallback, a decision)."""
    if not _recording():
        return
    _tracer().start_span(name, attributes=dict(attributes)).end()


def set_attributes(s: Any, attributes: Mapping[str, Any]) -> None:
    """Add to a span from ``span``/``stage`` (which may be None: tracing off)."""
    if s is not None:
        s.set_attributes({k: v for k, v in attributes.items() if v is not None})


def capture() -> Any:
    """The current context, to parent spans recorded later from another thread
    (``record``); None while tracing is off."""
    if not _recording():
        return None
    from opentelemetry import context

    return context.get_current()


def record(name: str, parent: Any, start: float, end: float, now: float,
           attributes: Mapping[str, Any] | None = None) -> None:
    """A finished span from ``start`` to ``end`` on a monotonic clock whose reading is
    ``now`` (the scheduler's queue wait and compute), under ``parent`` from ``capture``."""
    if parent is None:
        return
    wall_ns = time.time_ns()
    begin_ns = wall_ns - int((now - start) * 1e9)
    end_ns = wall_ns - int((now - end) * 1e9)
    attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
    s = _tracer().start_span(name, context=parent, start_time=begin_ns, attributes=attrs)
    s.end(end_time=end_ns)


def error(s: Any, reason: str) -> None:
    """Mark a span from ``stage`` failed (None: tracing off)."""
    if s is None:
        return
    from opentelemetry.trace import Status, StatusCode

    s.set_status(Status(StatusCode.ERROR, reason))


def prepare() -> None:
    """Load what a span needs now (a node calls this before it serves): the first import of
    OpenTelemetry costs tens of milliseconds, which a first request must not pay out of its
    deadline."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    trace.get_tracer(_TRACER)
    TraceContextTextMapPropagator()


def current_traceparent() -> str | None:
    """The ``traceparent`` to send upstream from inside the current span (None if no-op)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get(_CARRIER_KEY)
