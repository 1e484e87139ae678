"""The vocabulary every part of tierlink shares: requests, views, placements, plans, outcomes.

Everything here is a plain frozen dataclass or enum with no I/O and no heavy imports, so the
live system, the policies and (later) the simulator all speak the same types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from types import MappingProxyType
from typing import Any, Literal, NamedTuple


class Tier(IntEnum):
    """Where a node sits. Ordered: a higher value is further from the data."""

    DEVICE = 0
    EDGE = 1
    CLOUD = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: str | int | Tier) -> Tier:
        if isinstance(value, Tier):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[value.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown tier {value!r}; expected device, edge or cloud") from None


class Privacy(str, Enum):
    """How far a request's raw input may travel. A hard constraint, never traded off."""

    LOCAL = "local"  # never leaves the origin device
    SITE = "site"  # device or the site's edge, never the cloud
    ANY = "any"

    def allows(self, tier: Tier, *, at_origin: bool) -> bool:
        """May a node of ``tier`` hold this input? ``at_origin``: it is the origin device."""
        if self is Privacy.LOCAL:
            return at_origin
        if self is Privacy.SITE:
            return tier <= Tier.EDGE
        return True

    def features_allowed(self, tier: Tier, *, local_may_leave: bool) -> bool:
        """May a split plan's features of such an input go to a node of ``tier``? As the raw
        input, except that a ``local`` input's features leave its device only where the
        fleet allows it (``routing.local_features_may_leave``)."""
        if self is Privacy.LOCAL:
            return local_may_leave
        return self.allows(tier, at_origin=False)

    @classmethod
    def parse(cls, value: str | Privacy) -> Privacy:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown privacy {value!r}; expected local, site or any") from None


class Priority(IntEnum):
    """Queue order: a lower value is served first."""

    REALTIME = 0
    INTERACTIVE = 1
    BATCH = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: str | int | Priority) -> Priority:
        if isinstance(value, Priority):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[value.strip().upper()]
        except KeyError:
            raise ValueError(
                f"unknown priority {value!r}; expected realtime, interactive or batch"
            ) from None


@dataclass(frozen=True, slots=True)
class Request:
    """What a policy knows about one inference request, as seen at the node deciding it.

    ``deadline_ms`` is the budget *remaining* when this node received the request; every hop
    forwards what is left of it.
    """

    request_id: str
    task: str
    deadline_ms: float
    origin: str  # node id of the device where the input was produced
    privacy: Privacy = Privacy.ANY
    priority: Priority = Priority.INTERACTIVE
    input_bytes: int = 0
    version: str | None = None  # pin to a model version; None = any
    hops: int = 0  # forwarding hops before reaching this node
    policy: str | None = None  # name of a policy override (benchmark baselines)
    # A mirrored answer asked again of the most capable model (routing/mirror.py)
    mirror: bool = False
    # A cascade's escalation: a node on its way already holds an answer to it, so the work
    # is optional and a busy node refuses it first (``escalation_queue``)
    escalation: bool = False


@dataclass(frozen=True, slots=True)
class CascadePoint:
    """On the calibration split: answering when confidence >= threshold."""

    threshold: float
    answered_share: float
    answered_accuracy: float


@dataclass(frozen=True, slots=True)
class CascadeRecord:
    """One model's figures on the calibration inputs that reach it along one path of a
    tuned cascade (each earlier model escalated them): ``share`` of all inputs that get
    there, the model's ``accuracy`` on them, and for a model with a threshold the share
    it then ``answered`` itself (confidence >= ``threshold``) and its accuracy on those.
    Written by ``cascade tune`` (``routing.cascade.records``); see ``cascade/records.py``."""

    share: float
    accuracy: float
    threshold: float | None = None
    answered: float | None = None
    answered_accuracy: float | None = None


@dataclass(frozen=True, slots=True)
class CodecPoint:
    """A feature codec measured at one cut: its payload's bytes per sample (header
    included) and its encode / decode latency on the profiling node."""

    codec: str
    wire_bytes: int
    encode_ms: float
    decode_ms: float


