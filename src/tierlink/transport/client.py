"""Async Open Inference Protocol v2 client that nodes use to call each other (and any OIP server).

One :class:`OipClient` per process, shared by every call: it owns one ``aiohttp`` session
(opened on the first call, in the running loop) whose keep-alive pool makes a hop cost one
request on a warm connection. aiohttp rather than httpx: on the hop a node forwards, it costs
about a third of httpx's CPU per request (``benchmarks/routing_overhead.py``), and a throttled
device pays that on every request it sends upstream. This module is the boundary where
aiohttp's errors become tierlink errors (``raise ... from exc``)::

    timeout (ours or aiohttp's)                → UpstreamTimeout
    connect refused / reset / protocol broken  → UpstreamUnavailable
    non-2xx with a JSON {"error": ...} body    → error_from_dict(body, status), e.g. 429
                                                 {"code": "admission_refused"} → AdmissionRefused
    non-2xx otherwise, malformed 2xx body      → UpstreamError
    any other client error (a bad URL, ...)    → UpstreamError

Every error raised carries ``details["url"]``. The client sends ``Accept-Encoding: identity``
(tensors compress poorly and the hop is CPU-bound) and ignores proxy settings from the
environment (``trust_env=False``): node-to-node traffic goes straight to the node.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import quote

import numpy as np

from tierlink.errors import (
    InvalidRequest,
    TierlinkError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_from_dict,
)
from tierlink.security.names import expect_node
from tierlink.transport.oip import (
    HEADER_LENGTH,
    InferResponseData,
    decode_infer_response,
    encode_infer_request,
)

if TYPE_CHECKING:
    import aiohttp

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 100
# Keys TierlinkError.__init__ takes itself: an upstream's details must not collide with them.
_RESERVED_DETAILS = frozenset({"message", "hint"})


@dataclass(frozen=True, slots=True)
class Reply:
    """An upstream's answer, read whole: status, headers (case-insensitive), body."""

    status: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300


