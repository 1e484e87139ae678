"""Spans of code under test, kept in memory: ``with recorded_spans() as exporter:``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tierlink.telemetry import tracing


@contextlib.contextmanager
def recorded_spans() -> Iterator[Any]:
    """Inside the block this process's spans go to the in-memory exporter it yields
    (``get_finished_spans()``); the previous provider is back afterwards."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tracing.installed(provider):
        yield exporter
    provider.shutdown()
