"""What both application clients send and how they read the answers — no I/O.

Every public method of :class:`~tierlink.client.Client` and
:class:`~tierlink.client.AsyncClient` builds a :class:`Call` here (method, URL, body, headers
and the parser of its answer), sends it with its own ``httpx`` pool, and hands the
:class:`Reply` to ``call.parse``. So the synchronous and the asynchronous client differ only
in how they wait, and this module is tested without a network.

Requests (see :mod:`tierlink.node.protocol` for what a node reads):

* inference: ``POST {node}/v2/models/{name}[/versions/{v}]/infer``, the inputs as OIP
  binary tensors, all outputs asked for as binary data, the options as ``tierlink.*``
  parameters (``deadline_ms``, ``privacy``, ``priority``; ``async`` for an asynchronous
  request). A version goes in the URL, which pins it for a model and a task alike.
* results of asynchronous requests: ``GET {control}/v1/results/{key}`` — the node does not
  keep them; it queues each result toward the control plane, which stores it once. Reading
  results is for operators: the call carries ``Authorization: Bearer admin:<token>`` unless
  the control plane runs ``--open``.

Answers: a 2xx body is decoded into the dataclasses of :mod:`tierlink.client.results`; a
malformed one raises :class:`~tierlink.errors.UpstreamError` (node) or
:class:`~tierlink.errors.ControlPlaneError` (control plane). Any other status raises the
error the server named with its ``code``, rebuilt by
:func:`~tierlink.errors.error_from_dict` with the server's message and ``hint`` and
``details["url"]`` / ``details["status"]`` added — e.g. 404 ``model_not_found`` ->
:class:`~tierlink.errors.ModelNotFound`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import numpy as np
from numpy.typing import ArrayLike

from tierlink.client.results import (
    Accepted,
    AsyncResult,
    InferResult,
    ModelEntry,
    ModelMetadata,
    TensorMetadata,
)
from tierlink.core.types import Fallback, Priority, Privacy, Tier
from tierlink.errors import (
    ConfigError,
    ControlPlaneError,
    InvalidRequest,
    TierlinkError,
    UpstreamError,
    error_from_dict,
)
from tierlink.node import protocol
from tierlink.transport import oip

T = TypeVar("T")
# The model's single input as an array, or every input by name.
Inputs = np.ndarray | Mapping[str, ArrayLike]

NODE, CONTROL = "node", "control plane"  # who a Call talks to: which error a failure is
# The node's names (tierlink.node.async_requests; not imported: it loads the outbox).
ASYNC = "tierlink.async"
UPLINK = "tierlink.uplink"
RESULT_NOT_FOUND = "result_not_found"  # the control plane's 404 for a result not arrived (yet)
_OUTCOME = "tierlink."  # prefix of the outcome parameters (protocol.outcome_params)


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer read whole: status, headers (case-insensitive mapping), body."""

    status: int
    headers: Mapping[str, str]
    content: bytes


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One HTTP exchange to make, and how to read its answer. ``target`` (:data:`NODE` or
    :data:`CONTROL`) decides which error a failure to connect becomes; ``timeout_s`` None
    means the client's default."""

    method: str
    url: str
    target: str
    parse: Callable[[Reply], T]
    content: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class InferOptions:
    """The options of one inference request, validated once (see :meth:`make`)."""

    deadline_ms: float | None = None
    privacy: Privacy | None = None
    priority: Priority | None = None
    version: str | None = None
    request_id: str | None = None
    outputs: tuple[str, ...] | None = None
    parameters: Mapping[str, oip.Scalar] = field(default_factory=lambda: MappingProxyType({}))
    timeout_s: float | None = None

    @classmethod
    def make(cls, *, deadline_ms: float | None = None, privacy: Privacy | str | None = None,
             priority: Priority | str | None = None, version: str | None = None,
             request_id: str | None = None, outputs: Sequence[str] | None = None,
             parameters: Mapping[str, Any] | None = None,
             timeout_s: float | None = None) -> InferOptions:
        """Check the caller's arguments; a bad one is an :class:`InvalidRequest` naming it.
        ``parameters`` are extra OIP parameters (e.g. ``tierlink.label``, ``traceparent``);
        lists and dicts travel as JSON text (:func:`tierlink.transport.oip.pack_param`)."""
        return cls(
            deadline_ms=_positive("deadline_ms", deadline_ms),
            privacy=_parsed("privacy", Privacy.parse, privacy),
            priority=_parsed("priority", Priority.parse, priority),
            version=None if version is None else str(version),
            request_id=request_id,
            outputs=None if outputs is None else tuple(outputs),
            parameters=MappingProxyType(_extra_parameters(parameters or {})),
            timeout_s=_positive("timeout_s", timeout_s),
        )


