import re
import time
from pathlib import Path

from tierlink.telemetry import tracing
from tierlink.testing.spans import recorded_spans

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
INCOMING = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def test_span_continues_the_callers_trace_and_propagates_it():
    with (recorded_spans() as exporter,
          tracing.span("tierlink.route", INCOMING, {"tierlink.node": "dev-1"})):
        outgoing = tracing.current_traceparent()
    spans = exporter.get_finished_spans()
    assert len(spans) == 1 and format(spans[0].context.trace_id, "032x") == TRACE_ID
    assert format(spans[0].parent.span_id, "016x") == "00f067aa0ba902b7"
    assert outgoing is not None and TRACE_ID in outgoing and outgoing != INCOMING


def test_stages_are_children_of_the_route_span_and_record_keeps_given_times():
    with recorded_spans() as exporter, tracing.span("tierlink.route", INCOMING, {}) as route:
        with tracing.stage("tierlink.plan", {"tierlink.plan": "dev-1:local"}) as plan:
            tracing.set_attributes(plan, {"tierlink.reason": "cascade", "skip": None})
        tracing.mark("tierlink.fallback", {"tierlink.reason": "timeout"})
        parent = tracing.capture()
        now = time.monotonic()
        tracing.record("tierlink.queue", parent, now - 0.030, now - 0.010, now)
        with tracing.stage("tierlink.upstream") as up:
            tracing.error(up, "refused")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"tierlink.route", "tierlink.plan", "tierlink.fallback",
                          "tierlink.queue", "tierlink.upstream"}
    route_id = spans["tierlink.route"].context.span_id
    assert route is not None and all(s.parent.span_id == route_id for n, s in spans.items()
                                     if n != "tierlink.route")
    assert dict(spans["tierlink.plan"].attributes) == {"tierlink.plan": "dev-1:local",
                                                       "tierlink.reason": "cascade"}
    queue = spans["tierlink.queue"]
    assert abs((queue.end_time - queue.start_time) / 1e6 - 20.0) < 1.0
    assert not spans["tierlink.upstream"].status.is_ok


def test_with_tracing_off_stages_create_nothing_and_cost_no_provider():
    assert not tracing.enabled()
    with tracing.stage("tierlink.plan") as s:
        assert s is None
    tracing.mark("tierlink.fallback", {"x": 1})
    assert tracing.capture() is None
    tracing.record("tierlink.queue", None, 0.0, 1.0, 1.0)  # no parent: nothing


def test_every_span_the_code_opens_is_in_the_vocabulary():
    src = Path(tracing.__file__).resolve().parents[1]
    call = re.compile(r'tracing\.(?:stage|mark|record|span)\(\s*"(tierlink\.[a-z_.]+)"'
                      r'(?:\s+if [^"]+else\s+"(tierlink\.[a-z_.]+)")?')
    opened = {name for p in src.rglob("*.py") for m in call.findall(p.read_text())
              for name in m if name}
    assert len(opened) >= 12, opened
    assert opened <= set(tracing.STAGES), opened - set(tracing.STAGES)


def test_otlp_traces_url_adds_the_path_only_when_missing():
    assert tracing.otlp_traces_url("http://h:4318") == "http://h:4318/v1/traces"
    assert tracing.otlp_traces_url("http://h:4318/") == "http://h:4318/v1/traces"
    assert tracing.otlp_traces_url("http://h:4318/custom") == "http://h:4318/custom"
