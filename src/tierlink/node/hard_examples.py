"""The node side of the hard-example loop: inputs the node was unsure of, sent for retraining.

When the dispatcher escalates a *local* answer because its confidence is below the cascade
threshold, the node offers that answer here. What may leave the device is decided by one
pure rule, :func:`may_export`: only low-confidence escalations, and only inputs whose privacy
level lets a node of the control plane's tier hold them (``local`` never; ``site`` only when
the control plane is declared at tier ``edge`` or below). Within a batch, only the rows that
are themselves below the threshold go: a confident row is not a hard example.

:class:`HardExampleUploader` keeps the examples in a bounded queue (full: the oldest is
dropped and counted) and a background task hands them on in batches to its sink, one of:

* :class:`OutboxSink` (a node with a ``state_dir`` and a control plane): each example becomes
  an item of kind ``hard_example`` in the node's durable outbox toward ``control``
  (:mod:`tierlink.node.uplink`), under :func:`example_key`; the outbox delivers it to the
  control plane's ``POST /v1/results`` across restarts and outages, and the control plane
  stores it once. The uploader flushes as soon as an example is queued (``eager``), so
  examples wait in memory only as long as a local write; when the outbox is full, its
  oldest hard examples are evicted (``drop_oldest``, ``tierlink_outbox_dropped_total
  {reason="full"}``).
* :class:`~tierlink.control.client.ControlClient` (a node without a ``state_dir``): batches
  are posted straight to ``POST /v1/hard-examples``, every ``flush_interval_s`` or as soon as
  ``batch_size`` wait; they are lost if the node restarts before the control plane has them.

A batch the sink does not take is retried with exponential backoff; nothing here ever raises
into the request path or blocks it.

Outcomes counted in examples, i.e. batch rows (``count(outcome, n)``, the node's
``tierlink_hard_examples_total``):
``withheld`` (privacy keeps it on the node), ``sampled_out``, ``skipped`` (a request with
several input tensors, which is not supported, counts 1), ``queued``, ``sent`` (handed on:
accepted by the control plane, or durable in the node's outbox, whose deliveries are
``tierlink_outbox_delivered_total{kind="hard_example"}``), ``dropped`` (queue full),
``upload_failed`` (in a batch the sink did not take; it is retried).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tierlink.core.types import Placement, Privacy, Request, Tier
from tierlink.errors import TierlinkError
from tierlink.node.uplink import CONTROL, Uplink
from tierlink.settings.hard_examples import HardExampleConfig
from tierlink.transport.oip import datatype_of, numpy_dtype

log = logging.getLogger("tierlink.node.hard_examples")

Count = Callable[[str, int], None]
UNKNOWN_LABEL = -1
KIND = "hard_example"  # the outbox item kind (the control plane's handler is keyed by it)


def may_export(privacy: Privacy, store_tier: Tier, *, low_confidence: bool) -> bool:
    """May an input of ``privacy`` be sent to a hard-example store at ``store_tier``?

    Only an input escalated *for low confidence* is a hard example (one escalated after a
    failure is not), and only if its privacy level lets a node of the store's tier hold it.
    The store is never the origin device, so ``local`` inputs never qualify.
    """
    return low_confidence and privacy.allows(store_tier, at_origin=False)


def hard_rows(probabilities: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of the batch rows whose confidence (max probability) is below ``threshold``."""
    confidence = probabilities.max(axis=1)  # (B,)
    return np.flatnonzero(confidence < threshold)


@dataclass(frozen=True, slots=True)
class HardExample:
    """One input row the node was unsure of, with what it answered."""

    request_id: str
    row: int  # index in the request's batch
    node_id: str
    model: str
    task: str
    privacy: Privacy
    prediction: int
    confidence: float
    threshold: float
    label: int  # -1: unknown
    created_at: float  # epoch seconds, when the node escalated it
    input: np.ndarray  # one batch row, e.g. (1, 28, 28)

    def to_wire(self) -> dict[str, Any]:
        """The JSON form the control plane accepts (``POST /v1/hard-examples``): the tensor
        as base64 of its raw little-endian bytes, with its datatype and shape."""
        datatype = datatype_of(self.input.dtype)
        raw = np.ascontiguousarray(self.input, dtype=numpy_dtype(datatype)).tobytes()
        return {"request_id": self.request_id, "row": self.row, "node_id": self.node_id,
                "model": self.model, "task": self.task, "privacy": self.privacy.value,
                "prediction": self.prediction, "confidence": self.confidence,
                "threshold": self.threshold, "label": self.label,
                "created_at": self.created_at,
                "input": {"datatype": datatype, "shape": list(self.input.shape),
                          "data": base64.b64encode(raw).decode("ascii")}}


