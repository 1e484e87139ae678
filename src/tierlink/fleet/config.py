"""One YAML file per fleet: nodes, tiers, models, links, routing weights.

Validated once here (every error names the field and the fix) and passed down frozen.
Example: the demo's, ``src/tierlink/demo/fleets/fleet.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.fleet.chat_config import ChatConfig, check_verifiers, parse_chat
from tierlink.models.onnx import parse_providers
from tierlink.models.task import TaskSpec, task_from_dict
from tierlink.security.names import node_host
from tierlink.settings.batching import BatchSettings, parse_batching
from tierlink.settings.engine import EngineConfig, parse_engine
from tierlink.settings.fields import (
    as_bool,
    as_float,
    as_int,
    as_mapping,
    as_tier,
    as_url,
    known,
    known_keys,
)
from tierlink.settings.hard_examples import HardExampleConfig, parse_hard_examples
from tierlink.settings.routing import (
    BreakerConfig,
    HedgeConfig,
    RoutingConfig,
    ShadowConfig,
    parse_routing,
)
from tierlink.settings.security import SecurityConfig, parse_security
from tierlink.settings.tracing import TracingConfig, parse_tracing

# Re-exported: the routing and hard-example settings live in tierlink.settings (shared with
# the nodes); a fleet file's readers keep finding them here.
__all__ = ["BreakerConfig", "FleetConfig", "HardExampleConfig", "HedgeConfig", "LinkConfig",
           "NodeConfig", "RoutingConfig", "ShadowConfig", "load_fleet", "parse_fleet",
           "parse_hard_examples", "parse_routing"]

_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: str  # the node's stable name in the fleet (lowercase, digits, '.', '_', '-')
    tier: Tier  # device, edge or cloud: what the node is, for placement and prices
    models: tuple[str, ...]  # the models it serves (zoo, imported or published names)
    workers: int = 1  # models run at once (the scheduler's workers)
    max_queue: int = 256  # requests waiting beyond which new ones are refused at once (429)
    # requests waiting at which an escalation (its caller holds an answer) is refused (429)
    # before work that has none; 0: an escalation never waits; not set: 4 per worker
    escalation_queue: int | None = None
    threads: int = 1  # intra-op threads of each model's ONNX Runtime session, per worker
    cpu_quota: float | None = None  # fraction of one core, enforced with a cgroup
    heads: tuple[str, ...] = ()  # models whose head this node may run for a split plan
    # ONNX Runtime execution providers in order of preference (CPU is always the fallback)
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    chat: ChatConfig | None = None  # language models served over the OpenAI API
    # The address peers and the control plane should use (a NAT, a proxy, a DNS name), when
    # it is not the one the node binds; it is what the node registers.
    advertise_url: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)  # site, region: picks upstreams
    default_privacy: str = "any"  # of a request that names none; "local": fail closed
    # How it runs its models; with `engine: ray`, the Ray Serve deployments' replicas, CPUs
    # and autoscaling (settings/engine.py)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # A JSON file its environment keeps its battery and heat in ({battery, charging,
    # thermal}); without one, Linux's power-supply and thermal-zone files where there are any
    device_state_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The node's entry under ``nodes:``."""
        out: dict[str, Any] = {
            "id": self.node_id, "tier": self.tier.label, "models": list(self.models),
            "heads": list(self.heads), "workers": self.workers, "max_queue": self.max_queue,
            "threads": self.threads,
            "providers": list(self.providers), "labels": dict(self.labels),
            "default_privacy": self.default_privacy, **self.engine.fleet_keys()}
        optional = {"cpu_quota": self.cpu_quota, "advertise_url": self.advertise_url,
                    "escalation_queue": self.escalation_queue,
                    "chat": self.chat.to_dict() if self.chat else None,
                    "device_state_file": self.device_state_file}
        return out | {k: v for k, v in optional.items() if v is not None}


