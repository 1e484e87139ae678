"""Wire schemas of the control plane: what a node sends in a heartbeat, what the registry returns.

A node heartbeats about once a second with a :class:`Heartbeat`; the registry answers
``GET /v1/nodes`` with :class:`NodeRecord` entries (the heartbeat plus what the registry
knows: when it first registered, when it was last heard of, how stale that is and which
incarnation of the node it is).

Nodes post inputs they escalated for low confidence as a :class:`HardExampleBatch`; the
store lists them as :class:`HardExampleRecord` (metadata only, never the tensor).

Forward compatibility: fields this version does not know are *kept*, not rejected, in an
``extra`` dict on the model they arrived in (top level, a model entry, a link), so a newer
node can add fields without breaking an older control plane, and they travel on to readers.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

NODE_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
"""A stable node ID: lower-case letters, digits, ``.``, ``_``, ``-``; 1..63 characters."""

NodeId = Annotated[str, StringConstraints(pattern=NODE_ID_PATTERN)]
TierName = Literal["device", "edge", "cloud"]
LabelKey = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9._-]{0,62}$")]
LabelValue = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{0,63}$")]


class _Open(BaseModel):
    """Base for wire models: unknown fields go to ``extra`` instead of failing validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _collect_unknown(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data  # pydantic reports the type error, naming the field
        known = set(cls.model_fields)
        unknown = {k: v for k, v in data.items() if k not in known}
        if not unknown:
            return data
        kept = {k: v for k, v in data.items() if k in known}
        given = kept.get("extra")
        kept["extra"] = {**(given if isinstance(given, dict) else {}), **unknown}
        return kept


class CascadePointSpec(_Open):
    """On the calibration split: answering when confidence >= ``threshold``."""

    threshold: float = Field(ge=0.0, le=1.0)
    answered_share: float = Field(ge=0.0, le=1.0)
    answered_accuracy: float = Field(ge=0.0, le=1.0)


class CodecPointSpec(_Open):
    """One codec measured at one cut (see ``core.types.CodecPoint``)."""

    codec: str = Field(min_length=1, max_length=64)
    wire_bytes: int = Field(ge=0)
    encode_ms: float = Field(ge=0.0)
    decode_ms: float = Field(ge=0.0)


class SplitPointSpec(_Open):
    """One profiled cut of a model on the heartbeating node (see ``core.types.SplitPoint``)."""

    cut: str = Field(min_length=1, max_length=256)
    head_ms: float = Field(ge=0.0)
    tail_ms: float = Field(ge=0.0)
    feature_bytes: int = Field(ge=0)
    codecs: list[CodecPointSpec] = Field(default_factory=list, max_length=32)
    continue_share: float = Field(default=1.0, ge=0.0, le=1.0)


class ModelSpec(_Open):
    """One model variant a node serves, with the figures its model card and profile give."""

    model_config = ConfigDict(coerce_numbers_to_str=True)  # "version": 1 is meant as "1"

    name: str = Field(min_length=1, max_length=128)
    task: str = Field(min_length=1, max_length=128)
    version: str = Field(min_length=1, max_length=64)
    accuracy: float = Field(ge=0.0, le=1.0)
    latency_ms: float = Field(ge=0.0)
    output_bytes: int = Field(default=64, ge=0)
    cascade: list[CascadePointSpec] = Field(default_factory=list)
    splits: list[SplitPointSpec] = Field(default_factory=list, max_length=512)
    # Rollouts (defaults keep older nodes valid): the A/B slot this version sits in, the
    # share of the node's requests for ``name`` it serves now (active = 1 - standby), and
    # its counters (``VersionStatsBook.get``; decoded by the rollout controller, which
    # skips a malformed one instead of refusing the node's heartbeat).
    role: Literal["active", "standby"] = "active"
    weight: float = Field(default=1.0, ge=0.0, le=1.0)
    stats: dict[str, Any] | None = None


class LanguageModelSpec(_Open):
    """A language model a node answers chat with (``LanguageModelView.to_dict``)."""

    name: str = Field(min_length=1, max_length=128)
    tasks: list[str] = Field(default_factory=list, max_length=64)
    quality: float | None = Field(default=None, ge=0.0, le=1.0)
    context: int = Field(default=8192, ge=1)
    prefill_tok_s: float = Field(default=100.0, gt=0.0)
    decode_tok_s: float = Field(default=10.0, gt=0.0)
    batch_slowdown: float = Field(default=0.1, ge=0.0)
    running: int = Field(default=0, ge=0)
    queued: int = Field(default=0, ge=0)
    max_sequences: int = Field(default=16, ge=1)
    verifier: str = Field(default="", max_length=300)
    acceptance: float = Field(default=0.7, ge=0.0, le=1.0)
    price_per_1k: float = Field(default=0.0, ge=0.0)
    identity: str = Field(default="", max_length=300)


class LinkSpec(_Open):
    """A directed link from the heartbeating node to ``dst``, as that node estimates it."""

    dst: NodeId
    rtt_ms: float = Field(ge=0.0)
    bandwidth_mbit: float = Field(gt=0.0)
    loss: float = Field(default=0.0, ge=0.0, le=1.0)


Count = Annotated[int, Field(ge=0)]


class Traffic(_Open):
    """Cumulative counts of the routed requests that entered the fleet at the node, since
    it started (a restart starts them again): SLA results, answers by the tier that gave
    them, requests that escalated. The fleet view makes rates of them."""

    met: Count = 0
    missed: Count = 0
    refused: Count = 0
    failed: Count = 0
    invalid: Count = 0
    served: dict[TierName, Count] = Field(default_factory=dict)
    escalated: Count = 0


class ProcessResources(_Open):
    """The node process's own resources at the heartbeat (``telemetry/process.py``): CPU
    seconds since it started, resident memory, open files. The fleet view makes a CPU
    share of the first."""

    cpu_seconds: float = Field(ge=0.0)
    resident_bytes: Count
    open_fds: Count


class DeviceStateIn(_Open):
    """A node's battery and heat (``node/device_state.py``): placement spares the compute
    of a node low on battery or hot (``routing.device_state``)."""

    battery: float | None = Field(default=None, ge=0.0, le=1.0)
    charging: bool = False
    thermal: Literal["nominal", "fair", "serious", "critical"] = "nominal"


class Heartbeat(_Open):
    """The body of ``POST /v1/nodes/{node_id}/heartbeat``: a node's full current state.

    Every heartbeat replaces the previous one (no partial updates), so a lost heartbeat
    costs nothing but staleness. ``started_at`` (the node process's start time, epoch
    seconds) identifies an incarnation: a new value means the node restarted.
    """

    node_id: NodeId
    tier: TierName
    address: str = Field(pattern=r"^https?://[^\s/]+", max_length=512)
    models: list[ModelSpec] = Field(default_factory=list)
    language_models: list[LanguageModelSpec] = Field(default_factory=list)
    queue_depth: int = Field(default=0, ge=0)
    inflight: int = Field(default=0, ge=0)
    workers: int = Field(default=1, ge=1)
    upstream: list[NodeId] = Field(default_factory=list)
    links: list[LinkSpec] = Field(default_factory=list)
    started_at: float = Field(ge=0.0)
    software: str = Field(default="", max_length=64)
    # Where the node is (site, region, ...): peers pick their upstreams by these.
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=16)
    # {model name: {version: error}}: versions a rollout asked for that failed to install
    # (refused verification, failed or crashed on load); listed until no longer asked for.
    install_failures: dict[str, dict[str, str]] = Field(default_factory=dict)
    traffic: Traffic = Field(default_factory=Traffic)
    breakers_open: list[NodeId] = Field(default_factory=list, max_length=4096)
    outbox_pending: Count = 0  # items waiting in its store-and-forward outbox
    # The fleet routing revision the node places requests under (0: its spec file's, not
    # one the control plane handed out; control/routing_revisions.py)
    routing_revision: Count = 0
    process: ProcessResources | None = None  # absent where the platform has no /proc
    device_state: DeviceStateIn | None = None  # absent where nothing reports it

    @model_validator(mode="after")
    def _no_duplicates(self) -> Heartbeat:
        # Raised at model level, so each message starts with the field it is about.
        variants = [(m.name, m.version) for m in self.models]
        if len(set(variants)) != len(variants):
            raise ValueError("models: the same (name, version) is listed twice")
        dsts = [link.dst for link in self.links]
        if len(set(dsts)) != len(dsts):
            raise ValueError("links: the same dst is listed twice")
        if self.node_id in dsts or self.node_id in self.upstream:
            raise ValueError("links/upstream: a node cannot name itself as a destination")
        return self