def build_examples(node_id: str, placement: Placement, req: Request, x: np.ndarray,
                   probabilities: np.ndarray, labels: tuple[int, ...] | None,
                   now: float, rows: np.ndarray | None = None) -> list[HardExample]:
    """The hard examples of one escalated answer: ``x`` (B, ...) and ``probabilities``
    (B, C) of the local model; one example per row below the placement's threshold
    (``rows``, when the caller has already computed :func:`hard_rows`)."""
    threshold = float(placement.escalate_below or 0.0)
    if rows is None:
        rows = hard_rows(probabilities, threshold)
    out = []
    for row in rows.tolist():
        p = probabilities[row]  # (C,)
        out.append(HardExample(
            request_id=req.request_id, row=row, node_id=node_id,
            model=placement.model or "", task=req.task, privacy=req.privacy,
            prediction=int(p.argmax()), confidence=float(p.max()), threshold=threshold,
            label=labels[row] if labels is not None else UNKNOWN_LABEL, created_at=now,
            input=np.array(x[row]),  # a copy: the request's buffer is not ours to keep
        ))
    return out


def example_key(node_id: str, request_id: str, model: str, row: int, created_at: float) -> str:
    """The idempotency key of a hard example in the outbox:
    ``<node>:<request id (first 64 chars)>:<row>:<digest>``.

    The digest (16 hex of SHA-256) covers every field the control plane's store tells
    examples apart by (``UNIQUE (node_id, request_id, model, row, created_at)``), so two
    examples the store would keep apart never share a key (a shared key would be answered
    ``duplicate`` and lost), and a retried example keeps its key. At most ~150 characters
    whatever the request id (the wire allows 256)."""
    identity = json.dumps([node_id, request_id, model, row, created_at])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return f"{node_id}:{request_id[:64]}:{row}:{digest}"


class ExampleSink(Protocol):
    """Where batches go: :class:`~tierlink.control.client.ControlClient`, or a fake.
    Raises a :class:`~tierlink.errors.TierlinkError` when the batch was not accepted."""

    async def post_hard_examples(self, examples: Sequence[Mapping[str, Any]]) -> Any: ...


class OutboxSink:
    """An :class:`ExampleSink` over the node's durable outbox (see the module doc): each
    example (a :meth:`HardExample.to_wire` dict) is put as a ``hard_example`` item toward
    ``control`` under :func:`example_key`. Returns when every example is fsynced; raises
    :class:`~tierlink.errors.OutboxError` when the outbox cannot take them (a failing disk).
    A retried batch stores nothing twice: a key still waiting is not put again, and one
    already delivered is answered ``duplicate`` by the control plane."""

    def __init__(self, uplink: Uplink) -> None:
        self._uplink = uplink

    async def post_hard_examples(self, examples: Sequence[Mapping[str, Any]]) -> int:
        await asyncio.to_thread(self._put_all, examples)  # fsyncs: off the event loop
        self._uplink.kick(CONTROL)
        return len(examples)

    def _put_all(self, examples: Sequence[Mapping[str, Any]]) -> None:
        for example in examples:
            key = example_key(example["node_id"], example["request_id"], example["model"],
                              example["row"], example["created_at"])
            self._uplink.enqueue(KIND, key, dict(example), CONTROL)


class Backoff:
    """Delays after consecutive failures: ``first_s``, doubling, at most ``max_s``."""

    def __init__(self, first_s: float = 1.0, max_s: float = 30.0) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.failures = 0

    def next_delay(self) -> float:
        self.failures += 1
        return float(min(self.max_s, self.first_s * 2 ** (self.failures - 1)))

    def reset(self) -> None:
        self.failures = 0


