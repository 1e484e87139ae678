"""Traces read back from both span formats and drawn as a waterfall."""

import json
from pathlib import Path

import pytest

from tierlink.errors import InvalidRequest
from tierlink.telemetry import trace_view as tv

T1, T2 = "11" * 16, "22" * 16


def otlp_line(service: str, spans: list[tuple[str, str, str | None, int, int]],
              trace_id: str = T1) -> str:
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
        "scopeSpans": [{"spans": [{
            "traceId": trace_id, "spanId": sid, "parentSpanId": parent or "", "name": name,
            "startTimeUnixNano": str(a), "endTimeUnixNano": str(b),
            "attributes": [{"key": "tierlink.peer", "value": {"stringValue": "edge-1"}},
                           {"key": "tierlink.hops", "value": {"intValue": "1"}}],
            **({"status": {"code": "STATUS_CODE_ERROR", "message": "refused"}}
               if name == "tierlink.fallback" else {})}
            for name, sid, parent, a, b in spans]}]}]})


def sdk_line(service: str, name: str, sid: str, parent: str | None, start: str, end: str,
             trace_id: str = T1) -> str:
    return json.dumps({"name": name, "context": {"trace_id": "0x" + trace_id,
                                                 "span_id": "0x" + sid},
                       "parent_id": ("0x" + parent) if parent else None,
                       "start_time": start, "end_time": end, "attributes": {"a": 1},
                       "status": {"status_code": "UNSET"},
                       "resource": {"attributes": {"service.name": service}}})


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    base = 1_700_000_000_000_000_000
    dev = tmp_path / "collector.jsonl"
    dev.write_text("\n".join([
        otlp_line("dev-1", [("tierlink.route", "a" * 16, None, base, base + 9_000_000),
                            ("tierlink.upstream", "b" * 16, "a" * 16, base + 1_000_000,
                             base + 8_000_000),
                            ("tierlink.fallback", "f" * 16, "a" * 16, base + 500_000,
                             base + 500_000)]),
        otlp_line("other", [("tierlink.route", "e" * 16, None, base - 10, base)], T2),
    ]) + "\n")
    cloud = tmp_path / "cloud.jsonl"  # the SDK's own JSON, as a node's --trace-file writes
    cloud.write_text(sdk_line("cloud-1", "tierlink.route", "c" * 16, "b" * 16,
                              "2023-11-14T22:13:20.002000Z", "2023-11-14T22:13:20.007000Z")
                     + "\n")
    return [dev, cloud]


def test_one_trace_across_files_and_formats_forms_one_tree(files: list[Path]) -> None:
    spans = tv.load_spans(files)
    group = tv.find_trace(spans, "1111")
    order = [(d, s.service, s.name) for d, s in tv.ordered(group)]
    assert order == [(0, "dev-1", "tierlink.route"), (1, "dev-1", "tierlink.fallback"),
                     (1, "dev-1", "tierlink.upstream"), (2, "cloud-1", "tierlink.route")]
    cloud = next(s for s in group if s.service == "cloud-1")
    assert cloud.duration_ms == pytest.approx(5.0)
    assert next(s for s in group if s.name == "tierlink.fallback").error == "refused"


def test_waterfall_and_summaries(files: list[Path]) -> None:
    spans = tv.load_spans(files)
    lines = tv.waterfall(tv.find_trace(spans, T1), width=20)
    assert lines[0].startswith(f"trace {T1} · 4 spans · 2 services · 9.00 ms")
    assert "peer=edge-1" in lines[1] and "ERROR refused" in lines[2]
    assert all(line.count("|") == 2 for line in lines[1:])
    found = tv.summaries(spans)
    assert [t.trace_id for t in found] == [T1, T2]  # newest first
    assert found[0].spans == 4 and found[0].errors == 1 and found[0].root == "tierlink.route"
    assert tv.to_json(tv.find_trace(spans, T2))["spans"][0]["depth"] == 0


def test_unknown_or_ambiguous_ids_and_bad_files_are_named(files: list[Path],
                                                          tmp_path: Path) -> None:
    spans = tv.load_spans(files)
    with pytest.raises(InvalidRequest, match="no trace"):
        tv.find_trace(spans, "33")
    with pytest.raises(InvalidRequest, match="names 2 traces"):
        tv.find_trace(spans, "")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    with pytest.raises(InvalidRequest, match="bad.jsonl:1"):
        tv.load_spans([bad])
    with pytest.raises(InvalidRequest, match="no span file"):
        tv.load_spans([tmp_path / "missing.jsonl"])