def _positive(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise InvalidRequest(f"{name} must be a number > 0, got {value!r}")
    return number


def _parsed(name: str, parse: Callable[[Any], T], value: Any) -> T | None:
    if value is None:
        return None
    try:
        return parse(value)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"{name}: {exc}") from None


def _extra_parameters(parameters: Mapping[str, Any]) -> dict[str, oip.Scalar]:
    if ASYNC in parameters:
        raise InvalidRequest(f"pass asynchronous=True instead of the parameter {ASYNC}",
                             hint="infer(..., asynchronous=True) returns the 202 answer")
    return {str(k): oip.pack_param(v) for k, v in parameters.items()}


# ----------------------------------------------------------------------------- inference


def named_tensors(inputs: Mapping[str, ArrayLike]) -> dict[str, np.ndarray]:
    """Every input by name, as numpy arrays."""
    if not inputs:
        raise InvalidRequest("inputs is empty: pass an array or a dict {input name: array}")
    return {str(name): np.asarray(value) for name, value in inputs.items()}


def single_input(meta: ModelMetadata) -> str:
    """The name of the only input of ``meta``: what a bare array is sent as."""
    if len(meta.inputs) != 1:
        names = [t.name for t in meta.inputs]
        raise InvalidRequest(f"{meta.name!r} has {len(names)} inputs {names}, not one: an "
                             f"array alone cannot say which it is",
                             hint="pass inputs as a dict {input name: array}")
    return meta.inputs[0].name


def request_parameters(opts: InferOptions) -> dict[str, oip.Scalar]:
    """The ``tierlink.*`` parameters of a request (the node's defaults for what is unset)."""
    params: dict[str, oip.Scalar] = dict(opts.parameters)
    if opts.deadline_ms is not None:
        params[protocol.DEADLINE] = opts.deadline_ms
    if opts.privacy is not None:
        params[protocol.PRIVACY] = opts.privacy.value
    if opts.priority is not None:
        params[protocol.PRIORITY] = opts.priority.label
    return params


def infer_call(base_url: str, name: str, tensors: Mapping[str, np.ndarray],
               opts: InferOptions) -> Call[InferResult]:
    """A synchronous inference request for a task or a model."""
    return _infer_call(base_url, name, tensors, opts, {}, parse_answer)


def submit_call(base_url: str, name: str, tensors: Mapping[str, np.ndarray],
                opts: InferOptions) -> Call[Accepted]:
    """An asynchronous request (``tierlink.async``): answered ``202``, see :class:`Accepted`."""
    return _infer_call(base_url, name, tensors, opts, {ASYNC: True},
                       partial(parse_accepted, name=name))


def _infer_call(base_url: str, name: str, tensors: Mapping[str, np.ndarray],
                opts: InferOptions, extra: Mapping[str, oip.Scalar],
                parse: Callable[..., T]) -> Call[T]:
    params = {**request_parameters(opts), **extra}
    body, headers = oip.encode_infer_request(
        tensors, params, None if opts.outputs is None else list(opts.outputs),
        binary_inputs=True, binary_outputs=True, request_id=opts.request_id)
    url = model_url(base_url, name, opts.version) + "/infer"
    return Call("POST", url, NODE, partial(parse, url=url), body, headers, opts.timeout_s)


def model_url(base_url: str, name: str, version: str | None) -> str:
    url = f"{base_url}/v2/models/{quote(name, safe='')}"
    return url if version is None else f"{url}/versions/{quote(version, safe='')}"


def parse_answer(reply: Reply, *, url: str) -> InferResult:
    """A ``200`` inference answer: outputs, and the outcome when the node routed it."""
    _check_status(reply, url)
    try:
        header = oip.parse_header_length(reply.headers.get(oip.HEADER_LENGTH))
        data = oip.decode_infer_response(reply.content, header)
        return _result(data)
    except (TierlinkError, KeyError, ValueError, TypeError) as exc:
        raise _malformed(url, NODE, "inference answer", exc) from exc


