"""The one exception tree of tierlink.

Every error a caller can see is a :class:`TierlinkError`. Each class carries a stable
machine-readable ``code``, the HTTP status it maps to at the OIP boundary, and a ``hint``
telling the caller what to do about it. Third-party errors (httpx, onnxruntime, sqlite3)
are converted at the adapter that calls them, with ``raise ... from exc``.

    TierlinkError
    ├── ConfigError                 bad fleet file / flag (names the field and the fix)
    ├── InvalidRequest              400: malformed OIP body, tensors, shapes, dtypes
    │   ├── TensorError             400: one tensor is malformed
    │   ├── ContextTooLong          400: a prompt (+ max_tokens) over the model's context
    │   └── PackageRefused          422: a conversation's KV package this node cannot load
    │       │                       (another model file, a broken body, a wrong shape)
    │       └── PackageTooLarge     413: over the largest cache this node's model can hold
    ├── ModelNotFound               404: unknown model / task / version
    ├── PrivacyViolation            403: the input may not be held by this node
    ├── Refused                     a request refused at once (not left to time out)
    │   ├── AdmissionRefused        429: queue full, or the deadline cannot be met here
    │   ├── NoFeasiblePlacement     503: no placement meets privacy + model + deadline
    │   ├── DeadlineExceeded        504: the deadline passed before an answer
    │   └── Overloaded              every placement refused or out of time: busy, not broken
    ├── UpstreamError               502: an upstream hop failed (after fallbacks)
    │   ├── UpstreamTimeout         504
    │   └── UpstreamUnavailable     503: connection refused / reset / breaker open
    ├── RuntimeFailure              500: the model runtime raised
    ├── ControlPlaneError           503: registry unreachable or refused
    ├── LinkEmulationError          link emulator misconfigured or failed
    ├── SplitError                  400: a model cannot be cut there (not a single-tensor cut)
    │   └── CodecError              400: a feature payload is malformed, truncated or of an
    │                               unknown codec / version; a codec spec is unknown
    ├── ModelError                  a model's file or card cannot be read or used (missing,
    │   │                           malformed, does not match its card, no runtime for it)
    │   ├── ZooError                the demo's model zoo could not be built or loaded
    │   ├── QuantizationError       a variant cannot be made: precision does not apply,
    │   │                           bad settings
    │   └── ImportRefused           a model or its data cannot be imported (not ONNX, a
    │                               signature the task does not take, bad labels, no data)
    ├── RepositoryError             model repository: unknown version, artifact missing, a
    │   │                           store that cannot be written (404 / 409 / 503 by case)
    │   ├── ArtifactRejected        422: hash or signature does not verify, unsigned, signed
    │   │                           by a key this node does not trust
    │   └── VersionConflict         another artifact is already published as that version
    ├── SessionBusy                 409: a conversation is answering another turn
    ├── SessionNotFound             404: no conversation of that name is held here
    ├── NotEnrolled                 401: unknown or revoked node / bad enrollment token
    │   └── PeerRefused             403: a sender's claims are not its to make (TLS fleets)
    ├── RolloutError                409: a rollout cannot start or move (one already runs,
    │   │                           no such version, no nodes in the tier)
    │   └── RolloutNotFound         404: no rollout has that id (or no such action)
    ├── RoutingConflict             409: the fleet's routing revision cannot move so (no
    │                               earlier revision to go back to)
    ├── OutboxError                 the durable outbox cannot take an item (full with the
    │                               `refuse` policy, disk failing)
    └── NoFreePort                  no loopback port could be reserved for a server to start
"""

from __future__ import annotations

from typing import Any


class TierlinkError(Exception):
    """Base of every tierlink error."""

    code: str = "tierlink_error"
    http_status: int = 500
    hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """The error body returned over HTTP (OIP uses ``{"error": msg}``; we add fields)."""
        body: dict[str, Any] = {"error": self.message, "code": self.code}
        if self.hint:
            body["hint"] = self.hint
        if self.details:
            body["details"] = self.details
        return body

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class ConfigError(TierlinkError):
    code = "config_error"
    http_status = 400
    hint = "fix the named field in the fleet file or flag"


class InvalidRequest(TierlinkError):
    code = "invalid_request"
    http_status = 400
    hint = "send an Open Inference Protocol v2 request: see /v2/models/{name} for inputs"


class TensorError(InvalidRequest):
    code = "invalid_tensor"


class ContextTooLong(InvalidRequest):
    code = "context_length_exceeded"
    hint = "shorten the prompt or lower max_tokens"


class PackageRefused(InvalidRequest):
    code = "kv_package_refused"
    http_status = 422


class PackageTooLarge(PackageRefused):
    code = "kv_package_too_large"
    http_status = 413


class SessionBusy(TierlinkError):
    code = "session_busy"
    http_status = 409
    hint = "wait for the turn in progress, or use another tierlink.session"


class SessionNotFound(TierlinkError):
    code = "session_not_found"
    http_status = 404


class ModelNotFound(TierlinkError):
    code = "model_not_found"
    http_status = 404
    hint = "list the served models with GET /v2/repository/index"


class PrivacyViolation(TierlinkError):
    code = "privacy_violation"
    http_status = 403
    hint = "this node's tier may not hold inputs of this privacy level"


class Refused(TierlinkError):
    code = "refused"
    http_status = 503


class AdmissionRefused(Refused):
    code = "admission_refused"
    http_status = 429
    hint = "retry later, raise the deadline, or send it to another node"


class EscalationShed(AdmissionRefused):
    """An escalation (work whose caller already holds an answer) refused because the node's
    queue is as deep as its ``escalation_queue``: the caller answers with what it holds,
    the node keeps its workers for requests that have no answer yet."""

    code = "escalation_shed"
    hint = "the caller keeps the answer it holds; escalations resume once the queue drains"