@dataclass(frozen=True, slots=True)
class LinkConfig:
    # The node (or list of nodes) the link leaves: its requests may go up over it to `to`.
    src: str
    # The upstream node (or list); with lists on either side, a link for every pair.
    dst: str
    delay_ms: float = 0.0  # one way: RTT = 2 x delay
    jitter_ms: float = 0.0  # spread of each packet's one-way delay
    bandwidth_mbit: float | None = None  # per direction, shared by connections (none: no cap)
    loss: float = 0.0  # share of packets lost (paid as a retransmission's delay)

    @property
    def name(self) -> str:
        return f"{self.src}->{self.dst}"

    def to_dict(self) -> dict[str, Any]:
        """The link's entry under ``links:`` (one pair: a file's lists are expanded)."""
        out: dict[str, Any] = {"from": self.src, "to": self.dst, "delay_ms": self.delay_ms,
                               "jitter_ms": self.jitter_ms, "loss": self.loss}
        return out | ({} if self.bandwidth_mbit is None
                      else {"bandwidth_mbit": self.bandwidth_mbit})

    @property
    def rtt_ms(self) -> float:
        return 2.0 * self.delay_ms


@dataclass(frozen=True, slots=True)
class FleetConfig:
    name: str  # the fleet's name (reports, run directories)
    nodes: tuple[NodeConfig, ...]  # the fleet's machines, one entry each (at least one)
    # How each node reaches its upstreams (emulated in a local fleet): delay, bandwidth,
    # loss; with `topology: static` also the only upstreams a node has.
    links: tuple[LinkConfig, ...]
    routing: RoutingConfig = field(default_factory=RoutingConfig)  # how every node routes
    zoo_profile: str = "full"  # the zoo's build profile: full (the real models) or test
    control_port: int = 0  # the control plane's port (0: any free one)
    control_ttl_s: float = 5.0  # a node silent this long drops out of the fleet's view
    control_tier: Tier = Tier.CLOUD  # where the control plane runs (hard-example privacy)
    # sqlite: one control-plane process; etcd: `control_replicas` stateless replicas over
    # an etcd cluster of `etcd_members` that `tierlink up` starts (and stops) too.
    control_store: str = "sqlite"
    control_replicas: int = 1  # control-plane processes (more than one needs etcd)
    etcd_members: int = 3  # with etcd: the cluster's size, odd so a majority survives a loss
    # Inputs a node escalated for low confidence, sent to the control plane for retraining
    hard_examples: HardExampleConfig = field(default_factory=HardExampleConfig)
    seed: int = 0  # the workload's and the simulator's seed
    # Public keys (ed25519:<base64>) whose signatures on model versions the nodes accept.
    trusted_keys: tuple[str, ...] = ()
    # Lets benchmarks and tests slow a node down over HTTP (/tierlink/v1/faults). Never on
    # in production: anyone who reaches the node could degrade it.
    fault_injection: bool = False
    # Tasks the zoo does not have, declared here (input, output kind, roles, labels); their
    # models come from the model store (`tierlink model import`).
    tasks: Mapping[str, TaskSpec] = field(default_factory=dict)
    # registry: nodes take their upstreams from the registry by tier and labels (a new
    # edge is used without restarts; node/topology.py); static: the declared links only.
    topology: str = "registry"
    # Where every node sends its spans (OTLP), or `collect`: `tierlink up` receives them.
    tracing: TracingConfig = field(default_factory=TracingConfig)
    # TLS on every hop, a fleet CA, claims bound to senders (settings/security.py)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # Dynamic batching by model: requests for one model version that wait together run as
    # one batch, on every node serving it (settings/batching.py)
    batching: Mapping[str, BatchSettings] = field(default_factory=dict)

    def __post_init__(self) -> None:
        served = self.model_names()
        for name in self.batching:
            if name not in served:
                raise ConfigError(f"batching.{name}: no node serves a model {name!r}",
                                  hint=f"served: {', '.join(served)}")
        if self.security.tls:  # each node's identity is a name in its certificate
            for n in self.nodes:
                try:
                    node_host(n.node_id)
                except ValueError as exc:
                    raise ConfigError(str(exc), hint="rename the node, or run without TLS"
                                      ) from None

    def to_dict(self) -> dict[str, Any]:
        """The fleet file this configuration was parsed from, every setting written out:
        ``parse_fleet(c.to_dict()) == c``."""
        control = {"port": self.control_port, "ttl_s": self.control_ttl_s,
                   "tier": self.control_tier.label, "store": self.control_store,
                   "replicas": self.control_replicas, "etcd_members": self.etcd_members}
        return {
            "name": self.name, "seed": self.seed,
            "nodes": [n.to_dict() for n in self.nodes],
            "links": [link.to_dict() for link in self.links],
            "routing": self.routing.to_dict(), "cost": self.routing.cost.to_mapping(),
            "zoo": {"profile": self.zoo_profile}, "control": control,
            "hard_examples": self.hard_examples.to_dict(),
            "trusted_keys": list(self.trusted_keys), "fault_injection": self.fault_injection,
            "tasks": {name: _task_dict(t) for name, t in self.tasks.items()},
            "topology": self.topology, "tracing": self.tracing.to_dict(),
            "security": self.security.to_dict(),
            "batching": {name: b.to_dict() for name, b in self.batching.items()}}

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its fleet file (the sections are typed and round-trip; their
        read-only mappings do not pickle): a simulated run sent to another process."""
        return (parse_fleet, (self.to_dict(), f"<fleet {self.name}>"))

    def model_names(self) -> tuple[str, ...]:
        """Every model some node serves, in file order, once each."""
        return tuple(dict.fromkeys(m for n in self.nodes for m in (*n.models, *n.heads)))

    def node(self, node_id: str) -> NodeConfig:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise ConfigError(f"no node {node_id!r} in fleet {self.name!r}")

    def links_from(self, node_id: str) -> tuple[LinkConfig, ...]:
        return tuple(link for link in self.links if link.src == node_id)


def on_etcd(config: FleetConfig, replicas: int | None) -> FleetConfig:
    """The fleet with its control plane as ``replicas`` replicas over a three-member etcd
    cluster (``tierlink up/demo --etcd-replicas N``); unchanged when ``replicas`` is None."""
    if replicas is None:
        return config
    return replace(config, control_store="etcd", control_replicas=replicas, etcd_members=3)


def with_tracing(config: FleetConfig, collect: bool, otlp_endpoint: str | None) -> FleetConfig:
    """The fleet with spans sent to ``otlp_endpoint``, or (``collect``) to a receiver of its
    own (``tierlink up/demo --traces``, ``--otlp-endpoint``); unchanged when neither."""
    if not collect and not otlp_endpoint:
        return config
    raw: dict[str, Any] = {"sample_ratio": config.tracing.settings.sample_ratio}
    raw.update({"otlp_endpoint": otlp_endpoint} if otlp_endpoint else {"collect": True})
    return replace(config, tracing=parse_tracing(raw))


def with_tls(config: FleetConfig, tls: bool) -> FleetConfig:
    """The fleet with TLS on every hop (``tierlink up/demo --tls``); unchanged when False."""
    if not tls:
        return config
    return replace(config, security=replace(config.security, tls=True))


def load_fleet(path: str | Path) -> FleetConfig:
    """Read and validate a fleet file."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"fleet file {p} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"fleet file {p} is not valid YAML: {exc}") from exc
    return parse_fleet(data, source=str(p))


