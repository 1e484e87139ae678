"""A language model split across nodes (``llm/layer_split.py``): the device runs the
embedding and its model's first ``cut`` layers over the prompt and then over each new
token, and sends only the rows' hidden states; the upstream runs the rest with a KV cache
of its own and answers the next token. One round trip per token — what keeps a prompt's
text on its device while a larger machine runs most of the model.

**The hidden states carry information about the prompt**: after a few layers they are
close to the token embeddings, and inversion attacks recover much of the text from them.
The placement therefore sends them only where the prompt's *features* may go
(``Privacy.features_allowed``): a ``local`` prompt's only where the fleet sets
``routing.local_features_may_leave`` — the same rule as a CNN's split.

The wire: ``POST /tierlink/v1/llm/{model}/split?session=…&cut=…`` with the rows encoded by a
split codec (``split/codecs.py``, self-describing) as the body and the sampling in the
query; the answer is ``{"token": id, "server_ms": …}``. ``DELETE …/split/{session}`` frees
the sequence's cache there when the answer ends.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tierlink.chat.sequence import UpstreamSequence
from tierlink.errors import InvalidRequest, TierlinkError
from tierlink.llm.results import Chunk, Generation, Timing
from tierlink.llm.source import model_named
from tierlink.security.names import expect_node

if TYPE_CHECKING:
    import ssl

    from tierlink.chat.speculating import VerifierLink
    from tierlink.llm.face import ServedModel
    from tierlink.llm.params import SamplingParams

MAX_BODY = 64 * 2**20  # one message's rows: a long prompt's hidden states, FP32


def split_path(model: str) -> str:
    return f"/tierlink/v1/llm/{model}/split"


def install_split_routes(app: FastAPI, models: Mapping[str, ServedModel]) -> None:
    @app.post(split_path("{name}"))
    async def tail(name: str, session: str, cut: int, request: Request) -> Response:
        from tierlink.transport.bodies import read_bounded

        start = time.perf_counter()
        try:
            guard = getattr(request.app.state, "peers", None)
            if guard is not None:  # on a node with TLS: a device's certificate
                guard.require(request.scope, "running a split model's layers")
            lm = model_named(models, name, "to run a split's layers")
            params = _sampling(request.query_params)
            hidden = _rows(await read_bounded(request, MAX_BODY, lambda size: InvalidRequest(
                f"split: {size} bytes of rows is over {MAX_BODY}")))
            token = await lm.split_tail(session, hidden, cut, params)
        except TierlinkError as exc:
            return JSONResponse(exc.to_dict(), exc.http_status)
        return JSONResponse({"token": token,
                             "server_ms": round((time.perf_counter() - start) * 1e3, 3)})

    @app.delete(split_path("{name}") + "/{session}", status_code=204,
                response_class=Response)
    async def release(name: str, session: str) -> Response:
        lm = models.get(name)
        if lm is not None:
            lm.release_tail(session)
        return Response(status_code=204)


def _sampling(query: Mapping[str, str]) -> SamplingParams:
    from tierlink.llm.params import SamplingParams

    try:
        seed = query.get("seed")
        return SamplingParams(max_tokens=1, temperature=float(query.get("temperature", 0.0)),
                              top_p=float(query.get("top_p", 1.0)),
                              seed=None if seed is None else int(seed))
    except ValueError as exc:
        raise InvalidRequest(f"split: bad sampling: {exc}") from None


def _rows(payload: bytes) -> Any:
    import torch

    from tierlink.split.codecs import decode_any

    return torch.from_numpy(decode_any(payload).astype("float32", copy=False))


class HttpTail(UpstreamSequence):
    """A device's side of the wire: one sequence, over the node's pooled HTTP session."""

    def __init__(self, http: aiohttp.ClientSession, link: VerifierLink, key: str,
                 cut: int, params: SamplingParams, timeout_s: float,
                 server_hostname: str | None = None) -> None:
        super().__init__(http, f"{link.url.rstrip('/')}{split_path(link.model)}", key,
                         timeout_s, server_hostname, "split upstream")
        self.query = {"session": key, "cut": str(cut),
                      "temperature": str(params.temperature), "top_p": str(params.top_p)}
        if params.seed is not None:
            self.query["seed"] = str(params.seed)
        self.sent_bytes = 0

    async def next_token(self, payload: bytes) -> int:
        self.sent_bytes += len(payload)
        return int((await self.call(params=self.query, data=payload))["token"])


class Splitting:
    """The device's side: each split model's link, and answers computed half here."""

    def __init__(self, node_id: str, links: Mapping[str, VerifierLink],
                 http: Callable[[], aiohttp.ClientSession],
                 tls: Callable[[], ssl.SSLContext | None]) -> None:
        self.node_id = node_id
        self.links = dict(links)  # model -> the upstream running its upper layers
        self._http = http
        self._tls = tls
        self._background: set[asyncio.Future[None]] = set()

    def view_fields(self, lm: Any) -> dict[str, Any]:
        """What placement reads of ``lm``'s split: where the rest runs, the share here."""
        if lm.name not in self.links:
            return {}
        return {"split": lm.source.split or "",
                "split_share": lm.source.split_cut / max(lm.config.num_layers, 1)}

    async def answer(self, req: Any, lm: Any, ids: list[int], report: Generation,
                     meta: dict[str, Any]) -> AsyncIterator[Chunk]:
        """``req`` (a ``ChatRequest``) answered with ``lm``'s first layers here."""
        from tierlink.llm.face import piece
        from tierlink.llm.jobs import Decoding, Event
        from tierlink.llm.kvcache import KVCache
        from tierlink.llm.text import Detokenizer
        from tierlink.split.codecs import get_codec

        link, src, params = self.links[lm.name], lm.source, req.params
        wire, cache = get_codec(src.split_codec), KVCache(lm.config)
        tail = HttpTail(self._http(), link, f"{self.node_id}:{uuid.uuid4().hex}",
                        src.split_cut, params, req.tierlink.deadline_ms / 1e3,
                        expect_node(link.node_id, self._tls()))
        report.prompt_tokens = len(ids)
        report.timing = timing = Timing(time.monotonic(), prompt_tokens=len(ids))
        events: list[Event] = []  # the upstream's tokens as the answer takes them
        decoding = Decoding(params, events.append, lm.codec.eos_ids, timing)
        detok = Detokenizer(lm.codec, params.stop)
        rows, head_s = ids, 0.0
        meta.update(served_by=link.node_id, tier=link.tier.label, model=link.model,
                    path=[self.node_id, link.node_id], mode="split", cut=src.split_cut,
                    codec=src.split_codec)
        try:
            while report.finish_reason is None:
                if detok.stopped:  # a stop sequence ended it
                    decoding.finish("stop", [])
                else:
                    t0 = time.perf_counter()
                    payload = await asyncio.to_thread(_encoded_head, wire, lm.model, cache,
                                                      rows, src.split_cut)
                    head_s += time.perf_counter() - t0
                    token = decoding.take(await tail.next_token(payload))
                    rows = [] if token is None else [token]
                for event in events:
                    chunk = piece(event, detok, report, timing)
                    if chunk is not None:
                        yield chunk
                events.clear()
        finally:
            timing.finished = time.monotonic()
            task = asyncio.ensure_future(tail.close())
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            meta.update(split_bytes=tail.sent_bytes,
                        timings_s={"head": round(head_s, 4),
                                   "upstream_server": round(tail.server_s, 4)})


def _encoded_head(wire: Any, model: Any, cache: Any, rows: list[int], cut: int) -> bytes:
    from tierlink.llm.layer_split import head_rows

    return bytes(wire.encode(head_rows(model, cache, rows, cut).numpy()))