class OipClient:
    """Async OIP v2 REST client over one pooled ``aiohttp`` session.

    Create one per process and share it; close it with :meth:`close` or ``async with``.
    ``timeout_s`` bounds each call end to end unless the call passes its own (the dispatcher
    passes the remaining deadline). The session is opened by the first call, in the event
    loop that makes it, and belongs to that loop.
    """

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if timeout_s <= 0 or max_connections < 1:
            raise ValueError("OipClient needs timeout_s > 0 and max_connections >= 1")
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._tls = tls  # HTTPS peers: verified against it, our certificate presented
        self._in_flight: set[asyncio.Future[Reply]] = set()  # exchanges under way: _shielded

    async def close(self) -> None:
        """Close every pooled connection. The client cannot be used afterwards."""
        self._closed = True
        for exchange in self._in_flight:
            exchange.cancel()
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def infer(
        self,
        base_url: str,
        model: str,
        inputs: Mapping[str, np.ndarray],
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        binary: bool = True,
        headers: Mapping[str, str] | None = None,
        *,
        version: str | None = None,
        outputs: list[str] | None = None,
        request_id: str | None = None,
        peer: str | None = None,
    ) -> InferResponseData:
        """POST ``{base_url}/v2/models/{model}[/versions/{version}]/infer``; all outputs unless
        ``outputs`` names some. ``binary`` sends inputs and asks for outputs as binary data.

        ``parameters`` values must be scalars (see ``oip.pack_param``). ``headers`` are added to
        the request (deadline, trace context). ``peer``: the node id the caller means to reach
        (over TLS the server must prove it is that node; see :meth:`_send`). Raises the
        errors listed in the module docstring; :class:`~tierlink.errors.InvalidRequest` if
        ``inputs`` cannot be encoded.
        """
        url = _model_url(base_url, model, version) + "/infer"
        body, request_headers = encode_infer_request(
            inputs,
            parameters,
            outputs,
            binary_inputs=binary,
            binary_outputs=binary,
            request_id=request_id,
        )
        if headers:
            request_headers.update(headers)
        reply = await self._send("POST", url, timeout_s, peer, data=body,
                                 headers=request_headers)
        return _decode_infer(reply, url)

    async def ready(self, base_url: str, timeout_s: float | None = None, *,
                    peer: str | None = None) -> bool:
        """GET ``/v2/health/ready``: True on HTTP 200; False on any other status, on timeout and
        when the server cannot be reached (or, with ``peer``, is not that node). Never raises
        for the network."""
        try:
            reply = await self._send("GET", f"{base_url.rstrip('/')}/v2/health/ready", timeout_s,
                                     peer)
        except TierlinkError:  # unreachable, timed out, or any non-2xx answer
            return False
        return reply.status == 200

    async def probe(self, base_url: str, nbytes: int, timeout_s: float | None = None, *,
                    peer: str | None = None) -> None:
        """POST ``nbytes`` of padding to ``/tierlink/v1/probe`` (answered at once, empty):
        a timed exchange of a known size that teaches a link estimator the bandwidth."""
        await self._send("POST", f"{base_url.rstrip('/')}/tierlink/v1/probe", timeout_s, peer,
                         data=bytes(nbytes))

    async def open_split(self, base_url: str, model: str, cut: str,
                         timeout_s: float | None = None, *, peer: str | None = None) -> None:
        """POST ``/tierlink/v1/splits/{model}/open?cut=CUT``: ask the node to open the tail
        of ``model`` at ``cut`` now, so the first split request that uses it does not pay
        for cutting the model and opening its session."""
        await self._send("POST", f"{base_url.rstrip('/')}/tierlink/v1/splits/{model}/open",
                         timeout_s, peer, params={"cut": cut})

    async def model_metadata(
        self, base_url: str, model: str, version: str | None = None, timeout_s: float | None = None,
        *, peer: str | None = None,
    ) -> dict[str, Any]:
        """GET ``/v2/models/{model}[/versions/{version}]``: the OIP model metadata object
        (``name``, ``versions``, ``platform``, ``inputs``, ``outputs``)."""
        url = _model_url(base_url, model, version)
        reply = await self._send("GET", url, timeout_s, peer)
        try:
            doc = json.loads(reply.content)
        except (ValueError, RecursionError) as exc:
            raise UpstreamError(
                f"{url} sent model metadata that is not JSON: {exc}", url=url
            ) from exc
        if not isinstance(doc, dict):
            raise UpstreamError(f"{url} sent model metadata that is not a JSON object", url=url)
        return doc

    async def _send(self, method: str, url: str, timeout_s: float | None,
                    peer: str | None = None, **kwargs: Any) -> Reply:
        """One HTTP exchange, bounded end to end by ``timeout_s``; non-2xx raises.

        Over TLS with ``peer`` named, the server's certificate must carry that node's
        identity name (``security/names.py``), not merely the URL's address: a certificate
        the fleet CA issued to any other node fails the handshake, before anything is sent."""
        import aiohttp

        timeout = self._timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:  # the caller's deadline is already spent: do not load the upstream
            raise UpstreamTimeout(
                f"{method} {url} not sent: no time left ({timeout:.3g} s)",
                url=url,
                timeout_s=timeout,
            )
        try:
            kwargs["server_hostname"] = expect_node(peer, self._tls)
            # aiohttp's own total timeout and ours bound the whole exchange (connect, send,
            # answer, body), which is what a deadline means.
            async with asyncio.timeout(timeout):
                reply = await self._shielded(self._exchange(method, url, timeout, **kwargs))
        except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors too
            raise UpstreamTimeout(
                f"{method} {url} got no answer within {timeout:.3g} s", url=url, timeout_s=timeout
            ) from exc
        except aiohttp.ClientConnectorCertificateError as exc:
            raise UpstreamUnavailable(
                f"{method} {url}: the server failed the TLS check"
                + (f" (it is not node {peer}: its certificate does not name it)"
                   if peer is not None and "mismatch" in str(exc) else "")
                + f": {exc.certificate_error}", url=url, peer=peer or "",
                hint="check that the fleet's registry and links point at the right node",
            ) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise UpstreamUnavailable(
                f"{method} {url} failed: {type(exc).__name__}: {str(exc) or 'connection lost'}",
                url=url,
            ) from exc
        except (aiohttp.ClientError, ValueError) as exc:  # a URL aiohttp cannot use, ...
            raise UpstreamError(
                f"{method} {url} failed: {type(exc).__name__}: {exc}", url=url
            ) from exc
        if not reply.is_success:
            raise _status_error(reply, url)
        return reply

    async def _shielded(self, exchange: Coroutine[Any, Any, Reply]) -> Reply:
        """Await ``exchange`` in a task that a caller who gives up leaves running: its answer
        is read and dropped, and its keep-alive connection goes back to the pool. Cancelled
        halfway, aiohttp would close the connection and the next call to that peer would pay
        a new handshake (a round trip): a hedge's loser did that to the only warm connection
        to its node at every hedge. Its own timeout still ends it (and then the connection);
        ``close`` ends it at once."""
        task = asyncio.ensure_future(exchange)
        self._in_flight.add(task)
        task.add_done_callback(self._settled)
        return await asyncio.shield(task)

    def _settled(self, task: asyncio.Future[Reply]) -> None:
        self._in_flight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: when nobody waits any more, nobody is told

    async def _exchange(self, method: str, url: str, timeout: float, **kwargs: Any) -> Reply:
        import aiohttp

        session = self._http()
        async with session.request(method, url, timeout=aiohttp.ClientTimeout(total=timeout),
                                   **kwargs) as response:
            return Reply(response.status, response.headers, await response.read())

    def _http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._closed:
            raise UpstreamError("this OipClient is closed", hint="make a new client")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                               ssl=self._tls if self._tls is not None else True),
                headers={"Accept-Encoding": "identity"},
                trust_env=False,  # node-to-node traffic goes straight to the node
                auto_decompress=True,  # a server that compresses anyway is still read
            )
        return self._session


