"""The synchronous application client: :class:`Client`.

Requests are built and answers parsed by :mod:`tierlink.client.wire` (shared with
:class:`~tierlink.client.aio.AsyncClient`); this module only sends them over one pooled
``httpx.Client``. Safe to share between threads (httpx's pool is).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, overload

import httpx
import numpy as np

from tierlink.client import session, wire
from tierlink.client.results import Accepted, AsyncResult, InferResult, ModelEntry, ModelMetadata
from tierlink.client.tls import ClientTLS, client_options
from tierlink.core.types import Priority, Privacy
from tierlink.errors import UpstreamTimeout, UpstreamUnavailable

T = TypeVar("T")


class Client:
    """A tierlink node's application client (Open Inference Protocol v2 over HTTP).

    ``url``: the node the application sends to (usually its device's or site's node).
    ``control_url`` / ``admin_token``: where :meth:`result` reads the results of asynchronous
    requests (the token is the operators' ``<db>.admin-token``; none for ``--open``).
    ``timeout_s``: each phase of a call (connect, send, read) unless the call sets its own.
    ``tls``: HTTPS to a fleet with TLS (:class:`~tierlink.client.tls.ClientTLS`: the fleet CA,
    the node's id, the application's certificate). ``transport``: an ``httpx`` transport to
    use instead of the network (tests). Use it as a
    context manager, or call :meth:`close`.
    """

    def __init__(self, url: str, *, control_url: str | None = None,
                 admin_token: str | None = None,
                 timeout_s: float = session.DEFAULT_TIMEOUT_S,
                 max_connections: int = session.DEFAULT_MAX_CONNECTIONS,
                 transport: httpx.BaseTransport | None = None,
                 tls: ClientTLS | None = None) -> None:
        self.url = session.checked_url(url, "url")
        self.control_url = (session.checked_url(control_url, "control_url")
                            if control_url is not None else None)
        self._admin_token = admin_token
        self._timeout_s = timeout_s
        self._http = httpx.Client(**session.pool_options(timeout_s, max_connections),
                                  transport=transport,
                                  **client_options(tls, self.url))
        self._input_names: dict[str, str] = {}  # by task / model: what an array is sent as

    def close(self) -> None:
        """Close the pooled connections; the client cannot be used afterwards."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @overload
    def infer(self, task_or_model: str, inputs: wire.Inputs, *,
              deadline_ms: float | None = ..., privacy: Privacy | str | None = ...,
              priority: Priority | str | None = ..., version: str | None = ...,
              asynchronous: Literal[False] = ..., request_id: str | None = ...,
              outputs: Sequence[str] | None = ..., parameters: Mapping[str, Any] | None = ...,
              timeout_s: float | None = ...) -> InferResult: ...

    @overload
    def infer(self, task_or_model: str, inputs: wire.Inputs, *,
              deadline_ms: float | None = ..., privacy: Privacy | str | None = ...,
              priority: Priority | str | None = ..., version: str | None = ...,
              asynchronous: Literal[True], request_id: str | None = ...,
              outputs: Sequence[str] | None = ..., parameters: Mapping[str, Any] | None = ...,
              timeout_s: float | None = ...) -> Accepted: ...

    def infer(self, task_or_model: str, inputs: wire.Inputs, *,
              deadline_ms: float | None = None, privacy: Privacy | str | None = None,
              priority: Priority | str | None = None, version: str | None = None,
              asynchronous: bool = False, request_id: str | None = None,
              outputs: Sequence[str] | None = None, parameters: Mapping[str, Any] | None = None,
              timeout_s: float | None = None) -> InferResult | Accepted:
        """Send ``inputs`` (the single input's array, or a dict by input name) to a task
        (routed by the fleet's policy) or a model (run on this node) as binary tensors.

        Unset options take the node's defaults (1000 ms, ``any``, ``interactive``);
        ``version`` pins a model version. Returns the :class:`InferResult`, or with
        ``asynchronous=True`` (tasks only) the :class:`Accepted` answer whose result
        :meth:`result` reads later. Raises the :class:`~tierlink.errors.TierlinkError` the
        node answered with (its code, message and hint), or the one
        :mod:`tierlink.client.session` maps a failed connection to.
        """
        opts = wire.InferOptions.make(
            deadline_ms=deadline_ms, privacy=privacy, priority=priority, version=version,
            request_id=request_id, outputs=outputs, parameters=parameters, timeout_s=timeout_s)
        tensors = self._tensors(task_or_model, inputs)
        if asynchronous:
            return self._do(wire.submit_call(self.url, task_or_model, tensors, opts))
        return self._do(wire.infer_call(self.url, task_or_model, tensors, opts))

    def result(self, key: str | Accepted, *, wait_s: float = 0.0,
               poll_s: float = 0.1) -> AsyncResult | None:
        """The result of an asynchronous request (its :class:`Accepted` or ``result_key``)
        from the control plane; None while it has not arrived. ``wait_s`` > 0 polls every
        ``poll_s`` until it arrives or ``wait_s`` has passed."""
        call = wire.result_call(self.control_url, key, self._admin_token)
        deadline = time.monotonic() + wait_s
        while True:
            found = self._do(call)
            left = deadline - time.monotonic()
            if found is not None or left <= 0:
                return found
            time.sleep(min(poll_s, left))

    def ready(self) -> bool:
        """Whether the node is ready (``GET /v2/health/ready``); False when unreachable."""
        try:
            return self._do(wire.ready_call(self.url))
        except (UpstreamUnavailable, UpstreamTimeout):
            return False

    def metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        """A model's or a task's inputs and outputs (``GET /v2/models/{name}``)."""
        return self._do(wire.metadata_call(self.url, name, version))

    def models(self) -> tuple[ModelEntry, ...]:
        """The models this node serves and the tasks it routes (repository index)."""
        return self._do(wire.index_call(self.url))

    def _tensors(self, name: str, inputs: wire.Inputs) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            return wire.named_tensors(inputs)
        if name not in self._input_names:  # once per name: an extra metadata call
            self._input_names[name] = wire.single_input(self.metadata(name))
        return {self._input_names[name]: np.asarray(inputs)}

    def _do(self, call: wire.Call[T]) -> T:
        if self._http.is_closed:
            raise session.closed_error(type(self).__name__)
        try:
            response = self._http.request(call.method, call.url, content=call.content,
                                          headers=call.headers,
                                          timeout=session.timeout(call, self._timeout_s))
        except session.HTTPX_ERRORS as exc:
            raise session.transport_error(exc, call) from exc
        return call.parse(wire.Reply(response.status_code, response.headers, response.content))


__all__ = ["Client"]
