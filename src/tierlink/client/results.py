"""What the application clients return: frozen dataclasses, no I/O.

* :class:`InferResult` — a synchronous answer: the output tensors and, for a routed request
  (a *task* name), the outcome the node reported (who served it, tier, path, confidence,
  cost, escalations, fallbacks, ...). A *model* name runs on the node called, unrouted: its
  answer carries only the outputs, the version that ran and the node's time.
* :class:`Accepted` — the ``202`` answer to an asynchronous request (``tierlink.async``):
  its result travels through the node's outbox to the control plane.
* :class:`AsyncResult` — that result, read from the control plane (``GET /v1/results/{key}``):
  per batch row the predicted class and its probability, plus the outcome.
* :class:`ModelMetadata`, :class:`TensorMetadata`, :class:`ModelEntry` — OIP model metadata
  and the repository index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from tierlink.core.types import Fallback, Tier


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class InferResult:
    """One synchronous answer.

    ``outputs`` are numpy arrays by output name (a routed answer: ``probabilities`` (B, C)
    and ``label`` (B,)); numeric arrays may be read-only views of the response body, so copy
    one before mutating it. The outcome fields are those of
    :class:`tierlink.core.types.Outcome` as the node sent them (``tierlink.*`` parameters);
    they are ``None`` / empty for a model endpoint's answer (``routed`` is False), which only
    says the version that ran and the node's time (``server_ms``).
    """

    model_name: str  # the task or model name the node answered for
    outputs: Mapping[str, np.ndarray]
    request_id: str | None = None
    model_version: str | None = None  # the version of the model that answered
    served_by: str | None = None  # the node whose model answered (routed answers)
    tier: Tier | None = None  # that node's tier
    model: str | None = None  # the model that answered a routed request
    path: tuple[str, ...] = ()  # nodes the request went through, the entry node first
    confidence: float | None = None  # calibrated top-class probability of the answer
    escalations: int = 0  # times a cascade sent it on for lack of confidence
    fallbacks: tuple[Fallback, ...] = ()  # placements that failed before this answer
    cost_usd: float | None = None  # compute and transfer cost along the path
    degraded: str = ""  # why a lower-quality answer was returned ("" when it was not)
    split_plan: str = ""  # "CUT/CODEC" when a split plan answered
    server_ms: float | None = None  # time the called node spent on it (queue + compute)
    timings_ms: Mapping[str, float] = field(default_factory=_empty)  # e.g. a split's head_ms
    uplink: str | None = None  # "up" | "down": the node's store-and-forward uplink
    parameters: Mapping[str, Any] = field(default_factory=_empty)  # every parameter, as sent

    @property
    def routed(self) -> bool:
        """Whether the node routed it (a task name) and reported an outcome."""
        return self.served_by is not None

    def __getitem__(self, name: str) -> np.ndarray:
        """The output tensor ``name`` (``result["probabilities"]``)."""
        return self.outputs[name]


@dataclass(frozen=True, slots=True)
class Accepted:
    """The ``202`` answer to an asynchronous request: the result is durably queued on the
    node (``uplink`` says whether the node could reach its upstream then) and will be stored
    at the control plane under ``result_key`` (``<node id>:<request id>``)."""

    request_id: str
    result_key: str
    uplink: str  # "up" | "down"
    status: str = "accepted"


@dataclass(frozen=True, slots=True)
class AsyncResult:
    """The result of an asynchronous request as the control plane stored it.

    ``predictions`` / ``confidences``: per batch row, the predicted class and its
    probability (the tensors themselves are not kept). ``node`` accepted the request;
    ``chain`` is every node the result passed through on its way to the control plane.
    """

    key: str
    request_id: str
    task: str
    node: str
    served_by: str
    tier: Tier
    model: str
    model_version: str | None
    path: tuple[str, ...]
    predictions: tuple[int, ...]
    confidences: tuple[float, ...]
    confidence: float
    escalations: int
    fallbacks: tuple[Fallback, ...]
    degraded: str
    split_plan: str
    latency_ms: float  # the accepting node's time on the request
    cost_usd: float
    uplink: str  # "up" | "down" when the node answered
    answered_at: float  # epoch seconds, the accepting node's clock
    received_at: float  # epoch seconds, the control plane's clock
    chain: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """One input or output of a model: name, OIP datatype, shape (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """``GET /v2/models/{name}``: a model's (or a routed task's) inputs and outputs.
    A task's ``platform`` is ``tierlink_router`` and its ``versions`` are empty."""

    name: str
    platform: str
    versions: tuple[str, ...]
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]
    parameters: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One line of the repository index: a model served here, or a task routed here
    (``reason`` is ``"routed task"``)."""

    name: str
    version: str
    state: str
    reason: str = ""


__all__ = ["Accepted", "AsyncResult", "InferResult", "ModelEntry", "ModelMetadata",
           "TensorMetadata"]
