"""The OTLP/HTTP receiver takes what the official exporter sends (protobuf), OTLP JSON and
gzip, refuses anything else with a 4xx naming the problem, and writes OTLP JSON lines."""

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tierlink.telemetry.otlp_receiver import OtlpReceiver
from tierlink.telemetry.trace_view import load_spans


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[OtlpReceiver]:
    r = OtlpReceiver(tmp_path / "traces.jsonl").start()
    yield r
    r.stop()


def test_spans_from_the_official_exporter_arrive_with_hex_ids(receiver: OtlpReceiver) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "edge-1"}))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces", timeout=5)))
    tracer = provider.get_tracer("t")
    with (tracer.start_as_current_span("tierlink.route", attributes={"tierlink.hops": 2}) as a,
          tracer.start_as_current_span("tierlink.plan")):
        pass
    provider.shutdown()
    assert receiver.spans == 2
    exports = [json.loads(line) for line in receiver.out.read_text().splitlines()]
    ids = {s["spanId"] for e in exports for rs in e["resourceSpans"] for ss in rs["scopeSpans"]
           for s in ss["spans"]}
    assert format(a.get_span_context().span_id, "016x") in ids
    spans = {s.name: s for s in load_spans([receiver.out])}
    assert spans["tierlink.plan"].parent_id == spans["tierlink.route"].span_id
    assert spans["tierlink.route"].service == "edge-1"
    assert spans["tierlink.route"].attributes == {"tierlink.hops": 2}


def test_json_and_gzip_are_taken(receiver: OtlpReceiver) -> None:
    body = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "dev-1"}}]},
        "scopeSpans": [{"spans": [{"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "x",
                                   "startTimeUnixNano": "1000", "endTimeUnixNano": "3000"}]}]}]}
    url = f"{receiver.endpoint}/v1/traces"
    r = httpx.post(url, json=body, trust_env=False)
    assert r.status_code == 200 and r.json() == {}
    r = httpx.post(url, content=gzip.compress(json.dumps(body).encode()), trust_env=False,
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 200
    assert receiver.spans == 2
    (span, _) = load_spans([receiver.out])
    assert span.duration_ms == pytest.approx(0.002) and span.service == "dev-1"


@pytest.mark.parametrize(("path", "content", "ctype", "status", "says"), [
    ("/v1/traces", b"\xff\xff\xff", "application/x-protobuf", 400, "ExportTraceService"),
    ("/v1/traces", b"{not json", "application/json", 400, "not JSON"),
    ("/v1/traces", b"[]", "application/json", 400, "resourceSpans"),
    ("/v1/traces", b"x", "text/plain", 400, "unsupported content type"),
    ("/v1/metrics", b"", "application/x-protobuf", 404, "/v1/traces"),
])
def test_bad_exports_get_a_4xx_that_says_why(receiver: OtlpReceiver, path: str,
                                             content: bytes, ctype: str, status: int,
                                             says: str) -> None:
    r = httpx.post(f"{receiver.endpoint}{path}", content=content, trust_env=False,
                   headers={"content-type": ctype})
    assert r.status_code == status and says in r.json()["error"]
    assert receiver.spans == 0
    assert httpx.get(f"{receiver.endpoint}/healthz", trust_env=False).status_code == 200