def _result(data: oip.InferResponseData) -> InferResult:
    params = data.parameters
    version = params.get(protocol.MODEL_VERSION) or data.model_version
    server_ms = params.get(protocol.SERVER_MS)
    uplink = params.get(UPLINK)
    return InferResult(
        model_name=data.model_name, outputs=MappingProxyType(dict(data.outputs)),
        request_id=data.id, model_version=None if version is None else str(version),
        server_ms=None if server_ms is None else float(server_ms),
        timings_ms=MappingProxyType(_timings(params.get(protocol.TIMINGS))),
        uplink=None if uplink is None else str(uplink),
        parameters=MappingProxyType(dict(params)), **_outcome_fields(params))


def _outcome_fields(params: Mapping[str, Any]) -> dict[str, Any]:
    """The outcome of a routed answer (``protocol.outcome_params``); {} for a model's."""
    if f"{_OUTCOME}served_by" not in params:
        return {}

    def get(key: str, default: Any = None) -> Any:
        return params.get(_OUTCOME + key, default)

    return {
        "served_by": str(get("served_by")), "tier": Tier.parse(str(get("tier"))),
        "model": str(get("model")), "path": tuple(str(n) for n in _json(get("path", "[]"))),
        "confidence": float(get("confidence")), "escalations": int(get("escalations", 0)),
        "fallbacks": _fallbacks(_json(get("fallbacks", "[]"))),
        "cost_usd": float(get("cost_usd", 0.0)), "degraded": str(get("degraded") or ""),
        "split_plan": str(get("split_plan") or ""),
    }


def _json(value: Any) -> Any:
    """A parameter that travels as JSON text (lists, dicts); already decoded is fine too."""
    return json.loads(value) if isinstance(value, str) else value


def _fallbacks(items: Any) -> tuple[Fallback, ...]:
    return tuple(Fallback(str(f["node"]), str(f["reason"]), str(f.get("detail", "")))
                 for f in items)


