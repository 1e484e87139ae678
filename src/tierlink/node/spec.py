"""Everything one node process needs to start, as a frozen dataclass with a JSON form.

``tierlink up`` writes one spec file per node (with the addresses of its emulated links);
``tierlink node`` builds one from flags.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.llm.source import LMSource
from tierlink.settings.batching import BatchSettings, parse_batching
from tierlink.settings.engine import EngineConfig, engine_from_dict
from tierlink.settings.fields import as_url
from tierlink.settings.hard_examples import HardExampleConfig, parse_hard_examples
from tierlink.settings.routing import RoutingConfig, parse_routing
from tierlink.telemetry.tracing import TraceSettings


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str
    onnx: str  # path to the .onnx file
    card: str  # path to its model card (JSON)


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """A node this one can send to, and how: ``url`` is the link's address (an emulated
    link's listen port in a local fleet), RTT/bandwidth seed the link estimator."""

    node_id: str
    url: str
    rtt_ms: float = 1.0
    bandwidth_mbit: float = 1000.0
    loss: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeSpec:
    node_id: str
    tier: Tier
    models: tuple[ModelSource, ...]
    host: str = "127.0.0.1"
    port: int = 0
    # The Open Inference Protocol's gRPC API on this port beside REST (0: any free one;
    # None: none); over TLS on a node with TLS.
    grpc_port: int | None = None
    # What the node registers as its address (peers and the control plane use it), when it
    # is not the bind address: a NAT, a proxy, a DNS name.
    advertise_url: str | None = None
    control_url: str | None = None
    upstreams: tuple[UpstreamSpec, ...] = ()
    routing: RoutingConfig = field(default_factory=RoutingConfig)  # the fleet's, typed
    routing_revision: int = 0  # the control plane's revision of ``routing`` (0: none)
    workers: int = 1
    max_queue: int = 256
    escalation_queue: int | None = None  # None: 4 per worker (node/admission.py)
    threads: int = 1  # intra-op threads of each model's ONNX Runtime session
    seed: int = 0
    heartbeat_s: float = 1.0
    view_refresh_s: float = 0.25
    ready_file: str | None = None
    trace_file: str | None = None  # write this node's spans here as JSON lines
    # Send this node's spans over OTLP (the fleet file's `tracing:`; see settings/tracing.py)
    otlp_endpoint: str | None = None
    otlp_protocol: str = "http/protobuf"
    trace_sample_ratio: float = 1.0
    # The fleet's `hard_examples:`; its store_tier is the control plane's (`control.tier`)
    hard_examples: HardExampleConfig = field(default_factory=HardExampleConfig)
    heads: tuple[ModelSource, ...] = ()  # models whose head this node may run (split plans)
    # Where the node keeps what must survive a restart: its identity, model slots, outbox.
    state_dir: str | None = None
    enroll_token: str | None = None  # enrolls with it when state_dir holds no identity yet
    trusted_keys: tuple[str, ...] = ()  # model versions must be signed by one of these
    fault_injection: bool = False  # POST /tierlink/v1/faults may slow this node (tests)
    # ONNX Runtime execution providers in order (e.g. CUDA, then CPU); CPU is the fallback
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    # Language models served over the OpenAI API (``/v1/chat/completions``), by name
    llms: tuple[LMSource, ...] = ()
    chat_tasks: dict[str, str] = field(default_factory=dict)  # task -> one of ``llms``
    kv_copies: bool = False  # keep copies of the conversations it relays (chat/copies.py)
    labels: dict[str, str] = field(default_factory=dict)  # site, region, ...: in heartbeats
    # A JSON file the node's environment keeps its battery and heat in (node/device_state.py;
    # None: Linux's power-supply and thermal-zone files, where there are any)
    device_state_file: str | None = None
    # Upstreams from the registry (node/topology.py): alive nodes of this tier whose labels
    # named in upstream_match equal this node's. None: `upstreams` as listed (static).
    upstream_tier: str | None = None
    upstream_match: tuple[str, ...] = ()
    # The privacy level of a request that names none: "local" makes a device fail closed
    # (its users' inputs never leave it unless a request says they may).
    default_privacy: str = "any"
    # TLS on every hop (the fleet file's `security: {tls: true}`; see node/certificates.py):
    # the fleet CA's certificate; the node's own certificate and key — without them it gets
    # one from the control plane after enrollment (kept under state_dir/tls, renewed
    # before it expires). client_auth "required": every caller needs a fleet certificate.
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_auth: str = "optional"
    # How the node runs its models (settings/engine.py): ONNX Runtime in this process, or
    # Ray Serve deployments on the cluster at ray_address
    engine: EngineConfig = field(default_factory=EngineConfig)
    ray_address: str | None = None
    # The fleet's `batching:` for this node's models (settings/batching.py): requests for
    # the same model version that wait together run as one batch
    batching: Mapping[str, BatchSettings] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.default_privacy not in ("local", "site", "any"):
            raise ConfigError(f"node {self.node_id}: default_privacy must be local, site or "
                              f"any, got {self.default_privacy!r}")
        if self.tls_client_auth not in ("optional", "required"):
            raise ConfigError(f"node {self.node_id}: tls_client_auth must be optional or "
                              f"required, got {self.tls_client_auth!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(f"node {self.node_id}: tls_cert and tls_key go together")
        if self.tls_ca and self.tls_cert is None and not (self.control_url and self.state_dir):
            raise ConfigError(f"node {self.node_id}: TLS without tls_cert needs a control "
                              "plane and a state_dir (the node gets its certificate there)",
                              hint="give tls_cert/tls_key, or control_url and state_dir")

    @property
    def scheme(self) -> str:
        return "https" if self.tls_ca else "http"

    def advertised(self, port: int) -> str:
        """The address to register: ``advertise_url``, else the bound one — refused when
        the node binds every interface, whose address no peer can use."""
        if self.advertise_url:
            return as_url(self.advertise_url, "advertise_url")
        if self.host in ("0.0.0.0", "::", ""):
            raise ConfigError(f"node {self.node_id} binds every interface ({self.host!r}): "
                              "peers cannot reach it at that address",
                              hint="set advertise_url to the address they should use")
        return f"{self.scheme}://{self.host}:{port}"

    def tracing(self) -> TraceSettings:
        return TraceSettings(otlp_endpoint=self.otlp_endpoint, protocol=self.otlp_protocol,
                             file=self.trace_file, sample_ratio=self.trace_sample_ratio)

    def to_json(self) -> str:
        """The spec file ``tierlink up`` writes: typed sections in their fleet-file form."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data |= {"tier": self.tier.label,
                 "routing": {"routing": self.routing.to_dict(),
                             "cost": self.routing.cost.to_mapping()},
                 "hard_examples": {**self.hard_examples.to_dict(),
                                   "store_tier": self.hard_examples.store_tier.label},
                 "engine": self.engine.to_dict(),
                 "batching": {name: b.to_dict() for name, b in self.batching.items()}}
        for name in ("models", "upstreams", "heads", "llms"):
            data[name] = [asdict(x) for x in data[name]]
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> NodeSpec:
        try:
            data = json.loads(text)
            data["tier"] = Tier.parse(data["tier"])
            data["models"] = tuple(ModelSource(**m) for m in data.get("models", []))
            data["upstreams"] = tuple(UpstreamSpec(**u) for u in data.get("upstreams", []))
            data["heads"] = tuple(ModelSource(**m) for m in data.get("heads", []))
            data["trusted_keys"] = tuple(data.get("trusted_keys", ()))
            data["providers"] = tuple(data.get("providers", ("CPUExecutionProvider",)))
            data["llms"] = tuple(LMSource(**m) for m in data.get("llms", []))
            data["upstream_match"] = tuple(data.get("upstream_match", ()))
            routing = data.get("routing") or {}
            data["routing"] = parse_routing(routing.get("routing") or {}, routing.get("cost"))
            hard = dict(data.get("hard_examples") or {})
            store_tier = hard.pop("store_tier", "cloud")
            data["hard_examples"] = parse_hard_examples(hard, store_tier)
            data["engine"] = engine_from_dict(data.get("engine"))
            data["batching"] = parse_batching(data.get("batching") or {})
            return cls(**data)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"invalid node spec: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> NodeSpec:
        return cls.from_json(Path(path).read_text())