FLEET_KEYS = ("name", "seed", "nodes", "links", "routing", "cost", "zoo", "control",
              "hard_examples", "trusted_keys", "fault_injection", "tasks", "topology",
              "tracing", "security", "batching")
NODE_KEYS = ("id", "tier", "models", "heads", "workers", "max_queue", "escalation_queue",
             "threads", "cpu_quota",
             "providers", "chat", "advertise_url", "labels", "default_privacy", "engine", "ray",
             "device_state_file")
LINK_KEYS = ("from", "to", "delay_ms", "jitter_ms", "bandwidth_mbit", "loss")


def parse_fleet(data: Any, source: str = "<fleet>") -> FleetConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with 'nodes' and 'links'")
    known_keys(data, FLEET_KEYS, "")
    nodes = tuple(_node(n, f"nodes[{i}]") for i, n in enumerate(_list(data, "nodes", source)))
    _unique([n.node_id for n in nodes], "nodes[].id")
    by_id = {n.node_id: n for n in nodes}
    declared = data.get("links") or []
    if not isinstance(declared, list):
        raise ConfigError("links must be a list of {from, to, ...} links",
                          hint="links: [{from: dev-1, to: edge-1, delay_ms: 5}]")
    links = tuple(l for i, raw in enumerate(declared) for l in _links(raw, f"links[{i}]", by_id))
    _unique([l.name for l in links], "links (from -> to pairs)")
    nodes = _checked_chat(nodes, links)
    control = as_mapping(data.get("control") or {}, "control")
    store, replicas, members = _control_store(control)
    zoo = as_mapping(data.get("zoo") or {}, "zoo")
    known_keys(zoo, ("profile",), "zoo")
    return FleetConfig(
        name=str(data.get("name", Path(source).stem)),
        nodes=nodes,
        links=links,
        routing=parse_routing(data.get("routing") or {}, data.get("cost") or {}),
        zoo_profile=str(zoo.get("profile", "full")),
        control_port=as_int(control.get("port", 0), "control.port", 0),
        control_ttl_s=as_float(control.get("ttl_s", 5.0), "control.ttl_s", 0.5),
        control_tier=as_tier(control.get("tier", "cloud"), "control.tier"),
        control_store=store, control_replicas=replicas, etcd_members=members,
        hard_examples=parse_hard_examples(data.get("hard_examples") or {},
                                          control.get("tier", "cloud")),
        seed=as_int(data.get("seed", 0), "seed", 0),
        trusted_keys=_strings(data.get("trusted_keys") or [], "trusted_keys"),
        fault_injection=as_bool(data.get("fault_injection", False), "fault_injection"),
        tasks=_tasks(data.get("tasks") or {}),
        topology=_topology(data.get("topology", "registry")),
        tracing=parse_tracing(data.get("tracing") or {}),
        security=parse_security(data.get("security") or {}),
        batching=parse_batching(data.get("batching") or {}),
    )


