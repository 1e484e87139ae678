import pytest

from tierlink.errors import ConfigError
from tierlink.fleet.config import parse_fleet, with_tracing
from tierlink.settings.tracing import parse_tracing

FLEET = {"nodes": [{"id": "dev-1", "tier": "device", "models": ["fmnist-small"]}]}


def test_a_collector_endpoint_and_its_defaults():
    cfg = parse_tracing({"otlp_endpoint": "http://collector.example:4318/"})
    assert cfg.on and not cfg.collect
    assert cfg.settings.otlp_endpoint == "http://collector.example:4318"
    assert (cfg.settings.protocol, cfg.settings.sample_ratio) == ("http/protobuf", 1.0)
    full = parse_tracing({"otlp_endpoint": "http://c:4318/v1/traces", "sample_ratio": 0.1})
    assert full.settings.otlp_endpoint == "http://c:4318/v1/traces"
    grpc = parse_tracing({"otlp_endpoint": "collector:4317", "protocol": "grpc"})
    assert grpc.settings.otlp_endpoint == "collector:4317"
    assert not parse_tracing({}).on and parse_tracing({"collect": True}).on


@pytest.mark.parametrize(("raw", "says"), [
    ({"otlp_endpoint": "collector:4318"}, "base URL"),
    ({"protocol": "thrift"}, "protocol"),
    ({"sample_ratio": 1.5}, "sample_ratio"),
    ({"collect": "yes"}, "collect"),
    ({"collect": True, "otlp_endpoint": "http://c:4318"}, "collect"),
    ({"endpoint": "http://c:4318"}, "tracing.endpoint: unknown key"),
])
def test_mistakes_are_named(raw, says):
    with pytest.raises(ConfigError, match=says):
        parse_tracing(raw)


def test_the_fleet_file_and_the_command_line_flags():
    fleet = parse_fleet({**FLEET, "tracing": {"sample_ratio": 0.5}})
    assert not fleet.tracing.on
    collected = with_tracing(fleet, True, None)
    assert collected.tracing.collect and collected.tracing.settings.sample_ratio == 0.5
    sent = with_tracing(fleet, False, "http://c:4318")
    assert sent.tracing.settings.otlp_endpoint == "http://c:4318"
    assert with_tracing(fleet, False, None) is fleet
