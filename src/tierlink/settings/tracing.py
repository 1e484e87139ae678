"""The fleet file's ``tracing:`` section: where every node sends its spans.

    tracing:
      otlp_endpoint: http://collector.example:4318   # an OpenTelemetry Collector, Jaeger...
      protocol: http/protobuf                        # or grpc (then host:4317)
      sample_ratio: 0.1                              # share of new traces recorded

or ``collect: true``: `tierlink up` starts a small OTLP receiver of its own and the nodes
send to it (``<run dir>/traces.jsonl``; read it with `tierlink trace show`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tierlink.errors import ConfigError
from tierlink.settings.fields import as_bool, as_float, as_mapping, as_url, known
from tierlink.telemetry.tracing import PROTOCOLS, TraceSettings

_KEYS = ("otlp_endpoint", "protocol", "sample_ratio", "collect")


@dataclass(frozen=True, slots=True)
class TracingConfig:
    settings: TraceSettings = field(default_factory=TraceSettings)
    collect: bool = False  # `tierlink up` starts a receiver and points the nodes at it

    @property
    def on(self) -> bool:
        return self.collect or self.settings.on

    def to_dict(self) -> dict[str, Any]:
        """The ``tracing:`` section (the file a node writes its spans to is not the fleet's)."""
        s = self.settings
        out: dict[str, Any] = {"protocol": s.protocol, "sample_ratio": s.sample_ratio,
                               "collect": self.collect}
        return out | ({"otlp_endpoint": s.otlp_endpoint} if s.otlp_endpoint else {})


def parse_tracing(raw: Any) -> TracingConfig:
    data = as_mapping(raw, "tracing")
    for key in data:
        known(str(key), _KEYS, "tracing")
    protocol = str(data.get("protocol", "http/protobuf"))
    if protocol not in PROTOCOLS:
        raise ConfigError(f"tracing.protocol must be one of {', '.join(PROTOCOLS)}, "
                          f"got {protocol!r}")
    endpoint = data.get("otlp_endpoint")
    if endpoint is not None:
        endpoint = _endpoint(endpoint, protocol)
    collect = as_bool(data.get("collect", False), "tracing.collect")
    if collect and endpoint:
        raise ConfigError("tracing names an otlp_endpoint and collect: true",
                          hint="collect starts a receiver of the fleet's own; drop one of them")
    ratio = as_float(data.get("sample_ratio", 1.0), "tracing.sample_ratio", 0.0, 1.0)
    return TracingConfig(TraceSettings(otlp_endpoint=endpoint, protocol=protocol,
                                       sample_ratio=ratio), collect)


def _endpoint(value: Any, protocol: str) -> str:
    if protocol == "grpc":
        text = str(value).strip()
        if not text or " " in text:
            raise ConfigError(f"tracing.otlp_endpoint must be host:port for grpc, "
                              f"got {value!r}")
        return text
    if isinstance(value, str) and value.rstrip("/").endswith("/v1/traces"):
        return as_url(value.rstrip("/").removesuffix("/v1/traces"),
                      "tracing.otlp_endpoint") + "/v1/traces"
    return as_url(value, "tracing.otlp_endpoint")