def _timings(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    return {str(k): float(v) for k, v in dict(_json(value)).items()}


def parse_accepted(reply: Reply, *, url: str, name: str) -> Accepted:
    """The ``202`` answer of an asynchronous request. A ``200`` means the node ran it
    synchronously (a model name: only tasks are answered asynchronously)."""
    _check_status(reply, url)
    if reply.status != 202:
        raise InvalidRequest(
            f"{name!r} answered at once (HTTP {reply.status}), not 202: only a task is "
            f"answered asynchronously, a model name runs on the node called",
            hint="send asynchronous requests to a task name (e.g. 'fmnist')", url=url)
    try:
        doc = _json_object(reply.content)
        return Accepted(str(doc["request_id"]), str(doc["result_key"]), str(doc["uplink"]),
                        str(doc.get("status", "accepted")))
    except (TierlinkError, KeyError, ValueError, TypeError) as exc:
        raise _malformed(url, NODE, "202 answer", exc) from exc


# ----------------------------------------------------------------------------- other calls


def ready_call(base_url: str) -> Call[bool]:
    """``GET /v2/health/ready``: True on 200, False on any other status."""
    return Call("GET", f"{base_url}/v2/health/ready", NODE, lambda r: r.status == 200)


def metadata_call(base_url: str, name: str, version: str | None = None) -> Call[ModelMetadata]:
    """``GET /v2/models/{name}[/versions/{v}]``."""
    url = model_url(base_url, name, version)
    return Call("GET", url, NODE, partial(parse_metadata, url=url))


def parse_metadata(reply: Reply, *, url: str) -> ModelMetadata:
    _check_status(reply, url)
    try:
        doc = _json_object(reply.content)
        return ModelMetadata(
            name=str(doc["name"]), platform=str(doc.get("platform", "")),
            versions=tuple(str(v) for v in doc.get("versions") or ()),
            inputs=_tensor_specs(doc.get("inputs")), outputs=_tensor_specs(doc.get("outputs")),
            parameters=MappingProxyType(dict(doc.get("parameters") or {})))
    except (TierlinkError, KeyError, ValueError, TypeError) as exc:
        raise _malformed(url, NODE, "model metadata", exc) from exc


def _tensor_specs(entries: Any) -> tuple[TensorMetadata, ...]:
    return tuple(TensorMetadata(str(e["name"]), str(e["datatype"]),
                                tuple(int(d) for d in e["shape"])) for e in entries or ())


def index_call(base_url: str) -> Call[tuple[ModelEntry, ...]]:
    """``POST /v2/repository/index``: the models served and the tasks routed."""
    url = f"{base_url}/v2/repository/index"
    return Call("POST", url, NODE, partial(parse_index, url=url), b"{}",
                {"Content-Type": oip.JSON_CONTENT_TYPE})


def parse_index(reply: Reply, *, url: str) -> tuple[ModelEntry, ...]:
    _check_status(reply, url)
    try:
        rows = json.loads(reply.content)
        return tuple(ModelEntry(str(r["name"]), str(r.get("version", "")),
                                str(r.get("state", "")), str(r.get("reason", "")))
                     for r in rows)
    except (KeyError, ValueError, TypeError) as exc:
        raise _malformed(url, NODE, "repository index", exc) from exc


def result_call(control_url: str | None, key: str | Accepted,
                admin_token: str | None) -> Call[AsyncResult | None]:
    """``GET {control}/v1/results/{key}``; parses to None while the result has not arrived."""
    if control_url is None:
        raise ConfigError("results of asynchronous requests are read from the control plane, "
                          "and this client has no control_url",
                          hint="make the client with control_url= (and admin_token= unless "
                               "the control plane runs --open)")
    key = key.result_key if isinstance(key, Accepted) else key
    url = f"{control_url}/v1/results/{quote(key, safe=':')}"
    headers = {"Authorization": f"Bearer admin:{admin_token}"} if admin_token else {}
    return Call("GET", url, CONTROL, partial(parse_result, url=url), headers=headers)


def parse_result(reply: Reply, *, url: str) -> AsyncResult | None:
    if reply.status == 404 and _error_code(reply.content) == RESULT_NOT_FOUND:
        return None
    _check_status(reply, url)
    try:
        return _async_result(_json_object(reply.content))
    except (TierlinkError, KeyError, ValueError, TypeError) as exc:
        raise _malformed(url, CONTROL, "stored result", exc) from exc


def _async_result(row: Mapping[str, Any]) -> AsyncResult:
    """A stored item (``control.results.StoredResult``) whose payload is
    ``node.async_requests.build_result_payload``'s."""
    p = row["payload"]
    version = p.get("model_version")
    return AsyncResult(
        key=str(row["key"]), request_id=str(p["request_id"]), task=str(p["task"]),
        node=str(p["node"]), served_by=str(p["served_by"]), tier=Tier.parse(str(p["tier"])),
        model=str(p["model"]), model_version=None if version is None else str(version),
        path=tuple(str(n) for n in p["path"]),
        predictions=tuple(int(v) for v in p["predictions"]),
        confidences=tuple(float(v) for v in p["confidences"]),
        confidence=float(p["confidence"]), escalations=int(p.get("escalations", 0)),
        fallbacks=_fallbacks(p.get("fallbacks", [])), degraded=str(p.get("degraded") or ""),
        split_plan=str(p.get("split_plan") or ""), latency_ms=float(p["latency_ms"]),
        cost_usd=float(p.get("cost_usd", 0.0)), uplink=str(p.get("uplink", "")),
        answered_at=float(p["answered_at"]), received_at=float(row["received_at"]),
        chain=tuple(str(n) for n in row.get("chain", ())))


# ----------------------------------------------------------------------------- errors


def _check_status(reply: Reply, url: str) -> None:
    if not 200 <= reply.status < 300:
        raise status_error(reply, url)


def status_error(reply: Reply, url: str) -> TierlinkError:
    """The error a server answered with, rebuilt from its ``code`` (by status when it sent
    none), with ``details["url"]`` and ``details["status"]``."""
    body = _error_body(reply.content)
    if body is None:
        snippet = reply.content[:200].decode("utf-8", "replace")
        body = {"error": f"{url} answered HTTP {reply.status}: {snippet}"}
    err = error_from_dict(body, reply.status)
    err.details["url"] = url
    err.details.setdefault("status", reply.status)
    return err


def _error_body(content: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) and "error" in body else None


def _error_code(content: bytes) -> str | None:
    body = _error_body(content)
    return None if body is None else str(body.get("code"))


def _json_object(content: bytes) -> dict[str, Any]:
    doc = json.loads(content)
    if not isinstance(doc, dict):
        raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
    return doc


def _malformed(url: str, target: str, what: str, exc: Exception) -> TierlinkError:
    reason = exc.message if isinstance(exc, TierlinkError) else f"{type(exc).__name__}: {exc}"
    cls = UpstreamError if target == NODE else ControlPlaneError
    return cls(f"{url} sent a malformed {what}: {reason}", url=url)


__all__ = ["ASYNC", "CONTROL", "NODE", "UPLINK", "Call", "InferOptions", "Inputs", "Reply",
           "index_call", "infer_call", "metadata_call", "named_tensors", "ready_call",
           "request_parameters", "result_call", "single_input", "status_error", "submit_call"]