def _model_url(base_url: str, model: str, version: str | None) -> str:
    url = f"{base_url.rstrip('/')}/v2/models/{quote(model, safe='')}"
    return url if version is None else f"{url}/versions/{quote(version, safe='')}"


def _decode_infer(response: Reply, url: str) -> InferResponseData:
    try:
        header = response.headers.get(HEADER_LENGTH)
        header_length = None if header is None else int(header)
        # aiohttp has already undone any Content-Encoding the server applied.
        return decode_infer_response(response.content, header_length)
    except (InvalidRequest, ValueError) as exc:
        message = exc.message if isinstance(exc, TierlinkError) else str(exc)
        raise UpstreamError(
            f"{url} sent a malformed inference response: {message}", url=url
        ) from exc


def _status_error(response: Reply, url: str) -> TierlinkError:
    """Rebuild the error an upstream answered with; ``details["url"]`` is always ours."""
    status = response.status
    body = _error_json(response.content)
    if body is None:
        snippet = response.content[:200].decode("utf-8", "replace")
        err: TierlinkError = UpstreamError(
            f"{url} answered HTTP {status}: {snippet}", status=status
        )
    else:
        err = error_from_dict(body, status)
    err.details["url"] = url
    err.details.setdefault("status", status)
    return err


def _error_json(content: bytes) -> dict[str, Any] | None:
    """The OIP error object in ``content``, cleaned for ``error_from_dict``; None if none."""
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or "error" not in body:
        return None
    details = body.get("details")
    if isinstance(details, dict):
        body["details"] = {
            k: v for k, v in details.items() if isinstance(k, str) and k not in _RESERVED_DETAILS
        }
    if body.get("hint") is not None and not isinstance(body["hint"], str):
        body["hint"] = str(body["hint"])
    return body
