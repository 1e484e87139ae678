"""The policy contract and its typed registry.

A policy is a pure decision: ``plan(request, view, rng) -> Plan``. It reads only its
arguments (no I/O, no clock, no environment) and returns ranked placements; the dispatcher
around it does every send, timeout, retry and fallback. Randomness (power-of-two choices)
comes from the ``rng`` the caller passes, so a run is reproducible from its seed.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, runtime_checkable

from tierlink.core.registry import Registry
from tierlink.core.types import (
    THERMAL_LEVELS,
    CascadeRecord,
    ClusterView,
    DeviceState,
    Outcome,
    Plan,
    Request,
)
from tierlink.errors import ConfigError
from tierlink.estimate.cost import DEFAULT_COST_MODEL, CostModel
from tierlink.estimate.latency import EstimateParams
from tierlink.estimate.split import DEFAULT_CODECS, CodecProfile

ENTRY_POINT_GROUP = "tierlink.policies"


@dataclass(frozen=True, slots=True)
class Weights:
    """Trade-off between objectives once hard constraints are met.

    score = accuracy·(expected accuracy in points) − latency·(expected latency / deadline)
            − cost·(expected cost / the cost of answering at the fleet's dearest node)

    ``cost = 2``: sending every request to the dearest tier is worth two points of accuracy.
    """

    accuracy: float = 1.0  # per point of expected accuracy
    latency: float = 1.0  # per share of the deadline the expected latency takes
    cost: float = 2.0  # per share of the cost of answering at the fleet's dearest node


@dataclass(frozen=True, slots=True)
class RewardWeights:
    """What a learning policy is rewarded for, per request (``policy/bandit.py``)."""

    # Defaults in the proportions of the tierlink policy's own weights (a point of accuracy
    # is worth a deadline's worth of latency, or half the fleet's dearest answer's cost).
    accuracy: float = 1.0
    latency: float = 0.01  # per deadline's worth of latency (capped at two)
    miss: float = 0.5  # an answer later than its deadline (or none)
    cost: float = 0.02  # per "the fleet's dearest node" of cost
    energy: float = 0.0  # per second of device compute
    privacy: float = 0.0  # an input that left its device (allowed, but exposed)

    def reward(self, correct: float, latency_ms: float, deadline_ms: float, cost: float,
               ref_cost: float, device_s: float = 0.0, left_device: bool = False) -> float:
        late = latency_ms > deadline_ms
        return (self.accuracy * correct
                - self.latency * min(latency_ms / max(deadline_ms, 1e-9), 2.0)
                - self.miss * late
                - self.cost * (cost / ref_cost if ref_cost > 0 else 0.0)
                - self.energy * device_s - self.privacy * left_device)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DeviceStateRule:
    """When a node spares its own compute (``routing.device_state``): its battery at or
    under ``low_battery`` while not charging, or its heat at ``hot`` or above. Its requests
    then go to an upstream that can answer in time; where none can (privacy, deadline), it
    answers itself. ``low_battery: 0`` and ``hot: none`` turn either half off."""

    low_battery: float = 0.2  # the battery's charge, 0-1
    hot: str = "serious"  # a level of THERMAL_LEVELS, or "none"

    def spare_reason(self, state: DeviceState | None) -> str:
        """Why a node in ``state`` spares its compute ("low battery", "thermal serious": a
        plan's reason, and a metric label, so a few words only); "" when it need not."""
        if state is None:
            return ""
        if state.battery is not None and not state.charging \
                and state.battery <= self.low_battery:
            return "low battery"
        if self.hot in THERMAL_LEVELS and state.heat >= THERMAL_LEVELS.index(self.hot):
            return f"thermal {state.thermal}"
        return ""

    def spared_first(self, state: DeviceState | None, options: list[T],
                     computes_here: Callable[[T], bool]) -> list[T]:
        """``options`` (best first) with those that do not compute on the node moved ahead,
        in their order, when ``state`` calls for sparing it and there are any; else as
        they are."""
        if not self.spare_reason(state):
            return options
        away = [o for o in options if not computes_here(o)]
        return away + [o for o in options if computes_here(o)] if away else options

    def reason(self, reason: str, state: DeviceState | None, spared: bool) -> str:
        """A plan's reason, saying so when the node's state sent the request away."""
        why = self.spare_reason(state)
        return f"{reason} ({why}: local compute spared)" if why and spared else reason


def _no_records() -> Mapping[tuple[str, ...], CascadeRecord]:
    return MappingProxyType({})


def _no_thresholds() -> Mapping[str, float]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Everything a built-in policy is configured with; validated once, passed down frozen."""

    weights: Weights = field(default_factory=Weights)
    thresholds: Mapping[str, float] = field(default_factory=_no_thresholds)  # by model name
    default_threshold: float = 0.9
    max_hops: int = 3
    # Kept back from every deadline for the answer to travel back to the caller (response
    # encoding, the caller's own HTTP stack): time the node cannot measure itself.
    reserve_ms: float = 5.0
    estimates: EstimateParams = field(default_factory=EstimateParams)
    cost: CostModel = DEFAULT_COST_MODEL
    # Split plans: the feature codecs to consider (measured profiles), the accuracy a codec
    # may cost (points), and whether a `local` request's features may leave the device.
    split_codecs: tuple[CodecProfile, ...] = DEFAULT_CODECS
    split_max_accuracy_loss: float = 0.5
    local_features_may_leave: bool = False
    # `cascade tune`'s calibration records by path (device model first): what each model
    # does on the inputs that reach it that way. Cascades are priced from them when present.
    cascade_records: Mapping[tuple[str, ...], CascadeRecord] = field(
        default_factory=_no_records)
    # Points: options further than this below the most accurate feasible one are not
    # chosen (they stay as fallbacks); among the rest latency and cost decide. 0 = off:
    # every option competes on the whole weighted score. A fleet whose cascade was tuned
    # for "top stage - X points" says with X what accurate enough means.
    accuracy_tolerance: float = 0.0
    # What a learning policy (``bandit``) is rewarded for (``routing.bandit.reward``).
    reward: RewardWeights = field(default_factory=RewardWeights)
    # When a node's battery or heat makes it spare its own compute (``routing.device_state``)
    device_state: DeviceStateRule = field(default_factory=DeviceStateRule)

    def threshold_for(self, model: str) -> float:
        return self.thresholds.get(model, self.default_threshold)

    def record(self, path: tuple[str, ...]) -> CascadeRecord | None:
        """The calibration record of ``path``'s last model on the inputs the earlier ones
        escalated, if it was tuned with the thresholds in force (None: not recorded, or
        its threshold was changed by hand since)."""
        rec = self.cascade_records.get(path)
        if rec is None or (rec.threshold is not None
                           and abs(rec.threshold - self.threshold_for(path[-1])) > 1e-4):
            return None
        return rec


@runtime_checkable
class Policy(Protocol):
    """Places one request. Called once per request on the node's event loop: keep it fast
    (microseconds) and never block."""

    name: str
    respects_deadline: bool  # False only for benchmark baselines that answer late

    def plan(self, request: Request, view: ClusterView, rng: random.Random) -> Plan: ...


@runtime_checkable
class Learner(Protocol):
    """A policy that learns from how its plans turned out. The node (and the simulator)
    hands every plan it made back with its outcome (``None``: no answer), whether the answer
    was right (1.0/0.0 where the label is known) and the latency the caller saw — once per
    request, after the answer, never on its path."""

    def feedback(self, plan: Plan, request: Request, view: ClusterView,
                 outcome: Outcome | None, correct: float, latency_ms: float) -> None: ...


def give_feedback(policy: object, plan: Plan, request: Request, view: ClusterView,
                  outcome: Outcome | None, correct: float, latency_ms: float) -> None:
    """Hand a learning policy (a :class:`Learner`) how its plan turned out; nothing for any
    other policy. (Looked up by name, once per request: ``isinstance`` against a protocol
    costs microseconds, which the simulator pays a million times an hour.)"""
    feedback = getattr(policy, "feedback", None)
    if feedback is not None:
        feedback(plan, request, view, outcome, correct, latency_ms)


PolicyFactory = Callable[..., Policy]


class PolicyRegistry:
    """Name → factory, through the one registry mechanism: the built-in policies and a
    user's own come in through the ``tierlink.policies`` entry-point group (tierlink's are
    declared in its ``pyproject.toml``). Duplicate names are an error, never a silent
    overwrite.

    A factory (usually the policy's class) is called ``factory(config, **options)``: the
    fleet's :class:`PolicyConfig`, and the options ``routing.policy: {name, options}`` gives
    it as its keyword-only parameters. An option the factory does not declare is refused
    here, naming the ones it does; what the values must be, the policy checks itself (a
    ``ConfigError`` naming the option)."""

    def __init__(self, *, discover: bool = True) -> None:
        self._factories: Registry[PolicyFactory] = Registry(ENTRY_POINT_GROUP, "policy",
                                                            discover=discover)

    def register(self, name: str, factory: PolicyFactory) -> None:
        self._factories.register(name, factory)

    def names(self) -> list[str]:
        return self._factories.names()

    def create(self, name: str, config: PolicyConfig | None = None,
               options: Mapping[str, Any] | None = None) -> Policy:
        factory = self._factories.get(name)
        options = dict(options or {})
        if options:
            _check_options(name, factory, options)
        return factory(config or PolicyConfig(), **options)


def policy_options(factory: Callable[..., object]) -> tuple[str, ...]:
    """The options a policy factory takes: its keyword-only parameters."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: no declared options
        return ()
    return tuple(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _check_options(name: str, factory: Callable[..., object], options: Mapping[str, Any]
                   ) -> None:
    accepted = policy_options(factory)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(f"routing.policy.options: policy {name!r} takes no option "
                          f"{unknown[0]!r}",
                          hint=(f"its options: {', '.join(accepted)}" if accepted
                                else f"{name} takes no options"))


REGISTRY = PolicyRegistry()