class NodeRecord(Heartbeat):
    """A registry entry: the node's last heartbeat plus the registry's own bookkeeping.

    ``generation`` starts at 1 and grows by one each time the node re-registers after it
    expired or was deregistered, or restarts (a heartbeat with a new ``started_at``).
    Readers reset what they learnt about a node (breakers, link estimates) when it changes.
    ``age_s`` is how long before the response was made the registry last heard from it.
    ``draining``: an operator drained it; peers send it no new work (it finishes what it
    holds and keeps heartbeating).
    """

    registered_at: float
    last_seen: float
    age_s: float = Field(ge=0.0)
    generation: int = Field(ge=1)
    draining: bool = False


# Bytes per element of the numeric OIP datatypes a hard example's input may have.
ITEM_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2,
              "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}
TensorDatatype = Literal["BOOL", "UINT8", "INT8", "UINT16", "INT16", "FP16", "UINT32", "INT32",
                         "FP32", "UINT64", "INT64", "FP64"]
MAX_TENSOR_BYTES = 16 * 1024 * 1024  # one input row; a Fashion-MNIST image is 3136 bytes


class TensorIn(BaseModel):
    """One tensor on the wire: base64 of its raw little-endian bytes, datatype and shape.
    Valid only when the bytes are exactly ``prod(shape) x bytes per element``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    datatype: TensorDatatype
    shape: list[Annotated[int, Field(ge=0)]] = Field(max_length=8)
    data: str

    @model_validator(mode="after")
    def _size_matches(self) -> TensorIn:
        want = math.prod(self.shape) * ITEM_BYTES[self.datatype]
        if want > MAX_TENSOR_BYTES:
            raise ValueError(f"shape {self.shape} of {self.datatype} is {want} bytes, more "
                             f"than the {MAX_TENSOR_BYTES} allowed per example")
        got = len(self.raw())
        if got != want:
            raise ValueError(f"data is {got} bytes, but {self.datatype} {self.shape} needs "
                             f"{want} (base64 of the raw little-endian bytes)")
        return self

    def raw(self) -> bytes:
        try:
            return base64.b64decode(self.data, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("data is not valid base64") from None


class HardExampleIn(_Open):
    """An input a node escalated for low confidence, as the node sends it.

    ``privacy`` is never ``local``: such inputs may not leave their device, so the store
    refuses them even if a node were to send one."""

    request_id: str = Field(min_length=1, max_length=128)
    row: int = Field(default=0, ge=0)  # index in the request's batch
    node_id: NodeId
    model: str = Field(min_length=1, max_length=128)
    task: str = Field(min_length=1, max_length=128)
    privacy: Literal["site", "any"]
    prediction: int = Field(ge=0)
    confidence: float = Field(ge=0.0, le=1.0)
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    label: int = Field(default=-1, ge=-1)  # -1: unknown
    created_at: float = Field(ge=0.0)  # epoch seconds, at the node
    input: TensorIn


class HardExampleBatch(BaseModel):
    """The body of ``POST /v1/hard-examples``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    examples: list[HardExampleIn] = Field(min_length=1, max_length=1024)


