"""Continuous batching: one thread runs the model; every step it takes one step of every
active job (a prompt chunk, a decode token, a verification) as one ragged forward pass.

Jobs join and leave between steps, so a long generation never holds a short one back and
the verifier batches the verification steps of many devices. Admission bounds the number
of sequences and the KV bytes they reserve; jobs beyond it wait in order (``queued``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from tierlink.errors import TierlinkError
from tierlink.llm.kvcache import KVCache
from tierlink.llm.model import LlamaModel, Step

log = logging.getLogger("tierlink.llm")


class Job(Protocol):
    cancelled: bool
    cache: KVCache

    def next_step(self) -> Step: ...
    def take(self, logits: torch.Tensor) -> bool: ...
    def cancel_if_asked(self) -> bool: ...
    def fail(self, exc: BaseException) -> None: ...


@dataclass
class EngineStats:
    passes: int = 0  # forward passes
    rows: int = 0  # token rows computed
    busy_s: float = 0.0  # wall time inside forward passes
    cpu_s: float = 0.0  # this thread's CPU time inside them
    queued: int = 0
    running: int = 0


class Engine:
    def __init__(self, model: LlamaModel, *, max_sequences: int = 32, max_rows: int = 512,
                 kv_budget_bytes: int | None = None, threads: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.max_sequences = max_sequences
        self.max_rows = max_rows
        self.kv_budget_bytes = kv_budget_bytes
        self.threads = threads
        self.clock = clock
        self.stats = EngineStats()
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._active: list[Job] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.on_pass: Callable[[int, float], None] | None = None  # (rows, seconds)
        # How many verifications to expect in one pass (devices drafting now), and how long
        # the first may wait for the others.
        self.expected_verifiers: Callable[[], int] | None = None
        self.batch_wait_s = 0.0
        # Learned: how long a device takes to send its next verification after its verdict
        # (its round trip, and its drafting unless it drafted ahead), and a verification
        # pass's time — a lone verification waits for the others up to their return, at most
        # half a pass (what not waiting would cost them), however short batch_wait_s is.
        self.return_gap_s: float | None = None
        self.verify_pass_s: float | None = None
        self._answered: dict[int, float] = {}  # a verifier cache's id -> its last verdict
        self._last_verified = 0.0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tierlink-llm", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise TierlinkError("the language model engine is stopping")
            if getattr(job, "kind", "") == "verify":
                self._returned(job)
            self._waiting.append(job)
            self.stats.queued = len(self._waiting)
            self._cond.notify_all()

    def wake(self) -> None:
        """A job was cancelled from outside: let the loop notice."""
        with self._cond:
            self._cond.notify_all()

    # -- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_num_threads(self.threads)
        while True:
            with self._cond:
                while not self._stopping and not self._waiting and not self._active:
                    self._cond.wait()
                if self._stopping:
                    break
                self._admit()
            self._active = [j for j in self._active if not j.cancel_if_asked()]
            self.stats.running = len(self._active)
            if self._active and not self._hold_for_verifications():
                self._step()
        for job in [*self._active, *self._waiting]:
            job.fail(TierlinkError("the language model engine stopped"))

    def _hold_for_verifications(self) -> bool:
        """Only verifications are waiting and more devices are expected to send theirs
        within ``batch_wait_s`` of the oldest: wait (once) so one pass serves them all.
        A verification costs a weight read of the whole model however few rows it has."""
        if self.batch_wait_s <= 0 or self.expected_verifiers is None:
            return False
        pending = [j for j in self._active if getattr(j, "kind", "") == "verify"]
        if len(pending) != len(self._active) or len(pending) >= self.expected_verifiers():
            return False
        until = min(getattr(j, "submitted", 0.0) for j in pending) + self.batch_wait_s
        if self.return_gap_s is not None and self.verify_pass_s is not None:
            until = max(until, self._last_verified + min(RETURN_MARGIN * self.return_gap_s,
                                                         self.verify_pass_s / 2))
        left = until - time.monotonic()
        if left <= 0:
            return False
        with self._cond:
            if not self._waiting and not self._stopping:
                self._cond.wait(timeout=left)
            self._admit()
        return True

    def _admit(self) -> None:
        while self._waiting and len(self._active) < self.max_sequences:
            if self.kv_budget_bytes is not None and self._active and \
                    self._reserved() >= self.kv_budget_bytes:
                break
            self._active.append(self._waiting.popleft())
        self.stats.queued = len(self._waiting)
        self.stats.running = len(self._active)

    def _reserved(self) -> int:
        return sum(j.cache.bytes_reserved() for j in self._active)

    def _step(self) -> None:
        batch: list[tuple[Job, Step]] = []
        rows = 0
        steps = [(j, j.next_step()) for j in self._active]
        steps.sort(key=lambda js: js[1].block)  # decode and verify rows before prompt chunks
        for job, step in steps:
            if batch and rows + len(step.tokens) > self.max_rows:
                continue
            try:
                step.cache.make_room(len(step.tokens), self.model.rope.shift)
            except TierlinkError as exc:
                job.fail(exc)
                self._active.remove(job)
                continue
            batch.append((job, step))
            rows += len(step.tokens)
        if not batch:
            return
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            logits = self.model.forward([s for _, s in batch])
        except Exception as exc:  # a failing pass fails its jobs; the engine keeps serving
            log.exception("language model forward pass failed")
            for job, _ in batch:
                job.fail(exc)
                self._active.remove(job)
            return
        seconds = time.perf_counter() - wall
        self.stats.passes += 1
        self.stats.rows += rows
        self.stats.busy_s += seconds
        self.stats.cpu_s += time.thread_time() - cpu
        if self.on_pass is not None:
            self.on_pass(rows, seconds)
        for (job, _), out in zip(batch, logits, strict=True):
            if job.take(out):
                self._active.remove(job)
        if all(getattr(job, "kind", "") == "verify" for job, _ in batch):
            self._verified(batch, seconds)
        self.stats.running = len(self._active)

    def _verified(self, batch: list[tuple[Job, Step]], seconds: float) -> None:
        """A pass of verifications only ended: its time, and when each device was answered
        (their next verifications' return gaps are measured from it)."""
        now = time.monotonic()
        self.verify_pass_s = _ewma(self.verify_pass_s, seconds)
        self._last_verified = now
        with self._cond:
            for job, _ in batch:
                if job not in self._active:
                    self._answered[id(job.cache)] = now
            for key in [k for k, t in self._answered.items() if now - t > MAX_RETURN_S]:
                del self._answered[key]

    def _returned(self, job: Job) -> None:
        """A device's next verification arrived (under the lock): learn its return gap."""
        answered = self._answered.pop(id(job.cache), None)
        gap = getattr(job, "submitted", 0.0) - answered if answered is not None else -1.0
        if 0.0 <= gap <= MAX_RETURN_S:
            self.return_gap_s = _ewma(self.return_gap_s, gap)


RETURN_MARGIN = 2.0  # wait up to twice the learned return gap (the later devices come later)
MAX_RETURN_S = 1.0  # a device back after longer was not waiting on its verdict


def _ewma(old: float | None, new: float, weight: float = 0.2) -> float:
    return new if old is None else old + weight * (new - old)
