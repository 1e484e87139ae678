"""What travels with a request across hops, as OIP ``parameters``.

The parameters a node reads from a request are :data:`REQUEST_PARAMETERS` (all optional; a
client on the device may send none), those it writes into a routed answer
:data:`RESPONSE_PARAMETERS`: each with its type, default and meaning (the documentation's
reference page is generated from them; a unit test holds them to this module's parser). A
model endpoint's answer carries ``tierlink.server_ms`` (queue + compute on that node) and
``tierlink.model_version``, so a caller can tell network time from server time, and which
version answered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson

from tierlink.core.types import Bill, Fallback, Outcome, Priority, Privacy, Request, Tier
from tierlink.errors import InvalidRequest
from tierlink.transport.oip import pack_param, unpack_param

DEADLINE = "tierlink.deadline_ms"
PRIVACY = "tierlink.privacy"
PRIORITY = "tierlink.priority"
ORIGIN = "tierlink.origin"
HOPS = "tierlink.hops"
VERSION = "tierlink.version"
POLICY = "tierlink.policy"
MIRROR = "tierlink.mirror"  # set by a node mirroring an answer (routing/mirror.py)
ESCALATION = "tierlink.escalation"  # the sender holds an answer already: optional work
CUT = "tierlink.cut"  # a split plan's tail request: the features' tensor in the model
CODEC = "tierlink.codec"  # ...and how they are encoded (tierlink.split.codecs)
SPLIT = "tierlink.split"  # ask for a split plan: "NODE/CUT/CODEC" (benchmarks, tests)
LABEL = "tierlink.label"
MODEL_VERSION = "tierlink.model_version"  # in answers: the version of the model that ran
ROUTING_REVISION = "tierlink.routing_revision"  # in answers: the revision that placed it
REASON = "tierlink.reason"  # in answers: why the node it entered placed it so
SERVER_MS = "tierlink.server_ms"  # in answers: what the answering node spent on the request
COMPUTE_MS = "tierlink.compute_ms"  # in a model's answer: what the model itself computed
COST = "tierlink.cost"  # in answers: the cost by part and tier
TIMINGS = "tierlink.timings_ms"  # in answers: JSON of where the time went (split: head_ms...)
TRACEPARENT = "traceparent"

DEFAULT_DEADLINE_MS = 1000.0
MAX_DEADLINE_MS = 3_600_000.0
# An asynchronous request's (and what a node forwards of one): work that may wait for a
# cheaper price window (routing/deferral.py) may be given a week.
MAX_ASYNC_DEADLINE_MS = 7 * 86_400_000.0


class Parameter(NamedTuple):
    """One OIP parameter tierlink reads or writes: its name, type, default and meaning."""

    name: str
    type: str
    default: str  # "" when it has none (an answer's, or absent means "not asked for")
    meaning: str


REQUEST_PARAMETERS: tuple[Parameter, ...] = (
    Parameter(DEADLINE, "number (ms)", f"{DEFAULT_DEADLINE_MS:g}",
              "budget left, in ms, when the request was sent (at most "
              f"{MAX_DEADLINE_MS:,.0f}; an asynchronous request's at most "
              f"{MAX_ASYNC_DEADLINE_MS:,.0f}: it may wait for cheaper prices); a forwarding "
              "node sends what is left of it"),
    Parameter(PRIVACY, "local | site | any", "any, or the node's default_privacy",
              "how far the raw input may travel: ``local`` never leaves the origin device, "
              "``site`` the device or its site's edge, ``any`` anywhere; a node with "
              "``default_privacy: local`` fails closed"),
    Parameter(PRIORITY, "realtime | interactive | batch", "interactive",
              "queue order (realtime first); under overload the less urgent are shed first"),
    Parameter(ORIGIN, "string", "the receiving node",
              "node id of the device the input came from"),
    Parameter(HOPS, "integer >= 0", "0", "forwarding hops so far (set by forwarding nodes)"),
    Parameter(VERSION, "string", "",
              "pin a model version: only a model serving exactly this version answers (a "
              "canary in a node's standby slot counts)"),
    Parameter(POLICY, "string", "",
              "name a policy for this request (only if the fleet's "
              "``routing.allow_policy_override`` allows it)"),
    Parameter(MIRROR, "boolean", "false",
              "set by a node on a request it mirrors (``routing.mirror``): placed at the most "
              "capable model the request's privacy allows; refused from a client"),
    Parameter(ESCALATION, "boolean", "false",
              "the sender holds an answer already (a cascade's escalation, set by the node "
              "that escalates; an application with an answer of its own may set it too): a "
              "node whose queue is ``escalation_queue`` deep refuses it (``429``, "
              "``escalation_shed``) before work that has no answer yet"),
    Parameter(LABEL, "integer, or a JSON list of integers", "",
              "the true class index when the client knows it (an eval workload does): an int, "
              "or a list (as JSON text) per batch row; ``-1`` = unknown. Only the "
              "hard-example loop reads it"),
    Parameter("tierlink.async", "boolean", "false",
              "true: answered ``202`` once the result is durably queued toward the control "
              "plane, whose ``/v1/results`` serves it (tierlink.node.async_requests)"),
    Parameter(SPLIT, "NODE/CUT/CODEC", "",
              "ask for a split plan: the head here, the tail on NODE (benchmarks, tests)"),
    Parameter(CUT, "string", "",
              "a split plan's tail request (sent by the node that ran the head): the "
              "features' tensor in the model"),
    Parameter(CODEC, "string", "", "... and how the features are encoded "
              "(tierlink.split.codecs)"),
    Parameter(TRACEPARENT, "string", "", "W3C trace context"),
)

RESPONSE_PARAMETERS: tuple[Parameter, ...] = (
    Parameter("tierlink.served_by", "string", "", "the node that answered"),
    Parameter("tierlink.tier", "device | edge | cloud", "", "its tier"),
    Parameter("tierlink.model", "string", "", "the model that answered"),
    Parameter("tierlink.path", "JSON list", "", "the nodes the request went through"),
    Parameter("tierlink.confidence", "number", "", "the answer's confidence"),
    Parameter("tierlink.escalations", "integer", "",
              "times the request went upstream for low confidence"),
    Parameter("tierlink.fallbacks", "JSON list", "",
              "placements that failed and were replaced: ``{node, reason, detail}`` each"),
    Parameter("tierlink.cost_usd", "number", "", "what the answer cost (USD)"),
    Parameter(COST, "JSON object", "",
              "what it cost by part and tier: ``{\"compute\": {\"device\": usd, ...}, "
              "\"transfer\": {\"cloud\": usd}}`` (compute done at a tier, bytes sent into "
              "it; parts that cost nothing left out)"),
    Parameter(COMPUTE_MS, "number (ms)", "",
              "in a model's own answer (a model-addressed call, a split's tail): what the "
              "model computed, without the queue"),
    Parameter(SERVER_MS, "number (ms)", "",
              "what the answering node spent on the request (queue + compute)"),
    Parameter(TIMINGS, "JSON object", "",
              "where the time went, e.g. a split's ``head_ms``, ``encode_ms``, "
              "``tail_rtt_ms``, ``split_bytes`` and ``est_ms`` (the policy's estimate of "
              "what follows the head: encode + send + tail)"),
    Parameter("tierlink.degraded", "string", "",
              "why a lower-quality answer was returned (empty when none)"),
    Parameter("tierlink.split_plan", "CUT/CODEC", "", "when a split plan served it"),
    Parameter(MODEL_VERSION, "string", "", "the version of ``model`` that answered"),
    Parameter(ROUTING_REVISION, "integer", "",
              "the fleet routing revision under which the node the request entered placed it"),
    Parameter(REASON, "string", "",
              "why the node the request entered placed it so: its plan's reason, e.g. "
              "``cascade:edge``, or ``remote:edge (low battery: local compute spared)``"),
    Parameter("tierlink.uplink", "up | down", "",
              "whether the node's store-and-forward uplink delivers (on a node with one)"),
)


def parse_request(
    task: str, params: Mapping[str, Any], *, request_id: str, receiver: str, input_bytes: int,
    default_privacy: str = "any", asynchronous: bool = False,
) -> Request:
    """Build a ``Request`` from OIP parameters; a bad value is an ``InvalidRequest``. A
    request that names no privacy level takes ``default_privacy`` (the receiving node's);
    an ``asynchronous`` one may have the longer deadline."""
    hops = _int(params.get(HOPS, 0), HOPS)
    return Request(
        request_id=request_id,
        task=task,
        deadline_ms=_deadline(params.get(DEADLINE, DEFAULT_DEADLINE_MS), forwarded=hops > 0,
                              asynchronous=asynchronous),
        origin=str(params.get(ORIGIN) or receiver),
        privacy=_enum(Privacy.parse, params.get(PRIVACY, default_privacy), PRIVACY),
        priority=_enum(Priority.parse, params.get(PRIORITY, "interactive"), PRIORITY),
        input_bytes=input_bytes,
        version=str(params[VERSION]) if params.get(VERSION) is not None else None,
        hops=hops,
        policy=str(params[POLICY]) if params.get(POLICY) else None,
        mirror=_mirror(params.get(MIRROR, False), hops),
        escalation=_flag(params.get(ESCALATION, False), ESCALATION),
    )


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false, got {_short(value)}")
    return value


def _mirror(value: Any, hops: int) -> bool:
    if _flag(value, MIRROR) and hops == 0:
        raise InvalidRequest(f"{MIRROR} is set by the node that mirrors an answer, not by a "
                             "client", hint=f"leave {MIRROR} out; routing.mirror in the fleet "
                             "file sets how much is mirrored")
    return value


def parse_labels(params: Mapping[str, Any], batch: int) -> tuple[int, ...] | None:
    """The request's true labels (``tierlink.label``), one per batch row; None when absent.

    An int labels a batch of one; a batch needs a list of ``batch`` ints. ``-1`` = unknown.
    """
    value = unpack_param(params.get(LABEL))  # a list travels as its JSON text
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if len(values) != batch or not all(_is_label(v) for v in values):
        raise InvalidRequest(f"{LABEL} must be a class index >= -1 for a batch of one, or a "
                             f"list of {batch} such indices; got {_short(value)}",
                             hint="send the true class of each input, or -1 when unknown")
    return tuple(int(v) for v in values)


def _is_label(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= -1


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def forward_params(req: Request, deadline_ms: float, traceparent: str | None,
                   labels: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Parameters for the next hop: what is left of the deadline, one more hop (and the
    client's labels, so an upstream that escalates again can label its hard examples)."""
    params: dict[str, Any] = {
        DEADLINE: round(deadline_ms, 3),
        PRIVACY: req.privacy.value,
        PRIORITY: req.priority.label,
        ORIGIN: req.origin,
        HOPS: req.hops + 1,
    }
    if req.version:
        params[VERSION] = req.version
    if req.policy:
        params[POLICY] = req.policy
    if req.mirror:
        params[MIRROR] = True
    if req.escalation:
        params[ESCALATION] = True
    if traceparent:
        params[TRACEPARENT] = traceparent
    if labels is not None:
        params[LABEL] = labels[0] if len(labels) == 1 else pack_param(list(labels))
    return params


def outcome_params(outcome: Outcome, server_ms: float) -> dict[str, Any]:
    return {
        "tierlink.served_by": outcome.served_by,
        "tierlink.tier": outcome.tier.label,
        "tierlink.model": outcome.model,
        "tierlink.path": _json(list(outcome.path)),
        "tierlink.confidence": round(outcome.confidence, 6),
        "tierlink.escalations": outcome.escalations,
        "tierlink.fallbacks": _json([{"node": f.node_id, "reason": f.reason,
                                      "detail": f.detail} for f in outcome.fallbacks]),
        "tierlink.cost_usd": outcome.cost,
        COST: _json(outcome.bill.to_wire()),
        SERVER_MS: round(server_ms, 3),
        TIMINGS: _json({k: round(v, 3) for k, v in outcome.timings_ms.items()}),
        "tierlink.degraded": outcome.degraded,
        "tierlink.split_plan": outcome.split,
        MODEL_VERSION: outcome.model_version,
        ROUTING_REVISION: outcome.routing_revision,
        REASON: outcome.reason,
    }


def _json(value: Any) -> str:
    """A parameter's JSON text (orjson: compact, a fifth of the stdlib's time per answer)."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def parse_outcome(params: Mapping[str, Any]) -> Outcome:
    """Rebuild an upstream's outcome from its response parameters."""
    try:
        return Outcome(
            served_by=str(params["tierlink.served_by"]),
            tier=Tier.parse(str(params["tierlink.tier"])),
            model=str(params["tierlink.model"]),
            path=tuple(orjson.loads(params["tierlink.path"])),
            confidence=float(params["tierlink.confidence"]),
            escalations=int(params.get("tierlink.escalations", 0)),
            fallbacks=tuple(Fallback(f["node"], f["reason"], f.get("detail", ""))
                            for f in orjson.loads(params.get("tierlink.fallbacks", "[]"))),
            bill=Bill.from_wire(orjson.loads(params.get(COST, "{}")),
                                float(params.get("tierlink.cost_usd", 0.0))),
            degraded=str(params.get("tierlink.degraded", "")),
            split=str(params.get("tierlink.split_plan", "")),
            model_version=str(params.get(MODEL_VERSION, "")),
            routing_revision=int(params.get(ROUTING_REVISION, 0)),
            reason=str(params.get(REASON, "")),
            timings_ms={"server_ms": float(params.get(SERVER_MS, 0.0))},
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise InvalidRequest(f"upstream response lacks routing parameters: {exc}") from exc


def _deadline(value: Any, *, forwarded: bool, asynchronous: bool = False) -> float:
    """The budget in ms. From an application (no hops yet), a non-positive one is the
    caller's mistake; a forwarded request may arrive with its budget spent (the node then
    answers ``504``, as for any request out of time). An asynchronous request (and what is
    forwarded: its entry node judged it) may have up to a week."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise InvalidRequest(f"{DEADLINE} must be a number of milliseconds, got {value!r}") from None
    limit = MAX_ASYNC_DEADLINE_MS if asynchronous or forwarded else MAX_DEADLINE_MS
    if math.isnan(out) or out > limit or (out <= 0 and not forwarded):
        hint = f"a number of milliseconds in (0, {limit:g}]" + (
            "" if limit == MAX_ASYNC_DEADLINE_MS else
            f"; up to {MAX_ASYNC_DEADLINE_MS:g} for a request sent with tierlink.async")
        raise InvalidRequest(f"{DEADLINE} = {value!r} is not a usable deadline", hint=hint)
    return out


def _enum(parse: Any, value: Any, name: str) -> Any:
    try:
        return parse(value)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"{name}: {exc}") from None


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise InvalidRequest(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)