class HardExampleRecord(BaseModel):
    """A stored hard example's metadata (``GET /v1/hard-examples``). ``id`` grows with
    every insert and is never reused, so ``after_id`` pages are stable under eviction."""

    model_config = ConfigDict(frozen=True)

    id: int
    request_id: str
    row: int
    node_id: str
    model: str
    task: str
    privacy: str
    prediction: int
    confidence: float
    threshold: float | None
    label: int
    created_at: float
    received_at: float
    datatype: str
    shape: list[int]


def format_validation_error(exc: ValidationError, *, what: str) -> str:
    """One line naming every bad field, e.g.
    ``invalid heartbeat: models[0].accuracy: Input should be less than or equal to 1 (got 1.5)``.
    """
    return format_error_list(exc.errors(), what=what)


def format_error_list(errors: Sequence[Any], *, what: str, strip_first: bool = False) -> str:
    """:func:`format_validation_error` over pydantic-style error dicts; ``strip_first`` drops
    the leading ``body``/``path`` element FastAPI puts in front of each location."""
    parts = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        where = _location(loc[1:] if strip_first else loc)
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        got = err.get("input")
        if where and not isinstance(got, (dict, list)) and err.get("type") != "missing":
            message += f" (got {_short(got)})"
        parts.append(f"{where}: {message}" if where else message)
    return f"invalid {what}: " + "; ".join(parts)


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EnrollIn(BaseModel):
    """``POST /v1/enroll``: a node asks for a credential with an operator's token."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str = Field(min_length=16, max_length=256)
    node_id: NodeId
    tier: TierName


class TokenIn(BaseModel):
    """``POST /v1/enrollment-tokens``: lifetime (None: no expiry) and uses (None: any)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl_s: float | None = Field(default=None, gt=0)
    uses: int | None = Field(default=None, ge=1)
    note: str = Field(default="", max_length=256)


