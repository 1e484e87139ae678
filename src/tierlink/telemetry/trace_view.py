"""Read exported spans back and draw one trace as a waterfall (`tierlink trace show`).

Two file formats are read, line by line, and may be mixed: OTLP JSON (one export request
per line with ``resourceSpans``, as the OpenTelemetry Collector's file exporter and
``tierlink.telemetry.otlp_receiver`` write it) and the SDK's own span JSON (one span per
line, as a node's ``trace_file`` writes it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tierlink.errors import InvalidRequest


@dataclass(frozen=True)
class SpanRecord:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str | None
    name: str
    service: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the status message of a failed span

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass(frozen=True)
class TraceSummary:
    trace_id: str
    root: str
    service: str
    start_ns: int
    duration_ms: float
    spans: int
    services: tuple[str, ...]
    errors: int

    def to_json(self) -> dict[str, Any]:
        return {"trace_id": self.trace_id, "root": self.root, "service": self.service,
                "start_unix_s": self.start_ns / 1e9, "duration_ms": round(self.duration_ms, 3),
                "spans": self.spans, "services": list(self.services), "errors": self.errors}


def load_spans(paths: Iterable[Path]) -> list[SpanRecord]:
    """Every span in ``paths``; a line that is neither format is an error naming it."""
    spans: list[SpanRecord] = []
    for path in paths:
        if not path.is_file():
            raise InvalidRequest(f"no span file at {path}",
                                 hint="name the file the receiver or a node wrote")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                spans.extend(_parse_line(line, f"{path}:{n}"))
    return spans


def _parse_line(line: str, where: str) -> Iterator[SpanRecord]:
    try:
        data = json.loads(line)
    except ValueError:
        raise InvalidRequest(f"{where} is not JSON") from None
    if isinstance(data, dict) and "resourceSpans" in data:
        yield from _from_otlp(data)
    elif isinstance(data, dict) and "context" in data:
        yield _from_sdk(data)
    else:
        raise InvalidRequest(f"{where} is neither an OTLP JSON export nor an SDK span",
                             hint="tierlink trace show reads OTLP JSON lines or span JSON lines")


def _from_otlp(export: dict[str, Any]) -> Iterator[SpanRecord]:
    for rs in export.get("resourceSpans", []):
        resource = _otlp_attributes(rs.get("resource", {}).get("attributes", []))
        service = str(resource.get("service.name", "?"))
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                status = s.get("status", {})
                failed = status.get("code") in ("STATUS_CODE_ERROR", 2)
                yield SpanRecord(
                    trace_id=s["traceId"].lower(), span_id=s["spanId"].lower(),
                    parent_id=(s.get("parentSpanId") or "").lower() or None, name=s["name"],
                    service=service, start_ns=int(s["startTimeUnixNano"]),
                    end_ns=int(s["endTimeUnixNano"]),
                    attributes=_otlp_attributes(s.get("attributes", [])),
                    error=(status.get("message") or "error") if failed else None)


def _otlp_attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: _otlp_value(a.get("value", {})) for a in items}


def _otlp_value(v: dict[str, Any]) -> Any:
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_otlp_value(x) for x in v["arrayValue"].get("values", [])]
    for key in ("stringValue", "doubleValue", "boolValue"):
        if key in v:
            return v[key]
    return None


def _from_sdk(s: dict[str, Any]) -> SpanRecord:
    status = s.get("status") or {}
    return SpanRecord(
        trace_id=s["context"]["trace_id"].removeprefix("0x"),
        span_id=s["context"]["span_id"].removeprefix("0x"),
        parent_id=(s.get("parent_id") or "").removeprefix("0x") or None, name=s["name"],
        service=str(s.get("resource", {}).get("attributes", {}).get("service.name", "?")),
        start_ns=_iso_ns(s["start_time"]), end_ns=_iso_ns(s["end_time"]),
        attributes=dict(s.get("attributes") or {}),
        error=(status.get("description") or "error")
        if status.get("status_code") == "ERROR" else None)


def _iso_ns(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1e6) * 1000


# -- traces ----------------------------------------------------------------------------------


def summaries(spans: list[SpanRecord]) -> list[TraceSummary]:
    """One line per trace, newest first."""
    by_trace: dict[str, list[SpanRecord]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    out = []
    for trace_id, group in by_trace.items():
        root = _roots(group)[0]
        start = min(s.start_ns for s in group)
        out.append(TraceSummary(trace_id, root.name, root.service, start,
                                (max(s.end_ns for s in group) - start) / 1e6, len(group),
                                tuple(sorted({s.service for s in group})),
                                sum(s.error is not None for s in group)))
    return sorted(out, key=lambda t: -t.start_ns)


def find_trace(spans: list[SpanRecord], trace_id: str) -> list[SpanRecord]:
    """The spans of the trace whose id is or starts with ``trace_id``."""
    want = trace_id.lower().removeprefix("0x")
    ids = {s.trace_id for s in spans if s.trace_id.startswith(want)}
    if not ids:
        raise InvalidRequest(f"no trace {trace_id!r} among {len({s.trace_id for s in spans})} "
                             "traces", hint="`tierlink trace list` shows them")
    if len(ids) > 1:
        raise InvalidRequest(f"{trace_id!r} names {len(ids)} traces",
                             hint="give more digits of the id")
    (found,) = ids
    return [s for s in spans if s.trace_id == found]


def _roots(group: list[SpanRecord]) -> list[SpanRecord]:
    """Spans whose parent is not in the group (the first node's, or orphans whose parent
    was not exported), earliest first."""
    ids = {s.span_id for s in group}
    return sorted((s for s in group if s.parent_id not in ids), key=lambda s: s.start_ns)


def ordered(group: list[SpanRecord]) -> list[tuple[int, SpanRecord]]:
    """Depth-first order, children by start time: (depth, span)."""
    children: dict[str, list[SpanRecord]] = {}
    for s in group:
        if s.parent_id is not None:
            children.setdefault(s.parent_id, []).append(s)
    out: list[tuple[int, SpanRecord]] = []

    def walk(s: SpanRecord, depth: int) -> None:
        out.append((depth, s))
        for c in sorted(children.get(s.span_id, []), key=lambda c: c.start_ns):
            walk(c, depth + 1)

    for root in _roots(group):
        walk(root, 0)
    return out


_SHOWN = ("tierlink.node", "tierlink.task", "tierlink.model", "tierlink.peer",
          "tierlink.reason", "tierlink.confidence", "tierlink.threshold", "tierlink.escalate",
          "tierlink.priority", "tierlink.plan", "tierlink.bytes", "tierlink.cut",
          "tierlink.outcome", "http.status_code")


def waterfall(group: list[SpanRecord], width: int = 40) -> list[str]:
    """The trace as text: offset, duration, a bar on a common time axis, service, name and
    the attributes worth reading."""
    start = min(s.start_ns for s in group)
    total = max(max(s.end_ns for s in group) - start, 1)
    rows = ordered(group)
    services = len({s.service for s in group})
    lines = [(f"trace {group[0].trace_id} · {len(group)} spans · {services} "
              f"{'service' if services == 1 else 'services'} · {total / 1e6:.2f} ms")]
    label_w = max(2 * d + len(s.name) for d, s in rows)
    svc_w = max(len(s.service) for _, s in rows)
    for depth, s in rows:
        a = int((s.start_ns - start) / total * width)
        b = max(a + 1, round((s.end_ns - start) / total * width))
        bar = " " * a + "█" * (b - a) + " " * (width - b)
        notes = " ".join(f"{k.removeprefix('tierlink.')}={_short(s.attributes[k])}"
                         for k in _SHOWN if k in s.attributes)
        if s.error:
            notes = f"ERROR {s.error} " + notes
        lines.append(f"{(s.start_ns - start) / 1e6:8.2f} {s.duration_ms:8.2f} ms "
                     f"|{bar}| {s.service:<{svc_w}} {'  ' * depth + s.name:<{label_w}} {notes}"
                     .rstrip())
    return lines


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    text = str(v)
    return text if len(text) <= 60 else text[:57] + "..."


def to_json(group: list[SpanRecord]) -> dict[str, Any]:
    start = min(s.start_ns for s in group)
    return {"trace_id": group[0].trace_id,
            "spans": [{"depth": d, "name": s.name, "service": s.service, "span_id": s.span_id,
                       "parent_id": s.parent_id, "offset_ms": (s.start_ns - start) / 1e6,
                       "duration_ms": s.duration_ms, "attributes": s.attributes,
                       "error": s.error} for d, s in ordered(group)]}
