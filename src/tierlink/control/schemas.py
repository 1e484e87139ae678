"""Wire schemas of the control plane: what a node sends in a heartbeat, what the registry returns.

A node heartbeats about once a second with a :class:`Heartbeat`; the registry answers
``GET /v1/nodes`` with :class:`NodeRecord` entries (the heartbeat plus what the registry
knows: when it first registered, when it was last heard of, how stale that is and which
incarnation of the node it is).

Forward compatibility: fields this version does not know are *kept*, not rejected, in an
``extra`` dict on the model they arrived in (top level, a model entry, a link), so a newer
node can add fields without breaking an older control plane, and they travel on to readers.
"""

from __future__ import annotations

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


class LinkSpec(_Open):
    """A directed link from the heartbeating node to ``dst``, as that node estimates it."""

    dst: NodeId
    rtt_ms: float = Field(ge=0.0)
    bandwidth_mbit: float = Field(gt=0.0)
    loss: float = Field(default=0.0, ge=0.0, le=1.0)


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
    queue_depth: int = Field(default=0, ge=0)
    inflight: int = Field(default=0, ge=0)
    workers: int = Field(default=1, ge=1)
    upstream: list[NodeId] = Field(default_factory=list)
    links: list[LinkSpec] = Field(default_factory=list)
    started_at: float = Field(ge=0.0)
    software: str = Field(default="", max_length=64)

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
    """

    registered_at: float
    last_seen: float
    age_s: float = Field(ge=0.0)
    generation: int = Field(ge=1)


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