class RolloutIn(BaseModel):
    """``POST /v1/rollouts``: roll ``version`` of model ``name`` out to ``tier``.

    ``stages`` (shares of the tier's traffic, increasing, ending at 1) or ``canary`` (the
    first stage's share; then 50% if that is still far, then all), not both; neither: 10%,
    50%, 100%. ``previous``: the version to compare with and roll back to (default: the one
    most of the tier's nodes report active). ``cohorts``: label selectors, rolled out one
    after another (each a rollout with its own stages and gates; a cohort that fails rolls
    back alone), or ``selector``: one cohort. Omitted fields take
    :class:`tierlink.rollout.RolloutSpec`'s defaults, which also validates the values."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    name: str = Field(min_length=1, max_length=128)
    version: str = Field(min_length=1, max_length=64)
    tier: TierName
    previous: str | None = Field(default=None, min_length=1, max_length=64)
    stages: list[float] | None = Field(default=None, min_length=1, max_length=16)
    canary: float | None = Field(default=None, gt=0.0, le=1.0)
    soak_s: float | None = Field(default=None, ge=0.0)
    gates: dict[str, int | float] | None = None
    min_requests: int | None = Field(default=None, ge=1)
    deploy_timeout_s: float | None = Field(default=None, gt=0.0)
    max_soak_s: float | None = Field(default=None, ge=0.0)
    insufficient_data: Literal["hold", "promote", "rollback"] | None = None
    fail_fast: bool | None = None
    cohorts: list[dict[LabelKey, LabelValue]] | None = Field(default=None, min_length=1,
                                                             max_length=32)
    selector: dict[LabelKey, LabelValue] | None = None


class RolloutActionIn(BaseModel):
    """``POST /v1/rollouts/{id}/pause|resume|promote|rollback``: why (goes into the log)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str | None = Field(default=None, max_length=500)
