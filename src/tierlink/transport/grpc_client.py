"""A client of the Open Inference Protocol's gRPC API (a tierlink node's, or any KServe v2 /
Triton server's), on ``grpc.aio``: one channel per target, binary tensors, the answers
decoded as the REST client decodes them (:class:`oip.InferResponseData`). A call that
fails ends in the error the server answered with, rebuilt from the error tree's code at
the head of a tierlink node's status message (``invalid_request: ...``); from another
server, or when the server could not be reached or did not answer in time, in the class
its gRPC status says (``UpstreamUnavailable``, ``UpstreamTimeout``, ``InvalidRequest``,
``ModelNotFound``, ``AdmissionRefused``, ``UpstreamError``). With ``tls`` it verifies the
server against the fleet CA and presents its own certificate where it has one
(``security/grpc_tls.py``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Self

import numpy as np

from tierlink.errors import TierlinkError, error_from_dict
from tierlink.security.tls import TlsFiles
from tierlink.transport import grpc_codec as codec
from tierlink.transport import oip

__all__ = ["GrpcClient"]

# A gRPC status as the HTTP status the error tree maps (when the message names no code).
_HTTP_OF = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "PERMISSION_DENIED": 403,
            "UNAUTHENTICATED": 401, "FAILED_PRECONDITION": 409, "RESOURCE_EXHAUSTED": 429,
            "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504, "CANCELLED": 499}
_UNANSWERED = {"DEADLINE_EXCEEDED": "upstream_timeout", "UNAVAILABLE": "upstream_unavailable"}
_CODED = re.compile(r"^(?P<code>[a-z_]+): (?P<message>.*?)(?: \(hint: (?P<hint>.*)\))?$",
                    re.DOTALL)


class GrpcClient:
    """``target``: ``host:port``. ``timeout_s`` bounds each call. ``tls``: the fleet CA
    (and the caller's certificate and key, where it has them)."""

    def __init__(self, target: str, timeout_s: float = 10.0, tls: TlsFiles | None = None
                 ) -> None:
        import grpc

        self.target, self.timeout_s = target, timeout_s
        options = [("grpc.max_receive_message_length", 256 * 1024 * 1024),
                   ("grpc.max_send_message_length", 256 * 1024 * 1024)]
        if tls is None:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            from tierlink.security.grpc_tls import channel_credentials

            self._channel = grpc.aio.secure_channel(target, channel_credentials(tls),
                                                    options=options)
        self._calls = {name: self._channel.unary_unary(
            f"/{codec.SERVICE}/{name}", request_serializer=codec.method_types(name)[0]
            .SerializeToString, response_deserializer=codec.method_types(name)[1].FromString)
            for name in codec.METHODS}

    async def infer(self, model: str, inputs: Mapping[str, np.ndarray],
                    params: Mapping[str, Any] | None = None,
                    version: str | None = None) -> oip.InferResponseData:
        request = codec.encode_request(model, inputs, params, version)
        return codec.decode_response(await self._call("ModelInfer", request))

    async def live(self) -> bool:
        request = codec.method_types("ServerLive")[0]()
        return bool((await self._call("ServerLive", request)).live)

    async def _call(self, method: str, request: Any) -> Any:
        import grpc

        try:
            return await self._calls[method](request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _error(self.target, method, exc.code().name, exc.details() or "") from None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _error(target: str, method: str, status: str, details: str) -> TierlinkError:
    """The error a failed call stands for (see the module docstring)."""
    found = _CODED.match(details)
    if found:  # a tierlink node's error: its code, message and hint
        body = {"code": found["code"], "error": found["message"], "hint": found["hint"]}
    else:  # the call's own deadline, nothing at that address, or another server's words
        body = {"code": _UNANSWERED.get(status), "error": details}
    err = error_from_dict(body, _HTTP_OF.get(status, 502))
    err.details.update(target=target, method=method, grpc_status=status)
    return err
