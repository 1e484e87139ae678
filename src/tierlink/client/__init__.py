"""Clients for applications: send inputs to a tierlink node, get typed answers.

    from tierlink import Client

    with Client("http://127.0.0.1:8001") as node:
        answer = node.infer("fmnist", images, deadline_ms=150, privacy="site")
        answer["probabilities"], answer.served_by, answer.tier, answer.cost_usd

* :class:`Client` (:mod:`.sync`) and :class:`AsyncClient` (:mod:`.aio`): the same methods,
  blocking or awaited — ``infer``, ``result``, ``ready``, ``metadata``, ``models``. Each owns
  one ``httpx`` connection pool; both are context managers.
* :mod:`.wire`: what they send and how answers are read (shared, no I/O);
  :mod:`.session`: the pool's settings and where httpx's errors become tierlink errors.
* :mod:`.results`: the dataclasses returned (:class:`InferResult`, :class:`Accepted`,
  :class:`AsyncResult`, :class:`ModelMetadata`, :class:`ModelEntry`).

Every error is a :class:`~tierlink.errors.TierlinkError`: the one the node answered with
(same code, message and hint), or, when no answer came, ``UpstreamUnavailable`` /
``UpstreamTimeout`` (node) or ``ControlPlaneError`` (control plane). Importing this package
loads numpy and httpx, nothing heavier (no onnxruntime, fastapi, aiohttp).
"""

from __future__ import annotations

from tierlink.client.aio import AsyncClient
from tierlink.client.results import (
    Accepted,
    AsyncResult,
    InferResult,
    ModelEntry,
    ModelMetadata,
    TensorMetadata,
)
from tierlink.client.sync import Client
from tierlink.client.tls import ClientTLS

__all__ = ["Accepted", "AsyncClient", "AsyncResult", "Client", "ClientTLS", "InferResult",
           "ModelEntry", "ModelMetadata", "TensorMetadata"]