class Overloaded(Refused):
    """Every placement was refused or ran out of time: the fleet is busy, not broken."""

    code = "overloaded"
    http_status = 503
    hint = "retry after the Retry-After interval, raise the deadline, or lower the rate"


class NoFeasiblePlacement(Refused):
    code = "no_feasible_placement"
    http_status = 503
    hint = "relax the deadline or privacy level, or add capacity that holds the model"


class DeadlineExceeded(Refused):
    code = "deadline_exceeded"
    http_status = 504
    hint = "the deadline passed before an answer; raise it or lower the load"


class UpstreamError(TierlinkError):
    code = "upstream_error"
    http_status = 502
    hint = "an upstream node failed; the response lists the fallbacks tried"


class UpstreamTimeout(UpstreamError):
    code = "upstream_timeout"
    http_status = 504


class UpstreamUnavailable(UpstreamError):
    code = "upstream_unavailable"
    http_status = 503


class RuntimeFailure(TierlinkError):
    code = "runtime_failure"
    http_status = 500
    hint = "the model runtime failed on this input; check the node's log"


class ControlPlaneError(TierlinkError):
    code = "control_plane_error"
    http_status = 503
    hint = "is `tierlink control` running at the configured URL?"


class LinkEmulationError(TierlinkError):
    code = "link_emulation_error"
    hint = "check the link definitions in the fleet file"


class SplitError(TierlinkError):
    code = "split_error"
    http_status = 400
    hint = "list the valid cuts with `tierlink split list MODEL`"


class CodecError(SplitError):
    code = "codec_error"
    http_status = 400
    hint = ("codecs: fp32, fp16, int8, int8c, topk:R, thr:T, each optionally +zstd; "
            "the payload must be one encoded by tierlink.split.codecs")


class ModelError(TierlinkError):
    code = "model_error"
    hint = ("a model's card names its files and how it was made: import, build or install "
            "the model again to replace them")


class ZooError(ModelError):
    code = "zoo_error"
    hint = "rebuild the zoo with `tierlink zoo build`"


class QuantizationError(ModelError):
    code = "quantization_error"
    hint = "see `tierlink quantize --help` for the precisions and their settings"


class ImportRefused(ModelError):
    code = "import_refused"
    http_status = 400
    hint = "see `tierlink model import --help` for what a model and its data must be"


class RepositoryError(TierlinkError):
    code = "repository_error"
    http_status = 404
    hint = "list the published versions with `tierlink model list`"


class ArtifactRejected(RepositoryError):
    code = "artifact_rejected"
    http_status = 422
    hint = ("republish the version with `tierlink model publish` signed by a key the nodes "
            "trust (`trusted_keys` in the fleet file)")


class VersionConflict(RepositoryError):
    """A different artifact is already published under this (name, version)."""

    code = "version_conflict"
    http_status = 409
    hint = "versions are immutable: publish this one under a new --version"


class NotEnrolled(TierlinkError):
    code = "not_enrolled"
    http_status = 401
    hint = ("enroll the node with a token from `tierlink enroll token` (its state directory then "
            "keeps its identity); a revoked node must enroll under a new id")


class PeerRefused(NotEnrolled):
    """A sender may not make this request's claims, or call a peer endpoint (403):
    ``details["reason"]`` is one of forged_origin, unauthenticated_peer, local_forwarded,
    replayed."""

    code = "peer_refused"
    http_status = 403
    hint = ("a node speaks for itself and the nodes below it; an application names no "
            "origin but the node it calls; peer endpoints need a node's (or an operator's) "
            "fleet certificate")


class RoutingConflict(TierlinkError):
    code = "routing_conflict"
    http_status = 409
    hint = "read the revisions with `tierlink policy history`"


class RolloutError(TierlinkError):
    code = "rollout_error"
    http_status = 409
    hint = "see `tierlink rollout status` for what is running"


class RolloutNotFound(RolloutError):
    """No rollout has that id (404)."""

    code = "rollout_not_found"
    http_status = 404
    hint = "list the rollouts with `tierlink rollout status`"


class OutboxError(TierlinkError):
    code = "outbox_error"
    http_status = 503
    hint = "the node's outbox is full or its disk fails; see tierlink_outbox_* metrics"


class NoFreePort(TierlinkError):
    code = "no_free_port"
    hint = "too many ports below the kernel's ephemeral range are in use; stop old fleets"


_BY_CODE: dict[str, type[TierlinkError]] = {}


def _index(cls: type[TierlinkError]) -> None:
    _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _index(sub)


def error_from_dict(body: dict[str, Any], status: int) -> TierlinkError:
    """Rebuild an error received over HTTP (used by the transport at its boundary)."""
    if not _BY_CODE:
        _index(TierlinkError)
    cls = _BY_CODE.get(str(body.get("code", "")), None)
    if cls is None:
        cls = _BY_STATUS.get(status) or (UpstreamError if status >= 500 else InvalidRequest)
    message = str(body.get("error", f"HTTP {status}"))
    details = body.get("details")
    safe = {k: v for k, v in details.items() if k not in ("message", "hint")} \
        if isinstance(details, dict) else {}
    hint = body.get("hint")
    return cls(message, hint=str(hint) if hint is not None else None, **safe)


# For servers that send only {"error": ...} (Triton, KServe).
_BY_STATUS: dict[int, type[TierlinkError]] = {}


def _status_map() -> None:
    _BY_STATUS.update({404: ModelNotFound, 429: AdmissionRefused, 504: UpstreamTimeout})


_status_map()