def _topology(raw: Any) -> str:
    if raw not in ("registry", "static"):
        raise ConfigError(f"topology must be registry or static, got {raw!r}",
                          hint="registry: upstreams follow the registry by tier and labels; "
                               "static: only the declared links")
    return str(raw)


_CONTROL_KEYS = ("port", "ttl_s", "tier", "store", "replicas", "etcd_members")


def _control_store(control: Mapping[str, Any]) -> tuple[str, int, int]:
    """``(store, replicas, etcd members)`` of the fleet's ``control`` section."""
    for key in control:
        known(str(key), _CONTROL_KEYS, "control")
    store = str(control.get("store", "sqlite"))
    if store not in ("sqlite", "etcd"):
        raise ConfigError(f"control.store must be sqlite or etcd, got {store!r}")
    replicas = as_int(control.get("replicas", 1), "control.replicas", 1)
    members = as_int(control.get("etcd_members", 3), "control.etcd_members", 1)
    if replicas > 1 and store != "etcd":
        raise ConfigError(f"control.replicas is {replicas}, but replicas share their state "
                          "through etcd", hint="add `store: etcd` to the control section")
    if members % 2 == 0:
        raise ConfigError(f"control.etcd_members must be odd (a majority survives a loss), "
                          f"got {members}", hint="use 1, 3 or 5")
    return store, replicas, members


def _checked_chat(nodes: tuple[NodeConfig, ...],
                  links: tuple[LinkConfig, ...]) -> tuple[NodeConfig, ...]:
    chats = {n.node_id: n.chat for n in nodes if n.chat is not None}
    if not chats:
        return nodes
    fixed = check_verifiers(chats, {n.node_id: n.tier.label for n in nodes},
                            [(l.src, l.dst) for l in links])
    return tuple(replace(n, chat=fixed[n.node_id]) if n.node_id in fixed else n for n in nodes)


def _tasks(raw: Any) -> Mapping[str, TaskSpec]:
    from tierlink.models.kind_registry import kind_of

    tasks = {str(k): task_from_dict(str(k), v) for k, v in as_mapping(raw, "tasks").items()}
    for task in tasks.values():
        kind_of(task.kind)  # an unknown kind is refused here, naming the known ones
    return MappingProxyType(tasks)


def _task_dict(task: TaskSpec) -> dict[str, Any]:
    """A task's declaration under ``tasks:`` (its name is the key; one input as ``input``)."""
    out = {k: v for k, v in task.to_dict().items() if k != "name"}
    if len(out["inputs"]) == 1:
        out["input"] = out.pop("inputs")[0]
    return out


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return tuple(value)


