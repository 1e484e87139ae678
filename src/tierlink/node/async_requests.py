"""Asynchronous requests: answered ``202`` once the result is durably queued; the result
follows through the node's outbox.

A routed request (``POST /v2/models/{task}/infer``) with the parameter ``tierlink.async:
true`` is routed and answered like any other — a device whose uplink is down keeps
answering what it may answer locally — and then, instead of the outputs, the node:

1. builds the result (:func:`build_result_payload`: predictions, confidences, model,
   version, the node that served it, latency, and ``uplink``: ``up`` | ``down``, so every
   result says whether it was made while this node could not reach its upstream);
2. puts it into its :class:`~tierlink.node.uplink.Uplink` as a ``result`` item keyed
   :func:`result_key` (``<node id>:<request id>``), toward ``parent`` (or ``control`` when the
   node has no upstream); the put is fsynced before it returns;
3. answers ``202 {"request_id", "status": "accepted", "uplink": "up"|"down", "result_key"}``.

The result then travels device -> edge -> control plane, each hop acknowledging only once
it holds the item durably, and the control plane stores it once (``GET /v1/results/
{result_key}``). If the outbox refuses the item (full: results are never evicted) the
request is answered with that :class:`~tierlink.errors.OutboxError` (503): not accepted.

Keys are prefixed with the accepting node's id because request ids are the clients' choice:
two devices' request ``"1"`` must not be taken for one result at the control plane. A
repeated request id on one node is a client's retry: it is answered 202 again, and the
first result is the one delivered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from tierlink.core.types import Outcome
from tierlink.errors import InvalidRequest, TierlinkError
from tierlink.node.uplink import Uplink
from tierlink.telemetry import tracing

ASYNC = "tierlink.async"  # request parameter: true -> answered 202, result via the outbox
UPLINK = "tierlink.uplink"  # answer parameter a node may add to synchronous answers too
RESULT_KIND = "result"
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no", "")


def is_async(params: Mapping[str, Any]) -> bool:
    """Whether the request asks to be answered asynchronously (``tierlink.async``)."""
    value = params.get(ASYNC)
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise InvalidRequest(f"{ASYNC} must be true or false, got {value!r}",
                         hint=f"send \"{ASYNC}\": true to be answered 202 and get the result "
                              "from the control plane's /v1/results")


def result_key(node_id: str, request_id: str) -> str:
    """The idempotency key of a request's result (see the module doc)."""
    return f"{node_id}:{request_id}"


def build_result_payload(request_id: str, task: str, outputs: Mapping[str, Any],
                         outcome: Outcome, server_ms: float, *, node_id: str, uplink: str,
                         answered_at: float, model_version: str | None = None) -> dict[str, Any]:
    """The JSON result of an answered request. ``outputs`` are the routed path's
    ``probabilities`` (B, C) and ``label`` (B,) — or, for other output kinds, its tensors
    (``outputs``, as nested lists); ``server_ms`` is this node's time on it;
    ``model_version`` defaults to the outcome's (``Outcome.model_version``)."""
    predictions, confidences = _summary(outputs)
    # Other output kinds (boxes, values, vectors): the answer's tensors themselves.
    tensors = ({} if "probabilities" in outputs else
               {k: _plain(v) for k, v in outputs.items()})
    if model_version is None:  # the version that answered, when the outcome carries it
        model_version = str(getattr(outcome, "model_version", "") or "") or None
    return {
        "request_id": request_id, "task": task, "node": node_id,
        "served_by": outcome.served_by, "tier": outcome.tier.label, "model": outcome.model,
        "model_version": model_version, "path": list(outcome.path),
        "predictions": predictions, "confidences": confidences,
        "confidence": round(outcome.confidence, 6), "escalations": outcome.escalations,
        "fallbacks": [{"node": f.node_id, "reason": f.reason, "detail": f.detail}
                      for f in outcome.fallbacks],
        "degraded": outcome.degraded, "split_plan": outcome.split,
        "latency_ms": round(server_ms, 3), "cost_usd": outcome.cost,
        "uplink": uplink, "answered_at": answered_at,
        **({"outputs": tensors} if tensors else {}),
    }


def _plain(value: Any) -> Any:
    import numpy as np

    return np.asarray(value).tolist()


def _summary(outputs: Mapping[str, Any]) -> tuple[list[int], list[float]]:
    """Per batch row: the predicted class and its probability."""
    import numpy as np

    probs = outputs.get("probabilities")
    if probs is None:
        return [], []
    probs = np.atleast_2d(np.asarray(probs, dtype=np.float64))  # (B, C)
    labels = outputs.get("label")
    predicted = (np.asarray(labels).reshape(-1) if labels is not None
                 else probs.argmax(axis=1))  # (B,)
    return ([int(p) for p in predicted.tolist()],
            [round(float(c), 6) for c in probs.max(axis=1).tolist()])


class AsyncResults:
    """Queues the results of asynchronous requests on a node's :class:`Uplink` (see the
    module doc). ``clock``: wall time, stamped on each result as ``answered_at``."""

    def __init__(self, uplink: Uplink, *, clock: Callable[[], float] = time.time) -> None:
        self.uplink = uplink
        self._clock = clock

    @property
    def destination(self) -> str:
        """``parent``, or ``control`` on a node without an upstream."""
        return self.uplink.upstream

    async def accept(self, request_id: str, task: str, outputs: Mapping[str, Any],
                     outcome: Outcome, server_ms: float, *,
                     model_version: str | None = None) -> dict[str, Any]:
        """Queue the result durably; return the ``202`` body. Raises
        :class:`~tierlink.errors.OutboxError` when the outbox refuses it (not accepted)."""
        state = self.uplink.state(self.destination).state
        key = result_key(self.uplink.node_id, request_id)
        payload = build_result_payload(request_id, task, outputs, outcome, server_ms,
                                       node_id=self.uplink.node_id, uplink=state,
                                       answered_at=self._clock(), model_version=model_version)
        with tracing.stage("tierlink.outbox.store", {"tierlink.result_key": key,
                                                     "tierlink.uplink": state}):
            await self.uplink.put(RESULT_KIND, key, payload, self.destination)
        return accepted_body(request_id, key, state)


    async def refused(self, request_id: str, task: str, error: TierlinkError) -> None:
        """Queue, as the request's result, why it could not be answered (a deferred
        request that nothing could place when its time came: never dropped silently)."""
        key = result_key(self.uplink.node_id, request_id)
        payload = {"request_id": request_id, "task": task, "node": self.uplink.node_id,
                   "error": error.to_dict(), "answered_at": self._clock()}
        await self.uplink.put(RESULT_KIND, key, payload, self.destination)


def accepted_body(request_id: str, key: str, uplink: str) -> dict[str, Any]:
    """The ``202`` answer of an asynchronous request."""
    return {"request_id": request_id, "status": "accepted", "uplink": uplink,
            "result_key": key}


__all__ = ["ASYNC", "RESULT_KIND", "UPLINK", "AsyncResults", "accepted_body",
           "build_result_payload", "is_async", "result_key"]