@dataclass(frozen=True, slots=True)
class SplitPoint:
    """One cut of a model as its node profiled it: the head (input -> ``cut``) and the tail
    (``cut`` -> output) latencies on that node, the cut tensor's FP32 bytes per sample, and
    each profiled codec's real size and cost on those features (they compress differently
    at every cut). ``continue_share`` < 1 for a multi-exit model: the share of inputs that
    no exit before the cut answered — only those are sent on (then ``head_ms`` and
    ``tail_ms`` are expectations over where inputs exit)."""

    cut: str
    head_ms: float
    tail_ms: float
    feature_bytes: int
    codecs: tuple[CodecPoint, ...] = ()
    continue_share: float = 1.0

    def codec(self, spec: str) -> CodecPoint | None:
        return next((c for c in self.codecs if c.codec == spec), None)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (heartbeats, split profiles) that :meth:`from_dict` reads."""
        return {"cut": self.cut, "head_ms": round(self.head_ms, 4),
                "tail_ms": round(self.tail_ms, 4), "feature_bytes": self.feature_bytes,
                "codecs": [{"codec": c.codec, "wire_bytes": c.wire_bytes,
                            "encode_ms": round(c.encode_ms, 4),
                            "decode_ms": round(c.decode_ms, 4)} for c in self.codecs],
                "continue_share": round(self.continue_share, 6)}

    @classmethod
    def from_dict(cls, p: Mapping[str, Any]) -> SplitPoint:
        codecs = tuple(CodecPoint(str(c["codec"]), int(c["wire_bytes"]),
                                  float(c["encode_ms"]), float(c["decode_ms"]))
                       for c in p.get("codecs", ()))
        return cls(str(p["cut"]), float(p["head_ms"]), float(p["tail_ms"]),
                   int(p["feature_bytes"]), codecs, float(p.get("continue_share", 1.0)))


@dataclass(frozen=True, slots=True)
class ModelView:
    """A model variant as a policy sees it (from its model card and the node's profile)."""

    name: str  # variant, e.g. "fmnist-small"
    task: str  # e.g. "fmnist"
    version: str
    accuracy: float  # top-1 on the task's test split, 0..1
    latency_ms: float  # measured compute per sample on this node (p50)
    output_bytes: int = 64
    cascade: tuple[CascadePoint, ...] = ()
    splits: tuple[SplitPoint, ...] = ()  # profiled cut points, in topological order
    # Every version of this model the node serves now: the active one (``version``, whose
    # figures these are) and a canary in its standby slot. Empty means ``(version,)``.
    versions: tuple[str, ...] = ()

    def holds(self, version: str) -> bool:
        """Whether a request pinned to ``version`` may be served by this model here."""
        return version == self.version or version in self.versions

    def cascade_at(self, threshold: float) -> CascadePoint | None:
        """The profiled cascade point with the largest threshold <= ``threshold``."""
        best: CascadePoint | None = None
        for point in self.cascade:
            if point.threshold <= threshold + 1e-9 and (
                best is None or point.threshold > best.threshold
            ):
                best = point
        return best


@dataclass(frozen=True, slots=True)
class LanguageModelView:
    """A language model on a node as a chat placement sees it (its card, the node's live
    engine figures, and what the fleet file says of it).

    ``decode_tok_s`` / ``prefill_tok_s``: one sequence alone on this node (the card's
    figures, one thread); a decoding step over n sequences takes ``1 + batch_slowdown·(n-1)``
    times one sequence's. ``quality``: on the fleet's labelled prompts (0..1; None when
    unmeasured). ``verifier``: "NODE/MODEL" this model drafts for (speculative decoding),
    with the ``acceptance`` its drafts have had there. ``price_per_1k``: USD per 1,000
    generated tokens on this node (a prompt token counts a fifth). ``identity``: which KV
    caches it computes (its weights file's hash, precision and kernels): a conversation's
    cache moves only between models of equal identity. ``split``: "NODE/MODEL" that runs
    the rest of this model when it runs only its first ``split_share`` of the layers here
    (``llm/layer_split.py``)."""

    name: str
    tasks: tuple[str, ...] = ()
    quality: float | None = None
    context: int = 8192
    prefill_tok_s: float = 100.0
    decode_tok_s: float = 10.0
    batch_slowdown: float = 0.1
    running: int = 0
    queued: int = 0
    max_sequences: int = 16
    verifier: str = ""
    acceptance: float = 0.7
    price_per_1k: float = 0.0
    identity: str = ""
    split: str = ""
    split_share: float = 0.0

    def serves(self, name: str) -> bool:
        """Whether a request naming ``name`` (a model or a chat task) may run here."""
        return name == self.name or name in self.tasks

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (heartbeats, ``GET /v1/models``) that :meth:`from_dict` reads."""
        return {"name": self.name, "tasks": list(self.tasks), "quality": self.quality,
                "context": self.context, "prefill_tok_s": round(self.prefill_tok_s, 3),
                "decode_tok_s": round(self.decode_tok_s, 3),
                "batch_slowdown": round(self.batch_slowdown, 4), "running": self.running,
                "queued": self.queued, "max_sequences": self.max_sequences,
                "verifier": self.verifier, "acceptance": round(self.acceptance, 4),
                "price_per_1k": self.price_per_1k, "identity": self.identity,
                "split": self.split, "split_share": round(self.split_share, 4)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LanguageModelView:
        quality = d.get("quality")
        return cls(str(d["name"]), tuple(str(t) for t in d.get("tasks", ())),
                   None if quality is None else float(quality), int(d.get("context", 8192)),
                   float(d.get("prefill_tok_s", 100.0)), float(d.get("decode_tok_s", 10.0)),
                   float(d.get("batch_slowdown", 0.1)), int(d.get("running", 0)),
                   int(d.get("queued", 0)), int(d.get("max_sequences", 16)),
                   str(d.get("verifier", "")), float(d.get("acceptance", 0.7)),
                   float(d.get("price_per_1k", 0.0)), str(d.get("identity", "")),
                   str(d.get("split", "")), float(d.get("split_share", 0.0)))


# A device's heat, in Apple's ``ProcessInfo.ThermalState`` words (Android's thermal status
# and Linux's thermal-zone trip points map onto them: node/device_state.py).
THERMAL_LEVELS = ("nominal", "fair", "serious", "critical")


@dataclass(frozen=True, slots=True)
class DeviceState:
    """What a node reports of its power and heat: the battery's charge (0-1; None on mains
    power or where unknown), whether it is charging, and its thermal level."""

    battery: float | None = None
    charging: bool = False
    thermal: str = "nominal"

    @property
    def heat(self) -> int:
        """The thermal level's rank (0 = nominal ... 3 = critical)."""
        return THERMAL_LEVELS.index(self.thermal) if self.thermal in THERMAL_LEVELS else 0

    def to_dict(self) -> dict[str, Any]:
        return {"battery": self.battery, "charging": self.charging, "thermal": self.thermal}


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the registry last heard of it (possibly a little stale)."""

    node_id: str
    tier: Tier
    models: tuple[ModelView, ...]
    queue_depth: int = 0
    inflight: int = 0
    workers: int = 1
    healthy: bool = True  # False when this router's circuit breaker to it is open
    age_s: float = 0.0  # how stale this entry is
    # Models whose *head* this node can run for a split plan (not served here), with the
    # head latencies of its own split profile in ``ModelView.splits``.
    heads: tuple[ModelView, ...] = ()
    # Language models this node answers chat requests with (the OpenAI API).
    language_models: tuple[LanguageModelView, ...] = ()
    state: DeviceState | None = None  # battery and heat, where the node reports them

    def model_for(self, task: str, version: str | None = None) -> ModelView | None:
        """The node's model for ``task``; with ``version``, one that serves that version
        (active or standby, see :meth:`ModelView.holds`)."""
        for model in self.models:
            if model.task == task and (version is None or model.holds(version)):
                return model
        return None


@dataclass(frozen=True, slots=True)
class LinkView:
    """A directed link as estimated from real traffic (seeded from the fleet's declaration)."""

    src: str
    dst: str
    rtt_ms: float
    bandwidth_mbit: float
    loss: float = 0.0


def _empty_counts() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The snapshot a policy decides over. Built by the node from its cached registry view,
    its link estimates and its circuit breakers; never mutated by a policy.

    ``upstream[n][tier]`` lists the nodes of ``tier`` that ``n`` can send to directly (its
    declared links), precomputed so a decision over hundreds of nodes stays cheap.
    ``outstanding`` is this router's own count of requests in flight to each node: live
    knowledge that the registry's heartbeat (up to a second old) does not have yet.
    ``day_s`` is when the snapshot was taken, in seconds after midnight UTC: prices that
    change with the hour are read at it.
    """

    self_id: str
    nodes: Mapping[str, NodeView]
    links: Mapping[tuple[str, str], LinkView]
    upstream: Mapping[str, Mapping[Tier, tuple[str, ...]]]
    outstanding: Mapping[str, int] = field(default_factory=_empty_counts)
    day_s: float = 0.0

    @classmethod
    def build(
        cls,
        self_id: str,
        nodes: Iterable[NodeView],
        links: Iterable[LinkView],
        outstanding: Mapping[str, int] | None = None,
        day_s: float = 0.0,
    ) -> ClusterView:
        """Index nodes and links; links to unknown (expired) nodes are dropped."""
        by_id = {n.node_id: n for n in nodes}
        link_map = {(l.src, l.dst): l for l in links if l.src in by_id and l.dst in by_id}
        grouped: dict[str, dict[Tier, list[str]]] = {}
        for src, dst in sorted(link_map):
            grouped.setdefault(src, {}).setdefault(by_id[dst].tier, []).append(dst)
        upstream = {
            src: MappingProxyType({tier: tuple(ids) for tier, ids in tiers.items()})
            for src, tiers in grouped.items()
        }
        return cls(
            self_id=self_id,
            nodes=MappingProxyType(by_id),
            links=MappingProxyType(link_map),
            upstream=MappingProxyType(upstream),
            # Wrapped, not copied: the router's live in-flight counts (read-only here).
            outstanding=MappingProxyType(outstanding if outstanding is not None else {}),
            day_s=day_s,
        )

    @property
    def me(self) -> NodeView:
        return self.nodes[self.self_id]

    def link(self, src: str, dst: str) -> LinkView | None:
        return self.links.get((src, dst))

    def upstream_of(self, node_id: str) -> tuple[NodeView, ...]:
        tiers = self.upstream.get(node_id, {})
        return tuple(self.nodes[n] for tier in sorted(tiers) for n in tiers[tier])


PlacementKind = Literal["local", "remote"]


class Placement(NamedTuple):
    """One place to try. ``escalate_below`` turns it into a cascade stage: an answer whose
    confidence is below it is passed on to the next placement of the plan.

    A NamedTuple rather than a dataclass: policies build several per request, and a frozen
    dataclass costs several times more to construct on that hot path.
    """

    kind: PlacementKind
    node_id: str
    tier: Tier
    model: str | None = None  # variant to run when local
    escalate_below: float | None = None
    est_ms: float = 0.0
    est_cost: float = 0.0
    est_accuracy: float = 0.0
    cut: str = ""    # a split plan: run ``model``'s head here up to this tensor, the tail there
    codec: str = ""  # the feature codec of a split plan (``tierlink.split.codecs``)


@dataclass(frozen=True, slots=True)
class Plan:
    """A ranked list of placements for one request, as a policy returns it.

    Execution (by the dispatcher): try ``placements[0]``; on failure fall back to the next;
    if a placement answers below its ``escalate_below`` confidence, escalate to the next and
    keep the answer in hand in case every later placement fails. An empty plan is a refusal
    and ``reason`` says why.
    """

    placements: tuple[Placement, ...]
    policy: str
    reason: str = ""
    hedge_after_ms: float | None = None
    respects_deadline: bool = True
    # A learning policy's context of the option it chose (``policy/bandit.py``): handed
    # back with the outcome's reward, so the policy itself keeps no per-request state.
    features: tuple[float, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.placements


@dataclass(frozen=True, slots=True)
class Fallback:
    """One thing that did not go to plan, recorded in the outcome and counted in a metric."""

    node_id: str
    reason: str  # "error", "timeout", "refused", "breaker_open", "low_confidence", ...
    detail: str = ""


_ZERO3 = (0.0, 0.0, 0.0)
COST_PARTS = ("compute", "transfer")


@dataclass(frozen=True, slots=True)
class Bill:
    """What an answer cost (USD), by tier and by part: the compute done at each tier, the
    bytes sent into each tier. ``usd`` is the total, summed in the order the parts were
    added (an upstream's bill, then the hop's transfer, then superseded answers)."""

    compute: tuple[float, float, float] = _ZERO3  # indexed by Tier
    transfer: tuple[float, float, float] = _ZERO3
    usd: float = 0.0

    @staticmethod
    def of_compute(tier: Tier, usd: float) -> Bill:
        parts = [0.0, 0.0, 0.0]
        parts[tier] = usd
        return Bill(tuple(parts), _ZERO3, usd)  # type: ignore[arg-type]

    @staticmethod
    def of_transfer(tier: Tier, usd: float) -> Bill:
        parts = [0.0, 0.0, 0.0]
        parts[tier] = usd
        return Bill(_ZERO3, tuple(parts), usd)  # type: ignore[arg-type]

    def __add__(self, other: Bill) -> Bill:
        return Bill((self.compute[0] + other.compute[0], self.compute[1] + other.compute[1],
                     self.compute[2] + other.compute[2]),
                    (self.transfer[0] + other.transfer[0], self.transfer[1] + other.transfer[1],
                     self.transfer[2] + other.transfer[2]), self.usd + other.usd)

    def items(self) -> list[tuple[Tier, str, float]]:
        """``(tier, part, usd)`` of each part that cost anything."""
        return [(tier, part, usd) for part, by_tier in zip(COST_PARTS, (self.compute,
                                                                      self.transfer),
                                                           strict=True)
                for tier, usd in zip(Tier, by_tier, strict=True) if usd]

    def to_wire(self) -> dict[str, dict[str, float]]:
        """``{"compute": {"device": usd, ...}, "transfer": {...}}``, non-zero parts only."""
        out: dict[str, dict[str, float]] = {}
        for tier, part, usd in self.items():
            out.setdefault(part, {})[tier.label] = usd
        return out

    @classmethod
    def from_wire(cls, raw: Mapping[str, Mapping[str, float]], usd: float) -> Bill:
        """What :meth:`to_wire` wrote; ``usd``: the total as it was summed."""
        parts = {p: [0.0, 0.0, 0.0] for p in COST_PARTS}
        if not isinstance(raw, Mapping):
            raise TypeError(f"a bill is a mapping of parts, got {raw!r}")
        for part, by_tier in raw.items():
            if part not in parts or not isinstance(by_tier, Mapping):
                raise ValueError(f"unknown cost part {part!r}: {by_tier!r}")
            for tier, value in by_tier.items():
                parts[part][Tier.parse(tier)] = float(value)
        return cls(tuple(parts["compute"]), tuple(parts["transfer"]), usd)  # type: ignore[arg-type]


NO_BILL = Bill()


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request was answered: by whom, along which path, at what cost."""

    served_by: str
    tier: Tier
    model: str
    path: tuple[str, ...]
    confidence: float
    escalations: int = 0
    fallbacks: tuple[Fallback, ...] = ()
    timings_ms: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    bill: Bill = NO_BILL  # what it cost, by tier: compute there, transfer into it
    degraded: str = ""  # why a lower-quality answer was returned, "" when none
    split: str = ""  # "CUT/CODEC" when a split plan answered (head here, tail upstream)
    model_version: str = ""  # the version of ``model`` that answered ("" when unknown)
    # The fleet routing revision under which the node the request entered placed it
    routing_revision: int = 0
    reason: str = ""  # why that node placed it so (its plan's reason)

    @property
    def cost(self) -> float:
        """What the answer cost in all (USD)."""
        return self.bill.usd
