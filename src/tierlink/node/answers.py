"""What a node answers to the Open Inference Protocol, whatever carries it: an inference
request (a model run here, or a task routed by the fleet's policy), a model's metadata.

The REST routes (``node/app.py``) and the gRPC service (``node/grpc_api.py``) decode their
requests into :class:`oip.InferRequestData`, call :func:`answer`, and encode the
:class:`Answer` their own way: the same routing, parameters, errors and metrics on both.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect

from tierlink.core.types import Priority
from tierlink.errors import InvalidRequest, ModelNotFound, TensorError, TierlinkError
from tierlink.models.runtime import ModelRuntime
from tierlink.node import protocol
from tierlink.node.async_requests import UPLINK, is_async
from tierlink.node.deferred import no_state_dir
from tierlink.node.overload import OverloadGate
from tierlink.node.service import NodeService
from tierlink.transport import oip

__all__ = ["Answer", "answer", "metadata", "observed"]

T = TypeVar("T")

_ROUTED_OUTPUTS = [{"name": "probabilities", "datatype": "FP32", "shape": [-1, -1]},
                   {"name": "label", "datatype": "INT64", "shape": [-1]}]


@dataclass(frozen=True, slots=True)
class Answer:
    """An inference answer before its encoding: the tensors asked for and the response's
    parameters; or, for an asynchronous request, what its acceptance says (REST: 202)."""

    name: str
    version: str | None
    id: str | None
    outputs: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)
    accepted: dict[str, Any] | None = None


async def observed(service: NodeService, name: str, work: Callable[[], Awaitable[T]]) -> T:
    """``work`` counted in the node's request metrics under ``name`` and its outcome."""
    start = time.perf_counter()
    kind = "model" if name in service.runtimes else "task"
    outcome = "ok"
    try:
        return await work()
    except TierlinkError as exc:
        outcome = exc.code
        raise
    except ClientDisconnect:
        outcome = "client_disconnect"
        raise
    except Exception:
        outcome = "internal"
        raise
    finally:
        known = name in service.runtimes or name in service.tasks()
        service.exports.request(kind, name if known else "unknown", outcome,
                                time.perf_counter() - start)


async def answer(service: NodeService, name: str, version: str | None,
                 data: oip.InferRequestData, bind: Callable[[dict[str, Any]], dict[str, Any]],
                 gate: OverloadGate, judged: Priority | None) -> Answer:
    """``data`` for ``name``: a model this node serves runs here, a task is routed.
    ``bind`` ties a routed request's claims to its sender (TLS); ``judged`` is the priority
    the overload gate already let through by its header (REST), if any."""
    if name in service.runtimes:
        return await _infer_model(service, name, version, data)
    if name in service.tasks():
        return await _infer_task(service, name, version, data, bind(dict(data.parameters)),
                                 gate, judged)
    raise ModelNotFound(f"{name!r} is neither a model served by {service.spec.node_id} "
                        f"nor a task of the fleet",
                        hint=f"models: {sorted(service.runtimes)}; tasks: "
                             f"{sorted(service.tasks())}")


async def _infer_model(service: NodeService, name: str, version: str | None,
                       data: oip.InferRequestData) -> Answer:
    # A version in the URL, else the ``tierlink.version`` parameter, pins it.
    pinned = data.parameters.get(protocol.VERSION)
    version = version or (str(pinned) if pinned is not None else None)
    if is_async(dict(data.parameters)):  # refused, not silently answered synchronously
        raise InvalidRequest(f"{name!r} is a model: a model runs here and answers at once; "
                             "only a task is answered asynchronously",
                             hint=f"post to the task ({service.local.runtime(name, None).info.task!r})"
                                  " with tierlink.async, or drop tierlink.async")
    start = time.perf_counter()
    outputs, served, compute_ms = await service.infer_model(name, version, data.inputs,
                                                            data.parameters)
    # What this node spent (queue + compute): a caller's link estimate subtracts it; what
    # the model computed: a split's head bills the tail's compute at it.
    params = {protocol.SERVER_MS: round((time.perf_counter() - start) * 1000.0, 3),
              protocol.COMPUTE_MS: round(compute_ms, 3), protocol.MODEL_VERSION: served}
    return Answer(name, served, data.id, _select(outputs, data), params)


