"""The scheduler's admission control: whether a job can be taken now, refused AT ONCE when
not (``AdmissionRefused`` with the numbers that decided it), and the wait a new job would
have — the node's own estimate of its queue."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tierlink.core.types import Priority
from tierlink.errors import AdmissionRefused, DeadlineExceeded, EscalationShed
from tierlink.node.job_queue import Job, JobQueue
from tierlink.node.service_times import ServiceTimes

__all__ = ["ESCALATION_QUEUE_PER_WORKER", "Admission", "Ask", "escalation_queue", "expired",
           "shed"]

# Escalations a node takes while fewer than this many jobs per worker wait, unless its
# fleet entry says otherwise (``escalation_queue``).
ESCALATION_QUEUE_PER_WORKER = 4


def escalation_queue(configured: int | None, workers: int) -> int:
    """The queue depth at which a node refuses escalations: the fleet entry's, or 4 per
    worker."""
    return ESCALATION_QUEUE_PER_WORKER * workers if configured is None else configured

_HEADLINES = {"queue_full": "the queue is full",
              "deadline": "the deadline cannot be met here",
              "shutting_down": "the node is shutting down",
              "escalation_shed": "the queue is too deep for an escalation (its caller holds "
                                 "an answer)"}


@dataclass(frozen=True, slots=True)
class Ask:
    """What a job asks for: its class, its absolute deadline (None: none), its run time if
    the caller knows it better than the estimate of ``key``, and when it asks."""

    priority: Priority
    deadline_s: float | None
    cost_hint_ms: float | None
    key: str
    now: float
    optional: bool = False  # an escalation's: its caller holds an answer already


class Admission:
    """``max_queue`` jobs may wait beyond the ``workers`` running; a job with a deadline is
    taken only when its estimated wait and run fit in it; an optional job (an escalation)
    only while fewer than ``escalation_queue`` wait (0: only when a worker is free; None: as
    any other). ``on_refuse``
    hears each refusal (priority, reason); ``refused_by_reason`` counts them."""

    def __init__(self, max_queue: int, workers: int, times: ServiceTimes,
                 on_refuse: Callable[[Priority, str], None],
                 escalation_queue: int | None = None) -> None:
        self._max_queue, self._workers, self._times = max_queue, workers, times
        self._escalation_queue = escalation_queue
        self._on_refuse = on_refuse
        self.refused_by_reason: dict[str, int] = {}

    def wait_ms(self, queue: JobQueue, inflight: int, priority: Priority) -> float:
        """Expected wait before a job of ``priority`` submitted now would start.

        Jobs ahead = queued jobs with priority <= ``priority`` + jobs in flight. A worker frees
        for the new job once ``ahead - workers + 1`` of them finished; with ``workers``
        finishing in parallel that takes ``EWMA x that / workers``. 0 when a worker is free.
        Jobs of a higher class arriving later can still overtake (that is what expiry is for).
        """
        must_finish = inflight + queue.ahead(priority) - self._workers + 1
        if must_finish <= 0:
            return 0.0
        return self._times.overall_ms * must_finish / self._workers

    def check(self, ask: Ask, queue: JobQueue, inflight: int, busy: int,
              closing: bool) -> None:
        """Raise ``AdmissionRefused`` if the job cannot be taken; otherwise return."""
        if closing:
            raise self._refuse("shutting_down", ask, queue, inflight)
        must_queue = busy >= self._workers or len(queue) > 0
        if must_queue and len(queue) >= self._max_queue:
            raise self._refuse("queue_full", ask, queue, inflight)
        if (ask.optional and must_queue and self._escalation_queue is not None
                and len(queue) >= self._escalation_queue):
            raise self._refuse("escalation_shed", ask, queue, inflight)
        if ask.deadline_s is None:
            return
        if (self.wait_ms(queue, inflight, ask.priority) + self._service_ms(ask)
                > (ask.deadline_s - ask.now) * 1000.0):
            raise self._refuse("deadline", ask, queue, inflight)

    def _service_ms(self, ask: Ask) -> float:
        return ask.cost_hint_ms if ask.cost_hint_ms is not None else self._times.estimate_ms(
            ask.key)

    def _refuse(self, reason: str, ask: Ask, queue: JobQueue,
                inflight: int) -> AdmissionRefused:
        """Count a refusal and build the error, with the numbers that decided it."""
        self.refused_by_reason[reason] = self.refused_by_reason.get(reason, 0) + 1
        self._on_refuse(ask.priority, reason)
        wait_ms = self.wait_ms(queue, inflight, ask.priority)
        service_ms = self._service_ms(ask)
        remaining_ms = None if ask.deadline_s is None else (ask.deadline_s - ask.now) * 1000.0
        budget = "no deadline" if remaining_ms is None else f"{remaining_ms:.1f} ms left"
        state = (f"queue {len(queue)}/{self._max_queue}, {inflight} in flight on "
                 f"{self._workers} workers, estimated wait {wait_ms:.1f} ms + service "
                 f"{service_ms:.1f} ms, {budget}")
        error = EscalationShed if reason == "escalation_shed" else AdmissionRefused
        return error(
            f"admission refused ({reason}): {_HEADLINES[reason]}: {state}",
            reason=reason, priority=ask.priority.label, queue_depth=len(queue),
            max_queue=self._max_queue, inflight=inflight, workers=self._workers,
            estimated_wait_ms=round(wait_ms, 3), estimated_service_ms=round(service_ms, 3),
            remaining_ms=None if remaining_ms is None else round(remaining_ms, 3))


def expired(job: Job, now: float) -> DeadlineExceeded:
    """What an admitted job is told when its deadline passed while it waited."""
    waited_ms = (now - job.enqueued_at) * 1000.0
    late_ms = (now - job.deadline) * 1000.0
    return DeadlineExceeded(
        f"deadline passed while queued: waited {waited_ms:.1f} ms, the deadline was "
        f"{late_ms:.1f} ms ago; the job was not run",
        waited_ms=round(waited_ms, 3), late_ms=round(late_ms, 3), priority=job.priority.label)


def shed(job: Job) -> AdmissionRefused:
    """What a job still queued is told when the node shuts down."""
    return AdmissionRefused("the node is shutting down: this queued job was not run",
                            reason="shutting_down", priority=job.priority.label)
