"""One YAML file per fleet: nodes, tiers, models, links, routing weights.

Validated once here (every error names the field and the fix) and passed down frozen.
Example: ``examples/fleet.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from tierlink.core.types import CascadeRecord, Tier
from tierlink.errors import ConfigError
from tierlink.estimate.cost import DEFAULT_COST_MODEL, CostModel
from tierlink.estimate.split import DEFAULT_CODECS
from tierlink.fleet.chat_config import ChatConfig, check_verifiers, parse_chat
from tierlink.node.hedging import HedgeConfig
from tierlink.policy.base import PolicyConfig, RewardWeights, Weights
from tierlink.providers import parse_providers
from tierlink.tasks.spec import TaskSpec, task_from_dict

_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failure_threshold: int = 3
    cooldown_s: float = 2.0
    max_cooldown_s: float = 30.0


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    """``routing.shadow``: the candidate policy (a registered name, with its own weights if
    given) and the share of requests the acting policy explores."""

    policy: str
    weights: Weights | None = None
    explore: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.policy, "explore": self.explore}
        if self.weights is not None:
            out["weights"] = {"accuracy": self.weights.accuracy, "latency": self.weights.latency,
                              "cost": self.weights.cost}
        return out


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """How every node of the fleet routes (one policy, one set of weights)."""

    policy: str = "tierlink"
    weights: Weights = field(default_factory=Weights)
    thresholds: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    default_threshold: float = 0.9
    max_hops: int = 3
    reserve_ms: float = 5.0  # kept back from deadlines for the way back to the caller
    allow_policy_override: bool = False  # let a request name a baseline policy (benchmarks)
    retry_budget: float = 0.2  # retries may add at most this share of requests
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    cost: CostModel = DEFAULT_COST_MODEL
    # May the intermediate features of a `local`-privacy request leave the device in a split
    # plan? Off by default: features can leak the input. On, they travel as an `any` input.
    local_features_may_leave: bool = False
    # Probe a link that carried no traffic for this long (s; 0 = never) — only nodes that
    # can start split plans probe, since only split plans depend on the bandwidth.
    probe_idle_s: float = 2.0
    # Hedged calls upstream (node/hedging.py): after the learned delay, a copy to the plan's
    # next upstream, within a duplicate budget.
    hedging: HedgeConfig = field(default_factory=HedgeConfig)
    # Measured accuracy loss (points) of feature codecs, by codec (e.g. from `tierlink split
    # codecs`): replaces the default table's conservative figure in split pricing.
    split_codec_loss: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({}))
    # Written by `cascade tune` (routing.cascade): the sha256 of each model the thresholds
    # were tuned on, and each model's calibration figures on the inputs reaching it by path.
    cascade_tuned_on: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The target the thresholds were tuned for (routing.cascade.target: `accuracy_drop` in
    # points and `confidence`): what a re-tune for new models aims at again.
    cascade_target: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    cascade_records: Mapping[tuple[str, ...], CascadeRecord] = field(
        default_factory=lambda: MappingProxyType({}))
    # Points: options further below the most accurate feasible one are not chosen.
    accuracy_tolerance: float = 0.0
    reward: RewardWeights = field(default_factory=RewardWeights)  # the bandit's
    # Shadow mode (policy/shadow.py): a candidate decides beside the acting policy on each
    # node's own requests, logged for `tierlink policy evaluate`.
    shadow: ShadowConfig | None = None

    def policy_config(self) -> PolicyConfig:
        codecs = tuple(replace(c, accuracy_loss=self.split_codec_loss.get(c.spec,
                                                                          c.accuracy_loss))
                       for c in DEFAULT_CODECS)
        return PolicyConfig(weights=self.weights, thresholds=self.thresholds,
                            default_threshold=self.default_threshold, max_hops=self.max_hops,
                            reserve_ms=self.reserve_ms, cost=self.cost,
                            local_features_may_leave=self.local_features_may_leave,
                            split_codecs=codecs, cascade_records=self.cascade_records,
                            accuracy_tolerance=self.accuracy_tolerance, reward=self.reward)


@dataclass(frozen=True, slots=True)
class HardExampleConfig:
    """The hard-example loop (fleet YAML ``hard_examples:``): what a node does with inputs it
    escalated for low confidence. ``store_tier`` is the control plane's tier (``control.tier``):
    an input is sent only if its privacy level lets a node of that tier hold it."""

    enabled: bool = True
    sample_rate: float = 1.0  # share of eligible examples sent (seeded draw per example)
    max_queue: int = 1000  # examples waiting on the node; when full the oldest is dropped
    batch_size: int = 64  # flush as soon as this many wait ...
    flush_interval_s: float = 1.0  # ... or at least this often
    store_tier: Tier = Tier.CLOUD


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: str
    tier: Tier
    models: tuple[str, ...]
    workers: int = 1
    max_queue: int = 256
    cpu_quota: float | None = None  # fraction of one core, enforced with a cgroup
    heads: tuple[str, ...] = ()  # models whose head this node may run for a split plan
    # ONNX Runtime execution providers in order of preference (CPU is always the fallback)
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    chat: ChatConfig | None = None  # language models served over the OpenAI API


@dataclass(frozen=True, slots=True)
class LinkConfig:
    src: str
    dst: str
    delay_ms: float = 0.0  # one way: RTT = 2 x delay
    jitter_ms: float = 0.0
    bandwidth_mbit: float | None = None
    loss: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.src}->{self.dst}"

    @property
    def rtt_ms(self) -> float:
        return 2.0 * self.delay_ms


@dataclass(frozen=True, slots=True)
class FleetConfig:
    name: str
    nodes: tuple[NodeConfig, ...]
    links: tuple[LinkConfig, ...]
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    raw_routing: Mapping[str, Any] = field(default_factory=dict)  # as written, for node specs
    raw_cost: Mapping[str, Any] = field(default_factory=dict)
    zoo_profile: str = "full"
    control_port: int = 0
    control_ttl_s: float = 5.0
    control_tier: Tier = Tier.CLOUD  # where the control plane runs (hard-example privacy)
    hard_examples: HardExampleConfig = field(default_factory=HardExampleConfig)
    raw_hard_examples: Mapping[str, Any] = field(default_factory=dict)  # for node specs
    seed: int = 0
    # Public keys (ed25519:<base64>) whose signatures on model versions the nodes accept.
    trusted_keys: tuple[str, ...] = ()
    # Lets benchmarks and tests slow a node down over HTTP (/tierlink/v1/faults). Never on
    # in production: anyone who reaches the node could degrade it.
    fault_injection: bool = False
    # Tasks the zoo does not have, declared here (input, output kind, roles, labels); their
    # models come from the model store (`tierlink model import`).
    tasks: Mapping[str, TaskSpec] = field(default_factory=dict)

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


def parse_fleet(data: Any, source: str = "<fleet>") -> FleetConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with 'nodes' and 'links'")
    nodes = tuple(_node(n, f"nodes[{i}]") for i, n in enumerate(_list(data, "nodes", source)))
    _unique([n.node_id for n in nodes], "nodes[].id")
    by_id = {n.node_id: n for n in nodes}
    links = tuple(l for i, raw in enumerate(data.get("links") or [])
                  for l in _links(raw, f"links[{i}]", by_id))
    _unique([l.name for l in links], "links (from -> to pairs)")
    nodes = _checked_chat(nodes, links)
    control = _mapping(data.get("control") or {}, "control")
    zoo = _mapping(data.get("zoo") or {}, "zoo")
    return FleetConfig(
        name=str(data.get("name", Path(source).stem)),
        nodes=nodes,
        links=links,
        routing=_routing(_mapping(data.get("routing") or {}, "routing"),
                         _mapping(data.get("cost") or {}, "cost")),
        raw_routing=dict(data.get("routing") or {}),
        raw_cost=dict(data.get("cost") or {}),
        zoo_profile=str(zoo.get("profile", "full")),
        control_port=_int(control.get("port", 0), "control.port", 0),
        control_ttl_s=_float(control.get("ttl_s", 5.0), "control.ttl_s", 0.5),
        control_tier=_tier(control.get("tier", "cloud"), "control.tier"),
        hard_examples=parse_hard_examples(data.get("hard_examples") or {},
                                          control.get("tier", "cloud")),
        raw_hard_examples=dict(data.get("hard_examples") or {}),
        seed=_int(data.get("seed", 0), "seed", 0),
        trusted_keys=_strings(data.get("trusted_keys") or [], "trusted_keys"),
        fault_injection=_bool(data.get("fault_injection", False), "fault_injection"),
        tasks=_tasks(data.get("tasks") or {}),
    )


def _checked_chat(nodes: tuple[NodeConfig, ...],
                  links: tuple[LinkConfig, ...]) -> tuple[NodeConfig, ...]:
    chats = {n.node_id: n.chat for n in nodes if n.chat is not None}
    if not chats:
        return nodes
    fixed = check_verifiers(chats, {n.node_id: n.tier.label for n in nodes},
                            [(l.src, l.dst) for l in links])
    return tuple(replace(n, chat=fixed[n.node_id]) if n.node_id in fixed else n for n in nodes)


def _tasks(raw: Any) -> Mapping[str, TaskSpec]:
    from tierlink.tasks.registry import kind_of

    tasks = {str(k): task_from_dict(str(k), v) for k, v in _mapping(raw, "tasks").items()}
    for task in tasks.values():
        kind_of(task.kind)  # an unknown kind is refused here, naming the known ones
    return MappingProxyType(tasks)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return tuple(value)


def parse_hard_examples(raw: Any, control_tier: str | Tier = "cloud") -> HardExampleConfig:
    """The ``hard_examples:`` section (and ``control.tier``), e.g. from a node spec file."""
    raw = _mapping(raw, "hard_examples")
    for key in raw:
        _known(key, ("enabled", "sample_rate", "max_queue", "batch_size", "flush_interval_s"),
               "hard_examples")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"hard_examples.enabled must be true or false, got {enabled!r}")
    return HardExampleConfig(
        enabled=enabled,
        sample_rate=_float(raw.get("sample_rate", 1.0), "hard_examples.sample_rate", 0.0, 1.0),
        max_queue=_int(raw.get("max_queue", 1000), "hard_examples.max_queue", 1),
        batch_size=_int(raw.get("batch_size", 64), "hard_examples.batch_size", 1),
        flush_interval_s=_float(raw.get("flush_interval_s", 1.0),
                                "hard_examples.flush_interval_s", 0.01),
        store_tier=_tier(control_tier, "control.tier"),
    )


def _tier(value: Any, where: str) -> Tier:
    try:
        return Tier.parse(value)
    except (ValueError, AttributeError) as exc:
        raise ConfigError(f"{where}: {exc}", hint="use device, edge or cloud") from None


def _node(raw: Any, where: str) -> NodeConfig:
    raw = _mapping(raw, where)
    node_id = str(raw.get("id", ""))
    if not _ID.match(node_id):
        raise ConfigError(f"{where}.id {node_id!r} is not a valid node id",
                          hint="use lowercase letters, digits, '.', '_' or '-' (max 63)")
    try:
        tier = Tier.parse(raw.get("tier", ""))
    except ValueError as exc:
        raise ConfigError(f"{where}.tier: {exc}") from None
    models = raw.get("models") or []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ConfigError(f"{where}.models must be a list of model names, e.g. [fmnist-small]")
    quota = raw.get("cpu_quota")
    heads = raw.get("heads") or []
    if not isinstance(heads, list) or not all(isinstance(m, str) for m in heads):
        raise ConfigError(f"{where}.heads must be a list of model names, e.g. [fmnist-large]")
    return NodeConfig(
        node_id=node_id, tier=tier, models=tuple(models), heads=tuple(heads),
        workers=_int(raw.get("workers", 1), f"{where}.workers", 1),
        max_queue=_int(raw.get("max_queue", 256), f"{where}.max_queue", 1),
        cpu_quota=None if quota is None else _float(quota, f"{where}.cpu_quota", 0.01, 64.0),
        providers=parse_providers(raw.get("providers"), f"{where}.providers"),
        chat=parse_chat(raw.get("chat"), f"{where}.chat"),
    )


def _links(raw: Any, where: str, nodes: Mapping[str, NodeConfig]) -> list[LinkConfig]:
    raw = _mapping(raw, where)
    srcs, dsts = _ids(raw.get("from"), f"{where}.from"), _ids(raw.get("to"), f"{where}.to")
    for node_id in (*srcs, *dsts):
        if node_id not in nodes:
            raise ConfigError(f"{where} names unknown node {node_id!r}",
                              hint="declare it under 'nodes' first")
    bandwidth = raw.get("bandwidth_mbit")
    delay = _float(raw.get("delay_ms", 0.0), f"{where}.delay_ms", 0.0)
    jitter = _float(raw.get("jitter_ms", 0.0), f"{where}.jitter_ms", 0.0)
    bw = None if bandwidth is None else _float(bandwidth, f"{where}.bandwidth_mbit", 0.001)
    loss = _float(raw.get("loss", 0.0), f"{where}.loss", 0.0, 0.99)
    out = [LinkConfig(s, d, delay, jitter, bw, loss) for s in srcs for d in dsts if s != d]
    if not out:
        raise ConfigError(f"{where} declares no link (from and to are the same node)")
    return out


def parse_routing(raw: Mapping[str, Any], cost: Mapping[str, Any] | None = None) -> RoutingConfig:
    """The ``routing:`` (and ``cost:``) sections alone, e.g. from a node spec file."""
    return _routing(_mapping(raw, "routing"), _mapping(cost or {}, "cost"))


def _routing(raw: Mapping[str, Any], cost: Mapping[str, Any]) -> RoutingConfig:
    weights = _mapping(raw.get("weights") or {}, "routing.weights")
    thresholds = _mapping(raw.get("thresholds") or {}, "routing.thresholds")
    breaker = _mapping(raw.get("breaker") or {}, "routing.breaker")
    return RoutingConfig(
        policy=str(raw.get("policy", "tierlink")),
        weights=Weights(**{k: _float(v, f"routing.weights.{k}", 0.0) for k, v in weights.items()
                           if _known(k, ("accuracy", "latency", "cost"), "routing.weights")}),
        thresholds=MappingProxyType({str(k): _float(v, f"routing.thresholds.{k}", 0.0, 1.0)
                                     for k, v in thresholds.items()}),
        default_threshold=_float(raw.get("default_threshold", 0.9),
                                 "routing.default_threshold", 0.0, 1.0),
        max_hops=_int(raw.get("max_hops", 3), "routing.max_hops", 0),
        reserve_ms=_float(raw.get("reserve_ms", 5.0), "routing.reserve_ms", 0.0),
        allow_policy_override=bool(raw.get("allow_policy_override", False)),
        retry_budget=_float(raw.get("retry_budget", 0.2), "routing.retry_budget", 0.0, 1.0),
        breaker=BreakerConfig(
            failure_threshold=_int(breaker.get("failure_threshold", 3),
                                   "routing.breaker.failure_threshold", 1),
            cooldown_s=_float(breaker.get("cooldown_s", 2.0), "routing.breaker.cooldown_s", 0.0),
            max_cooldown_s=_float(breaker.get("max_cooldown_s", 30.0),
                                  "routing.breaker.max_cooldown_s", 0.0),
        ),
        cost=_cost(cost),
        local_features_may_leave=_bool(raw.get("local_features_may_leave", False),
                                       "routing.local_features_may_leave"),
        probe_idle_s=_float(raw.get("probe_idle_s", 2.0), "routing.probe_idle_s", 0.0),
        hedging=_hedging(_mapping(raw.get("hedging") or {}, "routing.hedging")),
        split_codec_loss=_codec_loss(_mapping(raw.get("split_codec_loss") or {},
                                              "routing.split_codec_loss")),
        **_cascade(_mapping(raw.get("cascade") or {}, "routing.cascade")),
        accuracy_tolerance=_float(raw.get("accuracy_tolerance", 0.0),
                                  "routing.accuracy_tolerance", 0.0, 100.0),
        reward=_reward(_mapping(raw.get("bandit") or {}, "routing.bandit")),
        shadow=_shadow(raw.get("shadow")),
    )


def _shadow(raw: Any) -> ShadowConfig | None:
    if raw is None:
        return None
    raw = _mapping(raw, "routing.shadow")
    for key in raw:
        _known(key, ("policy", "weights", "explore"), "routing.shadow")
    if not isinstance(raw.get("policy"), str):
        raise ConfigError("routing.shadow.policy must name the candidate policy",
                          hint="e.g. shadow: {policy: bandit, explore: 0.05}")
    weights = raw.get("weights")
    parsed = None if weights is None else Weights(**{
        k: _float(v, f"routing.shadow.weights.{k}", 0.0)
        for k, v in _mapping(weights, "routing.shadow.weights").items()
        if _known(k, ("accuracy", "latency", "cost"), "routing.shadow.weights")})
    return ShadowConfig(raw["policy"], parsed,
                        _float(raw.get("explore", 0.0), "routing.shadow.explore", 0.0, 0.5))


def _reward(raw: Mapping[str, Any]) -> RewardWeights:
    """``routing.bandit.reward``: what the ``bandit`` policy is rewarded for."""
    for key in raw:
        _known(key, ("reward",), "routing.bandit")
    weights = _mapping(raw.get("reward") or {}, "routing.bandit.reward")
    known = tuple(f.name for f in fields(RewardWeights))
    return RewardWeights(**{k: _float(v, f"routing.bandit.reward.{k}", 0.0)
                            for k, v in weights.items()
                            if _known(k, known, "routing.bandit.reward")})


def _cascade(raw: Mapping[str, Any]) -> dict[str, Any]:
    from tierlink.cascade.records import RETUNE, parse_records

    for key in raw:
        _known(key, ("tuned_on", "records", "target"), "routing.cascade")
    tuned_on = _mapping(raw.get("tuned_on") or {}, "routing.cascade.tuned_on")
    for model, digest in tuned_on.items():
        if not isinstance(digest, str) or len(digest) < 16:
            raise ConfigError(f"routing.cascade.tuned_on.{model} must be the model file's "
                              f"sha256, got {digest!r}", hint=RETUNE)
    records = parse_records(_mapping(raw.get("records") or {}, "routing.cascade.records"),
                            "routing.cascade.records")
    target = _mapping(raw.get("target") or {}, "routing.cascade.target")
    ranges = {"accuracy_drop": 100.0, "confidence": 0.9999}  # upper bounds; 0 is the floor
    for key in target:
        _known(key, tuple(ranges), "routing.cascade.target")
    return {"cascade_tuned_on": MappingProxyType({str(k): str(v) for k, v in tuned_on.items()}),
            "cascade_records": MappingProxyType(records),
            "cascade_target": MappingProxyType({
                k: _float(v, f"routing.cascade.target.{k}", 0.0, ranges[k])
                for k, v in target.items()})}


def _codec_loss(raw: Mapping[str, Any]) -> Mapping[str, float]:
    known = tuple(c.spec for c in DEFAULT_CODECS)
    return MappingProxyType({str(k): _float(v, f"routing.split_codec_loss.{k}", 0.0, 100.0)
                             for k, v in raw.items()
                             if _known(str(k), known, "routing.split_codec_loss")})


def _hedging(raw: Mapping[str, Any]) -> HedgeConfig:
    known = ("enabled", "quantile", "budget", "min_samples", "window", "min_delay_ms")
    for key in raw:
        _known(key, known, "routing.hedging")
    d = HedgeConfig()
    return HedgeConfig(
        enabled=_bool(raw.get("enabled", d.enabled), "routing.hedging.enabled"),
        quantile=_float(raw.get("quantile", d.quantile), "routing.hedging.quantile", 0.5, 1.0),
        budget=_float(raw.get("budget", d.budget), "routing.hedging.budget", 0.0, 1.0),
        min_samples=_int(raw.get("min_samples", d.min_samples), "routing.hedging.min_samples", 1),
        window=_int(raw.get("window", d.window), "routing.hedging.window", 1),
        min_delay_ms=_float(raw.get("min_delay_ms", d.min_delay_ms),
                            "routing.hedging.min_delay_ms", 0.0),
    )


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def _cost(raw: Mapping[str, Any]) -> CostModel:
    try:
        return CostModel.from_mapping(raw) if raw else DEFAULT_COST_MODEL
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"cost: {exc}", hint="see docs/cost-model.md for the format") from exc


# -- small validators -----------------------------------------------------------------------


def _list(data: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{source}: '{key}' must be a non-empty list")
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _ids(value: Any, where: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, str) and i for i in items):
        raise ConfigError(f"{where} must be a node id or a list of node ids")
    return items


def _known(key: str, allowed: tuple[str, ...], where: str) -> bool:
    if key not in allowed:
        raise ConfigError(f"{where}.{key} is not a known field", hint=f"use {', '.join(allowed)}")
    return True


def _float(value: Any, where: str, lo: float | None = None, hi: float | None = None) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a number, got {value!r}") from None
    if (lo is not None and out < lo) or (hi is not None and out > hi):
        raise ConfigError(f"{where} = {out} is out of range [{lo}, {hi}]")
    return out


def _int(value: Any, where: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f"{where} must be an integer >= {lo}, got {value!r}")
    return value


def _unique(values: list[str], where: str) -> None:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ConfigError(f"{where}: {v!r} appears twice")
        seen.add(v)
