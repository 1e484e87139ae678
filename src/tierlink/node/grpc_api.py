"""The node's gRPC face: the Open Inference Protocol's ``inference.GRPCInferenceService``
(KServe v2, what ``tritonclient.grpc`` speaks) beside the REST API, on its own port.

Every method answers as its REST route does (``node/answers.py``): a model runs here, a task
is routed by the fleet's policy with the same parameters (``tierlink.*`` as request
parameters), passes the same overload gate, and is counted in the same metrics. An error is
the REST error's: its message and its code as gRPC status details — ``InvalidRequest`` is
``INVALID_ARGUMENT``, a refusal for load ``RESOURCE_EXHAUSTED``, a missed deadline
``DEADLINE_EXCEEDED`` (:data:`STATUS_OF`) — and the node keeps serving.

On a fleet with TLS it serves TLS with the node's certificate, renewed in place, and binds
a caller's claims to its certificate where the fleet requires client certificates
(``security/grpc_tls.py``); ``grpc_port: null`` in a node spec keeps it closed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tierlink import __version__
from tierlink.errors import TierlinkError
from tierlink.node.answers import Answer, answer, metadata, observed
from tierlink.node.overload import OverloadGate
from tierlink.node.peers import PeerGuard
from tierlink.node.service import NodeService
from tierlink.security.grpc_tls import peer_of_call
from tierlink.transport import grpc_codec as codec
from tierlink.transport.proto import messages

__all__ = ["STATUS_OF", "GrpcApi", "serve_grpc"]

log = logging.getLogger("tierlink.node.grpc")

# An HTTP status as the gRPC status the protocol's clients expect for it.
STATUS_OF = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
             403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
             409: grpc.StatusCode.FAILED_PRECONDITION, 413: grpc.StatusCode.INVALID_ARGUMENT,
             429: grpc.StatusCode.RESOURCE_EXHAUSTED, 499: grpc.StatusCode.CANCELLED,
             502: grpc.StatusCode.UNAVAILABLE, 503: grpc.StatusCode.UNAVAILABLE,
             504: grpc.StatusCode.DEADLINE_EXCEEDED}
EXTENSIONS = ["binary_tensor_data", "model_repository"]
MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # as a REST body (transport/oip.py: MAX_BODY_BYTES)

Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class GrpcApi:
    """The service's methods over a node: ``ready`` says whether it takes requests (the
    REST app's readiness), ``gate`` is the REST app's overload gate."""

    def __init__(self, service: NodeService, gate: OverloadGate, guard: PeerGuard,
                 ready: Callable[[], bool]) -> None:
        self.service, self.gate, self.guard, self.ready = service, gate, guard, ready

    def handlers(self) -> grpc.GenericRpcHandler:
        """The methods registered under the protocol's service name."""
        methods: dict[str, Handler] = {
            "ServerLive": self.server_live, "ServerReady": self.server_ready,
            "ModelReady": self.model_ready, "ServerMetadata": self.server_metadata,
            "ModelMetadata": self.model_metadata, "ModelInfer": self.model_infer}
        return grpc.method_handlers_generic_handler(codec.SERVICE, {
            name: grpc.unary_unary_rpc_method_handler(
                _answering(fn), request_deserializer=codec.method_types(name)[0].FromString,
                response_serializer=codec.method_types(name)[1].SerializeToString)
            for name, fn in methods.items()})

    async def server_live(self, _req: Any, _ctx: grpc.aio.ServicerContext) -> Any:
        return messages().ServerLiveResponse(live=True)

    async def server_ready(self, _req: Any, _ctx: grpc.aio.ServicerContext) -> Any:
        return messages().ServerReadyResponse(ready=self.ready())

    async def model_ready(self, req: Any, _ctx: grpc.aio.ServicerContext) -> Any:
        metadata(self.service, req.name, req.version or None)  # NOT_FOUND when unknown
        return messages().ModelReadyResponse(ready=self.ready())

    async def server_metadata(self, _req: Any, _ctx: grpc.aio.ServicerContext) -> Any:
        return messages().ServerMetadataResponse(name="tierlink", version=__version__,
                                         extensions=EXTENSIONS)

    async def model_metadata(self, req: Any, _ctx: grpc.aio.ServicerContext) -> Any:
        meta = metadata(self.service, req.name, req.version or None)
        return messages().ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[_tensor_meta(t) for t in meta["inputs"]],
            outputs=[_tensor_meta(t) for t in meta["outputs"]])

    async def model_infer(self, req: Any, ctx: grpc.aio.ServicerContext) -> Any:
        name, version = req.model_name, req.model_version or None
        return await observed(self.service, name, lambda: self._infer(name, version, req, ctx))

    async def _infer(self, name: str, version: str | None, req: Any,
                     ctx: grpc.aio.ServicerContext) -> Any:
        data = codec.decode_request(req)
        sender = peer_of_call(ctx) if self.guard.enabled else None
        done = await answer(self.service, name, version, data,
                            lambda params: self.guard.bind_peer(sender, params), self.gate,
                            None)
        return _response(done)


def _response(done: Answer) -> Any:
    if done.accepted is not None:  # an asynchronous request taken: what REST's 202 says
        params = {f"tierlink.{k}": v if isinstance(v, str | int | float | bool)
                  else json.dumps(v) for k, v in done.accepted.items()}
        return codec.encode_response(done.name, done.version, done.id, {}, params)
    return codec.encode_response(done.name, done.version, done.id, done.outputs,
                                 done.parameters)


def _tensor_meta(entry: dict[str, Any]) -> Any:
    return messages().ModelMetadataResponse.TensorMetadata(name=entry["name"],
                                                   datatype=entry["datatype"],
                                                   shape=entry["shape"])


def _answering(fn: Handler) -> Handler:
    """``fn`` whose errors end the call with the REST error's status and message."""

    async def call(req: Any, ctx: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(req, ctx)
        except TierlinkError as exc:
            status = STATUS_OF.get(exc.http_status, grpc.StatusCode.INTERNAL)
            hint = f" (hint: {exc.hint})" if exc.hint else ""
            await ctx.abort(status, f"{exc.code}: {exc.message}{hint}")
        except Exception as exc:  # the process keeps serving
            log.exception("unexpected error in a gRPC call")
            await ctx.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")
        raise AssertionError("unreachable: abort raises")

    return call


async def serve_grpc(api: GrpcApi, host: str, port: int,
                     credentials: grpc.ServerCredentials | None = None
                     ) -> tuple[grpc.aio.Server, int]:
    """A started gRPC server for ``api`` on ``host:port`` (0: any free port), and its port;
    over TLS with ``credentials``."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                      ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                      ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((api.handlers(),))
    address = f"{host}:{port}"
    bound = (server.add_insecure_port(address) if credentials is None
             else server.add_secure_port(address, credentials))
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    await server.start()
    return server, bound