class HardExampleUploader:
    """Queue hard examples on the node and post them in the background (see module doc).

    ``offer`` is called by the dispatcher on the event loop for every low-confidence local
    escalation; it only decides and enqueues (a copy of each hard row). ``start`` (from a
    running loop) begins the background flushes; ``stop`` ends them after one last attempt.
    ``rng`` draws the sampling (seeded by the node); ``wall_clock`` stamps ``created_at``.
    ``eager``: flush as soon as an example is queued rather than every ``flush_interval_s``
    (for a local durable sink, :class:`OutboxSink`: examples should not wait in memory).
    """

    def __init__(self, sink: ExampleSink, config: HardExampleConfig, node_id: str, *,
                 count: Count = lambda _outcome, _n: None, rng: random.Random | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 backoff: Backoff | None = None, eager: bool = False) -> None:
        self.config, self.node_id = config, node_id
        self._sink, self._count = sink, count
        self.eager = eager
        self._rng = rng or random.Random(0)
        self._wall_clock = wall_clock
        self._backoff = backoff or Backoff()
        self._queue: deque[HardExample] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.upload_failures = 0

    @property
    def pending(self) -> int:
        return len(self._queue)

    def offer(self, placement: Placement, req: Request, inputs: Mapping[str, np.ndarray],
              probabilities: np.ndarray | None, labels: tuple[int, ...] | None) -> None:
        """Consider one low-confidence local escalation. Never raises, never blocks."""
        try:
            self._offer(placement, req, inputs, probabilities, labels)
        except Exception:  # the loop must never break serving
            log.exception("could not queue a hard example of request %s", req.request_id)
            self._count("skipped", 1)

    def _offer(self, placement: Placement, req: Request, inputs: Mapping[str, np.ndarray],
               probabilities: np.ndarray | None, labels: tuple[int, ...] | None) -> None:
        if probabilities is None or len(inputs) != 1:
            self._count("skipped", 1)
            return
        rows = hard_rows(probabilities, placement.escalate_below or 0.0)
        if not may_export(req.privacy, self.config.store_tier, low_confidence=True):
            self._count("withheld", len(rows))
            return
        if self._rng.random() >= self.config.sample_rate:
            self._count("sampled_out", len(rows))
            return
        x = next(iter(inputs.values()))
        examples = build_examples(self.node_id, placement, req, x, probabilities, labels,
                                  self._wall_clock(), rows)
        self._enqueue(examples)

    def _enqueue(self, examples: Sequence[HardExample]) -> None:
        self._queue.extend(examples)
        self._count("queued", len(examples))
        self._trim()
        if self.eager or len(self._queue) >= self.config.batch_size:
            self._wake.set()

    def _trim(self) -> None:
        overflow = len(self._queue) - self.config.max_queue
        for _ in range(max(0, overflow)):
            self._queue.popleft()  # the oldest: newer examples reflect the current model
        if overflow > 0:
            self._count("dropped", overflow)

    async def flush(self) -> bool:
        """Post up to ``batch_size`` queued examples. True when the queue was empty or the
        batch was accepted; on failure the batch goes back to the front of the queue."""
        if not self._queue:
            return True
        batch = [self._queue.popleft()
                 for _ in range(min(self.config.batch_size, len(self._queue)))]
        try:
            await self._sink.post_hard_examples([e.to_wire() for e in batch])
        except TierlinkError as exc:
            self._requeue(batch)
            self._failed(exc, len(batch))
            return False
        except BaseException:  # cancelled (shutdown) or a bug: keep the batch, re-raise
            self._requeue(batch)
            raise
        self._count("sent", len(batch))
        if self._backoff.failures:
            log.info("hard examples are handed on again")
        self._backoff.reset()
        return True

    def _requeue(self, batch: list[HardExample]) -> None:
        self._queue.extendleft(reversed(batch))
        self._trim()

    def _failed(self, exc: TierlinkError, n: int) -> None:
        self.upload_failures += 1
        self._count("upload_failed", n)
        if not self._backoff.failures:  # once per outage, not per retry
            log.warning("could not hand hard examples on (%s); retrying with backoff, "
                        "%d waiting", exc, len(self._queue))

    def start(self) -> asyncio.Task[None]:
        """Begin flushing in the background. Call from a running event loop."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="tierlink-hard-examples")
        return self._task

    async def stop(self, timeout_s: float = 1.0) -> None:
        """Stop the background task, then try once more to send what waits (bounded)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), timeout_s)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.flush_interval_s)
            self._wake.clear()
            while self._queue:
                if not await self._flush_safely():
                    await asyncio.sleep(self._backoff.next_delay())
                    break

    async def _flush_safely(self) -> bool:
        try:
            return await self.flush()
        except Exception:  # a bug here must not end the loop
            log.exception("hard-example flush failed unexpectedly")
            return False


def uploader_for(config: HardExampleConfig, node_id: str, seed: int, uplink: Uplink | None,
                 sink: ExampleSink | None, count: Callable[[str, int], None]
                 ) -> HardExampleUploader | None:
    """A node's uploader: through its durable outbox when its uplink reaches the control
    plane (``sink`` is then unused), else straight to ``sink``; None: nowhere to send, or
    the loop is off."""
    if uplink is not None and CONTROL in uplink.destinations:
        sink = OutboxSink(uplink)
    if sink is None or not config.enabled:
        return None
    return HardExampleUploader(sink, config, node_id, count=count,
                               rng=random.Random(seed + 1), eager=isinstance(sink, OutboxSink))