def _node(raw: Any, where: str) -> NodeConfig:
    raw = as_mapping(raw, where)
    known_keys(raw, NODE_KEYS, where)
    node_id = str(raw.get("id", ""))
    if not _ID.match(node_id):
        raise ConfigError(f"{where}.id {node_id!r} is not a valid node id",
                          hint="use lowercase letters, digits, '.', '_' or '-' (max 63)")
    declared = raw.get("tier", "")
    if not isinstance(declared, str):
        raise ConfigError(f"{where}.tier must be device, edge or cloud, got {declared!r}")
    try:
        tier = Tier.parse(declared)
    except ValueError as exc:
        raise ConfigError(f"{where}.tier: {exc}") from None
    models = raw.get("models") or []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ConfigError(f"{where}.models must be a list of model names, e.g. [fmnist-small]")
    quota = raw.get("cpu_quota")
    heads = raw.get("heads") or []
    if not isinstance(heads, list) or not all(isinstance(m, str) for m in heads):
        raise ConfigError(f"{where}.heads must be a list of model names, e.g. [fmnist-large]")
    versioned = [m for m in (*models, *heads) if "@" in m]
    if versioned:
        raise ConfigError(f"{where} names {versioned[0]!r}: a node serves a model by its name",
                          hint="name the model here and roll a published version out with "
                               "`tierlink rollout start NAME VERSION`")
    return NodeConfig(
        node_id=node_id, tier=tier, models=tuple(models), heads=tuple(heads),
        workers=as_int(raw.get("workers", 1), f"{where}.workers", 1),
        max_queue=as_int(raw.get("max_queue", 256), f"{where}.max_queue", 1),
        escalation_queue=(None if raw.get("escalation_queue") is None else as_int(
            raw["escalation_queue"], f"{where}.escalation_queue", 0)),
        threads=as_int(raw.get("threads", 1), f"{where}.threads", 1),
        cpu_quota=None if quota is None else as_float(quota, f"{where}.cpu_quota", 0.01, 64.0),
        providers=parse_providers(raw.get("providers"), f"{where}.providers"),
        chat=parse_chat(raw.get("chat"), f"{where}.chat"),
        advertise_url=(None if raw.get("advertise_url") is None
                       else as_url(raw["advertise_url"], f"{where}.advertise_url")),
        labels=_labels(raw.get("labels") or {}, f"{where}.labels"),
        default_privacy=_privacy(raw.get("default_privacy", "any"), f"{where}.default_privacy"),
        engine=parse_engine(raw.get("engine", "onnxruntime"), raw.get("ray"), where),
        device_state_file=_path(raw.get("device_state_file"), f"{where}.device_state_file"),
    )


def _path(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"{where} must be a file path, got {raw!r}")
    return raw


def _privacy(raw: Any, where: str) -> str:
    if raw not in ("local", "site", "any"):
        raise ConfigError(f"{where} must be local, site or any, got {raw!r}",
                          hint="local: a request that names no privacy level stays on the node")
    return str(raw)


_LABEL_KEY = re.compile(r"^[a-z][a-z0-9._-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9._-]{0,63}$")


def _labels(raw: Any, where: str) -> Mapping[str, str]:
    labels = {str(k): str(v) for k, v in as_mapping(raw, where).items()}
    for key, value in labels.items():
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise ConfigError(f"{where}.{key}: {value!r} is not a valid label",
                              hint="keys: lowercase letters, digits, '.', '_', '-'; values: "
                                   "letters, digits, '.', '_', '-' (at most 63 each)")
    if len(labels) > 16:
        raise ConfigError(f"{where} has {len(labels)} labels; at most 16")
    return MappingProxyType(labels)


def _links(raw: Any, where: str, nodes: Mapping[str, NodeConfig]) -> list[LinkConfig]:
    raw = as_mapping(raw, where)
    known_keys(raw, LINK_KEYS, where)
    srcs, dsts = _ids(raw.get("from"), f"{where}.from"), _ids(raw.get("to"), f"{where}.to")
    for node_id in (*srcs, *dsts):
        if node_id not in nodes:
            raise ConfigError(f"{where} names unknown node {node_id!r}",
                              hint="declare it under 'nodes' first")
    bandwidth = raw.get("bandwidth_mbit")
    delay = as_float(raw.get("delay_ms", 0.0), f"{where}.delay_ms", 0.0)
    jitter = as_float(raw.get("jitter_ms", 0.0), f"{where}.jitter_ms", 0.0)
    bw = None if bandwidth is None else as_float(bandwidth, f"{where}.bandwidth_mbit", 0.001)
    loss = as_float(raw.get("loss", 0.0), f"{where}.loss", 0.0, 0.99)
    out = [LinkConfig(s, d, delay, jitter, bw, loss) for s in srcs for d in dsts if s != d]
    if not out:
        raise ConfigError(f"{where} declares no link (from and to are the same node)")
    return out


# -- small validators -----------------------------------------------------------------------


def _list(data: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{source}: '{key}' must be a non-empty list")
    return value


def _ids(value: Any, where: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, str) and i for i in items):
        raise ConfigError(f"{where} must be a node id or a list of node ids")
    return items


def _unique(values: list[str], where: str) -> None:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ConfigError(f"{where}: {v!r} appears twice")
        seen.add(v)
