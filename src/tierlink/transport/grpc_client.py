"""A client of the Open Inference Protocol's gRPC API (a tierlink node's, or any KServe v2 /
Triton server's), on ``grpc.aio``: one channel per target, binary tensors, the answers
decoded as the REST client decodes them (:class:`oip.InferResponseData`). A call that
fails ends in the error tree's ``UpstreamUnavailable`` (the server could not be reached or
timed out) or ``InvalidRequest`` (the server refused the request), with its status and
message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import numpy as np

from tierlink.errors import InvalidRequest, UpstreamUnavailable
from tierlink.transport import grpc_codec as codec
from tierlink.transport import oip

__all__ = ["GrpcClient"]

_UNREACHABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED")


class GrpcClient:
    """``target``: ``host:port``. ``timeout_s`` bounds each call."""

    def __init__(self, target: str, timeout_s: float = 10.0) -> None:
        import grpc

        self.target, self.timeout_s = target, timeout_s
        self._channel = grpc.aio.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", 256 * 1024 * 1024),
            ("grpc.max_send_message_length", 256 * 1024 * 1024)])
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
            status = exc.code().name
            message = f"{self.target} {method}: {status}: {exc.details()}"
            if status in _UNREACHABLE:
                raise UpstreamUnavailable(message, status=status) from None
            raise InvalidRequest(message, status=status) from None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
