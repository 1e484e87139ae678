"""How every node of a fleet routes (fleet YAML ``routing:`` and ``cost:``): the policy and
its weights, cascade thresholds and their provenance, retries, breakers, hedging, split
codec losses, the bandit's reward, shadow mode — validated once here and frozen."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from tierlink.core.types import THERMAL_LEVELS, CascadeRecord
from tierlink.errors import ConfigError
from tierlink.estimate.cost import DEFAULT_COST_MODEL, CostModel
from tierlink.estimate.split import DEFAULT_CODECS
from tierlink.policy.base import DeviceStateRule, PolicyConfig, RewardWeights, Weights
from tierlink.settings.fields import as_bool, as_float, as_int, as_mapping, known, known_keys

__all__ = ["LIVE_KEYS", "BreakerConfig", "HedgeConfig", "MirrorConfig", "OverloadConfig",
           "RoutingConfig", "ShadowConfig", "parse_cost", "parse_routing", "with_live"]


@dataclass(frozen=True, slots=True)
class HedgeConfig:
    """Fleet YAML ``routing.hedging``."""

    enabled: bool = True  # off: a slow call upstream is only ever waited on
    # A call is hedged once it ran longer than this quantile of the recent calls to the
    # task's fastest upstream
    quantile: float = 0.95
    budget: float = 0.05  # extra upstream calls, as a share of requests
    min_samples: int = 20  # per upstream, before its quantile is trusted
    window: int = 200  # recent samples kept per (task, upstream)
    min_delay_ms: float = 2.0  # never hedge a call sooner than this many ms after it was sent


@dataclass(frozen=True, slots=True)
class OverloadConfig:
    """Fleet YAML ``routing.overload``: how a node sheds less urgent requests when its event
    loop falls behind (node/overload.py)."""

    enabled: bool = True  # off: the node admits every request (deadline checks still apply)
    # Milliseconds the event loop ran late per 100 ms of a window above which it sheds
    # (benchmarks/overload.py on the demo fleet: about 7 at half its capacity, 15 at
    # capacity, 24 at twice, 60 at three times, where realtime misses half its deadlines).
    target_lag_ms: float = 25.0
    probe_ms: float = 5.0  # how often the lag is probed
    window_s: float = 0.2  # the level moves at most this often
    step_down: float = 0.25  # per overloaded window
    step_up: float = 0.1  # per calm window (lag under 70% of the target)
    max_wait_s: float = 0.25  # a shed request waits at most this for room
    retry_after_s: float = 1.0  # seconds a shed request's 429 asks the caller to wait
    # Shed only after a window in which at least this many inference requests were in the
    # node at once: with fewer, the lag is a request's own work (a device's CPU quota
    # freezing it mid-model), and refusing the next one would win nothing.
    min_inflight: int = 2


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failure_threshold: int = 3  # failures in a row that open an upstream's breaker
    cooldown_s: float = 2.0  # how long it stays open before one request probes it
    max_cooldown_s: float = 30.0  # the cooldown doubles on each failed probe, up to this


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    """``routing.shadow``: the candidate policy (a registered name, with its own weights if
    given) and the share of requests the acting policy explores."""

    policy: str  # the candidate: a registered policy's name (or {name, options})
    # the candidate's own trade-off weights (left out: the acting policy's `routing.weights`)
    weights: Weights | None = None
    # share of requests (0..0.5) on which a uniformly drawn feasible option goes first
    # instead of the acting policy's choice, so the log covers other options (0: none)
    explore: float = 0.0
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": policy_form(self.policy, self.options),
                               "explore": self.explore}
        if self.weights is not None:
            out["weights"] = asdict(self.weights)
        return out


@dataclass(frozen=True, slots=True)
class MirrorConfig:
    """Fleet YAML ``routing.mirror``: answers asked again of the most capable model their
    privacy allows, in the background, for agreement per model version (node/mirroring.py)."""

    # Share (0..0.05) of the answers each node's own models give that are mirrored; 0: off
    share: float = 0.0
    # Mirrors in flight per node at most; an answer sampled while they are all busy is
    # skipped (counted), never queued
    max_in_flight: int = 4
    # Deadline (ms) of a mirrored request: batch priority, it waits behind interactive work
    deadline_ms: float = 10_000.0


MAX_MIRROR_SHARE = 0.05  # of a node's answers: mirroring is a sample, not a second fleet


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """How every node of the fleet routes (one policy, one set of weights)."""

    policy: str = "tierlink"  # a registered policy: tierlink, bandit, a baseline or a plugin's
    # ``routing.policy: {name, options}``: what the policy's factory is given (the policy
    # validates them itself); ``routing.policy: NAME`` is short for no options.
    policy_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # How the policy trades accuracy, latency and cost once hard constraints are met
    weights: Weights = field(default_factory=Weights)
    # By model name: an answer less confident than its model's bar is escalated upstream
    # (`tierlink cascade tune` writes them; others take `default_threshold`)
    thresholds: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    default_threshold: float = 0.9  # a cascade's confidence bar for a model with none tuned
    max_hops: int = 3  # how many times a request may be forwarded
    reserve_ms: float = 5.0  # kept back from deadlines for the way back to the caller
    allow_policy_override: bool = False  # let a request name a baseline policy (benchmarks)
    retry_budget: float = 0.2  # retries may add at most this share of requests
    # Per upstream: stop calling one that keeps failing, then probe it again after a cooldown
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
    # Shedding batch, then interactive requests while the node's event loop runs late
    overload: OverloadConfig = field(default_factory=OverloadConfig)
    # Measured accuracy loss (points) of feature codecs, by codec (e.g. from `tierlink split
    # codecs`): replaces the default table's conservative figure in split pricing.
    split_codec_loss: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({}))
    # Written by `cascade tune` (routing.cascade.tuned_on): the sha256 of each model the
    # thresholds were tuned on.
    cascade_tuned_on: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The target the thresholds were tuned for (routing.cascade.target: `accuracy_drop` in
    # points and `confidence`): what a re-tune for new models aims at again.
    cascade_target: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # Written by `cascade tune` (routing.cascade.records): by path (`a>b`: the models an
    # input met), what its last model did on the calibration inputs that came that way
    cascade_records: Mapping[tuple[str, ...], CascadeRecord] = field(
        default_factory=lambda: MappingProxyType({}))
    # Points: options further below the most accurate feasible one are not chosen.
    accuracy_tolerance: float = 0.0
    # What the `bandit` policy is rewarded for, per request (routing.bandit.reward)
    reward: RewardWeights = field(default_factory=RewardWeights)
    # Shadow mode (policy/shadow.py): a candidate decides beside the acting policy on each
    # node's own requests, logged for `tierlink policy evaluate`.
    shadow: ShadowConfig | None = None
    # Mirroring (routing/mirror.py): a share of the answers asked again of the most capable
    # model, for agreement per model version (a rollout gate, an alert)
    mirror: MirrorConfig = field(default_factory=MirrorConfig)
    # When a node's battery or heat makes it send its requests upstream (policy/base.py)
    device_state: DeviceStateRule = field(default_factory=DeviceStateRule)

    def to_dict(self) -> dict[str, Any]:
        """The ``routing:`` section as ``parse_routing`` reads it — every setting, so that
        ``parse_routing(c.to_dict(), c.cost.to_mapping()) == c``; the ``cost:`` section is
        ``self.cost.to_mapping()``."""
        from tierlink.cascade.records import path_key, record_to_dict

        out: dict[str, Any] = {
            "policy": policy_form(self.policy, self.policy_options),
            "weights": asdict(self.weights), "thresholds": dict(self.thresholds),
            "default_threshold": self.default_threshold, "max_hops": self.max_hops,
            "reserve_ms": self.reserve_ms, "allow_policy_override": self.allow_policy_override,
            "retry_budget": self.retry_budget, "breaker": asdict(self.breaker),
            "local_features_may_leave": self.local_features_may_leave,
            "probe_idle_s": self.probe_idle_s, "hedging": asdict(self.hedging),
            "overload": asdict(self.overload), "split_codec_loss": dict(self.split_codec_loss),
            "accuracy_tolerance": self.accuracy_tolerance,
            "bandit": {"reward": asdict(self.reward)}, "mirror": asdict(self.mirror),
            "device_state": asdict(self.device_state)}
        cascade = {"tuned_on": dict(self.cascade_tuned_on),
                   "records": {path_key(k): record_to_dict(r, None)
                               for k, r in self.cascade_records.items()},
                   "target": dict(self.cascade_target)}
        if any(cascade.values()):
            out["cascade"] = {k: v for k, v in cascade.items() if v}
        if self.shadow is not None:
            out["shadow"] = self.shadow.to_dict()
        return out

    def policy_config(self) -> PolicyConfig:
        codecs = tuple(replace(c, accuracy_loss=self.split_codec_loss.get(c.spec,
                                                                          c.accuracy_loss))
                       for c in DEFAULT_CODECS)
        return PolicyConfig(weights=self.weights, thresholds=self.thresholds,
                            default_threshold=self.default_threshold, max_hops=self.max_hops,
                            reserve_ms=self.reserve_ms, cost=self.cost,
                            local_features_may_leave=self.local_features_may_leave,
                            split_codecs=codecs, cascade_records=self.cascade_records,
                            accuracy_tolerance=self.accuracy_tolerance, reward=self.reward,
                            device_state=self.device_state)


# The keys of a ``routing:`` section a running node takes from a new revision (the control
# plane's ``tierlink policy apply``); the rest is fixed for the life of its processes.
LIVE_KEYS = ("policy", "weights", "thresholds", "default_threshold", "max_hops",
             "accuracy_tolerance", "allow_policy_override", "split_codec_loss", "cascade",
             "bandit", "shadow", "device_state")
_LIVE_FIELDS = ("policy", "policy_options", "weights", "thresholds", "default_threshold",
                "max_hops", "accuracy_tolerance", "allow_policy_override", "split_codec_loss",
                "cascade_tuned_on", "cascade_records", "cascade_target", "reward", "shadow",
                "device_state")


def with_live(running: RoutingConfig, revision: RoutingConfig) -> RoutingConfig:
    """``running`` with what a new revision may change taken from ``revision``."""
    return replace(running, **{name: getattr(revision, name) for name in _LIVE_FIELDS})


def parse_routing(raw: Mapping[str, Any], cost: Mapping[str, Any] | None = None) -> RoutingConfig:
    """The ``routing:`` (and ``cost:``) sections alone, e.g. from a node spec file."""
    return _routing(as_mapping(raw, "routing"), as_mapping(cost or {}, "cost"))


ROUTING_KEYS = ("policy", "weights", "thresholds", "default_threshold", "max_hops",
                "reserve_ms", "allow_policy_override", "retry_budget", "breaker",
                "local_features_may_leave", "probe_idle_s", "hedging", "overload",
                "split_codec_loss", "cascade", "accuracy_tolerance", "bandit", "shadow",
                "mirror", "device_state")


def _routing(raw: Mapping[str, Any], cost: Mapping[str, Any]) -> RoutingConfig:
    known_keys(raw, ROUTING_KEYS, "routing")
    policy, options = policy_choice(raw.get("policy", "tierlink"), "routing.policy")
    weights = as_mapping(raw.get("weights") or {}, "routing.weights")
    thresholds = as_mapping(raw.get("thresholds") or {}, "routing.thresholds")
    breaker = as_mapping(raw.get("breaker") or {}, "routing.breaker")
    known_keys(breaker, ("failure_threshold", "cooldown_s", "max_cooldown_s"),
               "routing.breaker")
    return RoutingConfig(
        policy=policy, policy_options=options,
        weights=Weights(**{k: as_float(v, f"routing.weights.{k}", 0.0) for k, v in weights.items()
                           if known(k, ("accuracy", "latency", "cost"), "routing.weights")}),
        thresholds=MappingProxyType({str(k): as_float(v, f"routing.thresholds.{k}", 0.0, 1.0)
                                     for k, v in thresholds.items()}),
        default_threshold=as_float(raw.get("default_threshold", 0.9),
                                 "routing.default_threshold", 0.0, 1.0),
        max_hops=as_int(raw.get("max_hops", 3), "routing.max_hops", 0),
        reserve_ms=as_float(raw.get("reserve_ms", 5.0), "routing.reserve_ms", 0.0),
        allow_policy_override=as_bool(raw.get("allow_policy_override", False),
                                      "routing.allow_policy_override"),
        retry_budget=as_float(raw.get("retry_budget", 0.2), "routing.retry_budget", 0.0, 1.0),
        breaker=BreakerConfig(
            failure_threshold=as_int(breaker.get("failure_threshold", 3),
                                   "routing.breaker.failure_threshold", 1),
            cooldown_s=as_float(breaker.get("cooldown_s", 2.0), "routing.breaker.cooldown_s", 0.0),
            max_cooldown_s=as_float(breaker.get("max_cooldown_s", 30.0),
                                  "routing.breaker.max_cooldown_s", 0.0),
        ),
        cost=parse_cost(cost),
        local_features_may_leave=as_bool(raw.get("local_features_may_leave", False),
                                       "routing.local_features_may_leave"),
        probe_idle_s=as_float(raw.get("probe_idle_s", 2.0), "routing.probe_idle_s", 0.0),
        hedging=_hedging(as_mapping(raw.get("hedging") or {}, "routing.hedging")),
        overload=_overload(as_mapping(raw.get("overload") or {}, "routing.overload")),
        split_codec_loss=_codec_loss(as_mapping(raw.get("split_codec_loss") or {},
                                              "routing.split_codec_loss")),
        **_cascade(as_mapping(raw.get("cascade") or {}, "routing.cascade")),
        accuracy_tolerance=as_float(raw.get("accuracy_tolerance", 0.0),
                                  "routing.accuracy_tolerance", 0.0, 100.0),
        reward=_reward(as_mapping(raw.get("bandit") or {}, "routing.bandit")),
        shadow=_shadow(raw.get("shadow")),
        mirror=_mirror(as_mapping(raw.get("mirror") or {}, "routing.mirror")),
        device_state=_device_state(as_mapping(raw.get("device_state") or {},
                                              "routing.device_state")),
    )


def _device_state(raw: Mapping[str, Any]) -> DeviceStateRule:
    known_keys(raw, ("low_battery", "hot"), "routing.device_state")
    d = DeviceStateRule()
    hot = str(raw.get("hot", d.hot))
    if hot not in (*THERMAL_LEVELS, "none"):
        raise ConfigError(f"routing.device_state.hot must be one of "
                          f"{', '.join(THERMAL_LEVELS)} or none, got {hot!r}")
    return DeviceStateRule(
        low_battery=as_float(raw.get("low_battery", d.low_battery),
                             "routing.device_state.low_battery", 0.0, 1.0), hot=hot)


def _mirror(raw: Mapping[str, Any]) -> MirrorConfig:
    for key in raw:
        known(key, tuple(MirrorConfig.__dataclass_fields__), "routing.mirror")
    d = MirrorConfig()
    return MirrorConfig(
        share=as_float(raw.get("share", d.share), "routing.mirror.share", 0.0,
                       MAX_MIRROR_SHARE),
        max_in_flight=as_int(raw.get("max_in_flight", d.max_in_flight),
                             "routing.mirror.max_in_flight", 1),
        deadline_ms=as_float(raw.get("deadline_ms", d.deadline_ms), "routing.mirror.deadline_ms",
                             1.0, 3_600_000.0),
    )


def _shadow(raw: Any) -> ShadowConfig | None:
    if raw is None:
        return None
    raw = as_mapping(raw, "routing.shadow")
    for key in raw:
        known(key, ("policy", "weights", "explore"), "routing.shadow")
    if raw.get("policy") is None:
        raise ConfigError("routing.shadow.policy must name the candidate policy",
                          hint="e.g. shadow: {policy: bandit, explore: 0.05}")
    name, options = policy_choice(raw["policy"], "routing.shadow.policy")
    weights = raw.get("weights")
    parsed = None if weights is None else Weights(**{
        k: as_float(v, f"routing.shadow.weights.{k}", 0.0)
        for k, v in as_mapping(weights, "routing.shadow.weights").items()
        if known(k, ("accuracy", "latency", "cost"), "routing.shadow.weights")})
    return ShadowConfig(name, parsed,
                        as_float(raw.get("explore", 0.0), "routing.shadow.explore", 0.0, 0.5),
                        options)


def policy_form(name: str, options: Mapping[str, Any]) -> str | dict[str, Any]:
    """How the fleet file names a policy: ``NAME``, or ``{name, options}`` with options."""
    return {"name": name, "options": dict(options)} if options else name


def policy_choice(raw: Any, where: str) -> tuple[str, Mapping[str, Any]]:
    """``NAME`` or ``{name: NAME, options: {...}}``: the policy and its options."""
    if isinstance(raw, str) and raw:
        return raw, MappingProxyType({})
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a policy's name or {{name, options}}, got {raw!r}",
                          hint="e.g. policy: bandit, or policy: {name: bandit, options: "
                               "{prior_weight: 10}}")
    known_keys(raw, ("name", "options"), where)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name must name a registered policy")
    options = as_mapping(raw.get("options") or {}, f"{where}.options")
    return name, MappingProxyType({str(k): v for k, v in options.items()})


def _reward(raw: Mapping[str, Any]) -> RewardWeights:
    """``routing.bandit.reward``: what the ``bandit`` policy is rewarded for."""
    for key in raw:
        known(key, ("reward",), "routing.bandit")
    weights = as_mapping(raw.get("reward") or {}, "routing.bandit.reward")
    names = tuple(f.name for f in fields(RewardWeights))
    return RewardWeights(**{k: as_float(v, f"routing.bandit.reward.{k}", 0.0)
                            for k, v in weights.items()
                            if known(k, names, "routing.bandit.reward")})


def _cascade(raw: Mapping[str, Any]) -> dict[str, Any]:
    from tierlink.cascade.records import RETUNE, parse_records

    for key in raw:
        known(key, ("tuned_on", "records", "target"), "routing.cascade")
    tuned_on = as_mapping(raw.get("tuned_on") or {}, "routing.cascade.tuned_on")
    for model, digest in tuned_on.items():
        if not isinstance(digest, str) or len(digest) < 16:
            raise ConfigError(f"routing.cascade.tuned_on.{model} must be the model file's "
                              f"sha256, got {digest!r}", hint=RETUNE)
    records = parse_records(as_mapping(raw.get("records") or {}, "routing.cascade.records"),
                            "routing.cascade.records")
    target = as_mapping(raw.get("target") or {}, "routing.cascade.target")
    ranges = {"accuracy_drop": 100.0, "confidence": 0.9999}  # upper bounds; 0 is the floor
    for key in target:
        known(key, tuple(ranges), "routing.cascade.target")
    return {"cascade_tuned_on": MappingProxyType({str(k): str(v) for k, v in tuned_on.items()}),
            "cascade_records": MappingProxyType(records),
            "cascade_target": MappingProxyType({
                k: as_float(v, f"routing.cascade.target.{k}", 0.0, ranges[k])
                for k, v in target.items()})}


def _codec_loss(raw: Mapping[str, Any]) -> Mapping[str, float]:
    codecs = tuple(c.spec for c in DEFAULT_CODECS)
    return MappingProxyType({str(k): as_float(v, f"routing.split_codec_loss.{k}", 0.0, 100.0)
                             for k, v in raw.items()
                             if known(str(k), codecs, "routing.split_codec_loss")})


def _hedging(raw: Mapping[str, Any]) -> HedgeConfig:
    names = ("enabled", "quantile", "budget", "min_samples", "window", "min_delay_ms")
    for key in raw:
        known(key, names, "routing.hedging")
    d = HedgeConfig()
    return HedgeConfig(
        enabled=as_bool(raw.get("enabled", d.enabled), "routing.hedging.enabled"),
        quantile=as_float(raw.get("quantile", d.quantile), "routing.hedging.quantile", 0.5, 1.0),
        budget=as_float(raw.get("budget", d.budget), "routing.hedging.budget", 0.0, 1.0),
        min_samples=as_int(raw.get("min_samples", d.min_samples), "routing.hedging.min_samples", 1),
        window=as_int(raw.get("window", d.window), "routing.hedging.window", 1),
        min_delay_ms=as_float(raw.get("min_delay_ms", d.min_delay_ms),
                            "routing.hedging.min_delay_ms", 0.0),
    )


def _overload(raw: Mapping[str, Any]) -> OverloadConfig:
    d = OverloadConfig()
    for key in raw:
        known(key, tuple(OverloadConfig.__dataclass_fields__), "routing.overload")

    def positive(name: str) -> float:
        return as_float(raw.get(name, getattr(d, name)), f"routing.overload.{name}", 1e-6)

    return OverloadConfig(
        enabled=as_bool(raw.get("enabled", d.enabled), "routing.overload.enabled"),
        target_lag_ms=positive("target_lag_ms"), probe_ms=positive("probe_ms"),
        window_s=positive("window_s"), step_down=positive("step_down"),
        step_up=positive("step_up"),
        max_wait_s=as_float(raw.get("max_wait_s", d.max_wait_s), "routing.overload.max_wait_s",
                            0.0),
        retry_after_s=positive("retry_after_s"),
        min_inflight=as_int(raw.get("min_inflight", d.min_inflight),
                            "routing.overload.min_inflight", 1))


def parse_cost(raw: Mapping[str, Any]) -> CostModel:
    known_keys(raw, ("compute_usd_per_s", "transfer_usd_per_gb", "schedule"), "cost")
    try:
        return CostModel.from_mapping(raw) if raw else DEFAULT_COST_MODEL
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"cost: {exc}", hint="see docs/cost-model.md for the format") from exc