async def _infer_task(service: NodeService, task: str, version: str | None,
                      data: oip.InferRequestData, params: dict[str, Any],
                      gate: OverloadGate, judged: Priority | None) -> Answer:
    if version is not None:
        params.setdefault(protocol.VERSION, version)
    if is_async(params):  # answered once the result is durably queued upstream
        if service.asynchronous is None:
            raise no_state_dir(service.spec.node_id)
        accepted = await service.asynchronous.accept(task, data.inputs, params, data.id)
        return Answer(task, None, data.id, accepted=accepted)
    try:
        await _admit(gate, params, service.spec.node_id, judged)
        outputs, outcome, server_ms = await service.infer_task(task, data.inputs, params,
                                                               data.id)
    except TierlinkError as exc:
        service.exports.sla(task, params, None, exc.http_status)
        raise
    service.exports.sla(task, params, server_ms, 200, outcome)
    answered = protocol.outcome_params(outcome, server_ms)
    if service.uplink is not None:  # "up" / "down" toward the parent (store-and-forward)
        answered[UPLINK] = "down" if service.uplink.is_down() else "up"
    return Answer(task, None, data.id, _select(outputs, data), answered)


async def _admit(gate: OverloadGate, params: dict[str, Any], node_id: str,
                 judged: Priority | None) -> None:
    """The overload gate by the request's parameters, before anything is planned or run —
    unless ``ShedEarly`` already let this priority through by its hint header (a malformed
    priority or deadline is left to the request's own checks: a 400)."""
    try:
        priority = Priority.parse(params.get(protocol.PRIORITY, "interactive"))
        deadline_ms = float(params.get(protocol.DEADLINE, protocol.DEFAULT_DEADLINE_MS))
    except (ValueError, TypeError, AttributeError):
        return
    if priority != judged:
        await gate.admit(priority, deadline_ms, node_id)


def _select(outputs: dict[str, Any], data: oip.InferRequestData) -> dict[str, Any]:
    if not data.outputs:
        return outputs
    unknown = [o.name for o in data.outputs if o.name not in outputs]
    if unknown:
        raise TensorError(f"unknown output(s) {unknown}; this model has {sorted(outputs)}")
    return {o.name: outputs[o.name] for o in data.outputs}


def metadata(service: NodeService, name: str, version: str | None) -> dict[str, Any]:
    """A model's or a task's OIP metadata; ``ModelNotFound`` naming what is served."""
    if name in service.runtimes:
        rt: ModelRuntime = service.local.runtime(name, version)
        return {"name": name, "versions": list(service.models.versions(name)),
                "platform": rt.platform,
                "inputs": [s.to_dict() for s in rt.inputs],
                "outputs": [s.to_dict() for s in rt.outputs],
                "parameters": {"task": rt.info.task, "tier": service.spec.tier.label,
                               "kind": rt.info.spec_for(rt.outputs).kind,
                               "provider": getattr(rt, "provider", "")}}
    if name in service.tasks():
        local = next((rt for rt in service.runtimes.values() if rt.info.task == name), None)
        inputs = [s.to_dict() for s in local.inputs] if local else []
        return {"name": name, "versions": [], "platform": "tierlink_router",
                "inputs": inputs, "outputs": _routed_outputs(local),
                "parameters": {"routed": True}}
    raise ModelNotFound(f"no model or task {name!r} on {service.spec.node_id}",
                        hint=f"models: {sorted(service.runtimes)}; tasks: {sorted(service.tasks())}")


def _routed_outputs(rt: ModelRuntime | None) -> list[dict[str, Any]]:
    """What a routed answer carries: the answer tensors of the task's output kind."""
    if rt is None:
        return _ROUTED_OUTPUTS
    from tierlink.models.kind_registry import kind_of

    spec = rt.info.spec_for(rt.outputs)
    ranks = {o.name: len(o.shape) for o in rt.outputs}
    out = []
    for name, datatype, rank, role in kind_of(spec.kind).answers:
        source = spec.output(role) if role else None
        if role and source is None:
            if len(rt.outputs) != 1 or rank >= 0:
                continue  # an optional role the task does not declare: never answered
            source = rt.outputs[0].name  # the model's only output plays it
        if rank < 0:
            rank = ranks.get(source or "", 1)
        out.append({"name": name, "datatype": datatype, "shape": [-1] * rank})
    return out
