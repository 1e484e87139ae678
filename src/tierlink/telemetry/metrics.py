"""Prometheus metrics of one node, one vocabulary on every tier.

Every series carries ``tier``; Prometheus adds ``instance`` (the node) when it scrapes, so
node ids are not a label here except where a series is *about* another node (``upstream``).
The node's components report through :class:`NodeMetrics`; nothing in the core imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tierlink.core.types import Outcome, Priority

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from tierlink.telemetry.process import ProcessState

# The labels of the bill (``tierlink_cost_usd_total``), what ``tierlink cost`` groups by.
COST_LABELS = ("task", "model", "version", "path", "site", "tier", "part")
PATH_KINDS = ("local", "escalated", "split", "remote", "mirror")

# Latency buckets from 0.5 ms to 10 s: device answers are sub-millisecond, cloud ones ~100 ms.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class NodeMetrics:
    """All series a node exports. Create one per node process (own registry)."""

    def __init__(self, tier: str, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry or CollectorRegistry()
        self.tier = tier
        self.process: ProcessState | None = None  # the process_* series: watch_process()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter("tierlink_requests_total",
                                "Requests handled, by entry point, model or task, and outcome",
                                ["tier", "kind", "model", "outcome"], registry=r)
        self.latency = Histogram("tierlink_request_duration_seconds",
                                 "Time from receipt to answer at this node",
                                 ["tier", "kind", "model", "outcome"], buckets=LATENCY_BUCKETS,
                                 registry=r)
        self.sla = Counter("tierlink_sla_requests_total",
                           "Routed requests that entered the fleet here, by priority and "
                           "result: met / missed (answered within / after the deadline), "
                           "refused (429/503), failed (other 5xx), invalid (4xx)",
                           ["tier", "task", "priority", "result"], registry=r)
        self.compute = Histogram("tierlink_compute_duration_seconds",
                                 "Model runtime time per call", ["tier", "model"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("tierlink_queue_wait_seconds", "Time waiting for a worker",
                                    ["tier", "priority"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("tierlink_batch_size",
                                    "Requests run together in one batched model run",
                                    ["tier", "model"], buckets=BATCH_BUCKETS, registry=r)
        self.batch_hold = Histogram("tierlink_batch_hold_seconds",
                                    "How long a batch's first request was held for others "
                                    "to join (batching.max_delay_ms)", ["tier", "model"],
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("tierlink_queue_depth", "Jobs waiting for a worker",
                                 ["tier", "priority"], registry=r)
        self.inflight = Gauge("tierlink_inflight_requests", "Requests being handled now",
                              ["tier"], registry=r)
        self.admission_refused = Counter("tierlink_admission_refused_total",
                                         "Requests refused at once by admission control",
                                         ["tier", "reason"], registry=r)
        self.placements = Counter("tierlink_placements_total",
                                  "Routing decisions by the option chosen",
                                  ["tier", "policy", "option"], registry=r)
        self.split_requests = Counter("tierlink_split_requests_total",
                                      "Requests answered by a split plan started here "
                                      "(head here, tail upstream)",
                                      ["tier", "model", "codec"], registry=r)
        self.shadow_dropped = Counter("tierlink_shadow_decisions_dropped_total",
                                      "Shadow-mode decisions that could not be written to "
                                      "the log (the request was answered all the same)",
                                      ["tier"], registry=r)
        self.early_exits = Counter("tierlink_early_exits_total",
                                   "Answers of a multi-exit model, by the exit that gave them",
                                   ["tier", "model", "exit"], registry=r)
        self.escalations = Counter("tierlink_escalations_total",
                                   "Answers passed upstream for low confidence",
                                   ["tier", "model"], registry=r)
        self.fallbacks = Counter("tierlink_fallbacks_total",
                                 "Placements that failed and were replaced by the next one",
                                 ["tier", "upstream", "reason"], registry=r)
        self.retries = Counter("tierlink_retries_total", "Retries on the same upstream",
                               ["tier", "upstream"], registry=r)
        self.hedges = Counter(
            "tierlink_hedges_total",
            "Hedged calls by the hedge's upstream and outcome: sent, won (the hedge answered "
            "first), lost (the first call did), no_budget (late, but the budget was spent)",
            ["tier", "upstream", "outcome"], registry=r)
        self.breaker_state = Gauge("tierlink_breaker_open",
                                   "1 while the circuit breaker to an upstream is open",
                                   ["tier", "upstream"], registry=r)
        self.inputs_received = Counter("tierlink_inputs_received_total",
                                       "Raw inputs this node received, by privacy and verdict",
                                       ["tier", "privacy", "verdict"], registry=r)
        self.routing_revision = Gauge(
            "tierlink_routing_revision",
            "The fleet routing revision this node places requests under (0: its spec file's)",
            ["tier"], registry=r)
        self.routing_refused = Counter(
            "tierlink_routing_revisions_refused_total",
            "Routing revisions this node could not make (it kept the one it runs)", ["tier"],
            registry=r)
        self.privacy_refusals = Counter(
            "tierlink_privacy_refusals_total",
            "Plans this node's router refused for moving an input further than its privacy "
            "allows, by the policy that made them", ["tier", "privacy", "policy"], registry=r)
        self.confidence = Histogram("tierlink_confidence", "Confidence of local answers",
                                    ["tier", "model"],
                                    buckets=(0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0),
                                    registry=r)
        self.cost = Counter(
            "tierlink_cost_usd_total",
            "What answers cost (USD), counted once, by the node each request entered: by "
            "task, the model and version that answered, how (path: local, escalated, split, "
            "remote; mirror: an answer asked again of the most capable model), the entry node's site, and the tier and part (compute there, transfer "
            "into it) each dollar went to",
            ["task", "model", "version", "path", "site", "tier", "part"], registry=r)
        self.billed = Counter(
            "tierlink_billed_requests_total",
            "Requests answered, counted once, by the node each entered: by task, path kind "
            "and site (what cost per request divides by)", ["task", "path", "site"],
            registry=r)
        self.mirrors = Counter(
            "tierlink_mirrors_total",
            "Answers of this node's models sampled for mirroring (routing.mirror), by what "
            "became of them: compared, busy (every mirror slot taken: skipped), shed (turned "
            "away for load or its deadline), failed, "
            "refused (no plan), no_label, incomparable (answers of different shapes)",
            ["outcome"], registry=r)
        self.mirrored = Counter(
            "tierlink_mirrored_samples_total",
            "Answered samples the most capable model their privacy allows answered again, "
            "by the task, model and version that answered them first", ["task", "model",
                                                                         "version"],
            registry=r)
        self.mirror_agreed = Counter(
            "tierlink_mirror_agreed_samples_total",
            "Mirrored samples the most capable model answered with the same label (agreement "
            "= this / tierlink_mirrored_samples_total)", ["task", "model", "version"],
            registry=r)
        self.control_stale = Gauge("tierlink_view_age_seconds",
                                   "Age of the cached cluster view", ["tier"], registry=r)
        self.hard_examples = Counter(
            "tierlink_hard_examples_total",
            "Hard examples (input rows escalated for low confidence) by what became of them: "
            "queued, sent, dropped (queue full), withheld (privacy), sampled_out, skipped, "
            "upload_failed (in a batch the control plane did not accept; retried)",
            ["tier", "outcome"], registry=r)
        self.model_info = Gauge("tierlink_model_info",
                                "1 per model served: its version, output kind and the "
                                "execution provider that runs it",
                                ["tier", "model", "version", "kind", "provider"], registry=r)
        self.overload_shed = Counter(
            "tierlink_overload_shed_total",
            "Routed requests the overload gate held back, by priority and what became of "
            "them: waited (then admitted) or refused (429 with Retry-After)",
            ["tier", "priority", "outcome"], registry=r)
        self.overload_level = Gauge("tierlink_overload_level",
                                    "Admission level: 3 every class, 2 realtime and "
                                    "interactive, 1 realtime only (fractions in between)",
                                    ["tier"], registry=r)
        self.loop_lag = Gauge("tierlink_event_loop_lag_seconds",
                              "How late the event loop ran per second of the last window (s/s)",
                              ["tier"], registry=r)
        self.peer_refusals = Counter(
            "tierlink_peer_refusals_total",
            "Requests refused because their sender may not make their claims (TLS fleets): "
            "forged_origin, unauthenticated_peer, local_forwarded, replayed",
            ["tier", "reason"], registry=r)
        self.hard_examples_pending = Gauge("tierlink_hard_examples_pending",
                                           "Hard examples waiting to be sent", ["tier"],
                                           registry=r)

    def watch_process(self) -> None:
        """Export this process's CPU, memory and open files (``process_*``): a node's own
        process does, once; tests and the simulator, sharing one process, do not."""
        from tierlink.telemetry.process import ProcessState

        if self.process is None:
            self.process = ProcessState(self.registry)

    def bill(self, task: str, outcome: Outcome, node_id: str, site: str,
             path: str | None = None) -> None:
        """Count what an answer cost, once, at the node the request entered (``node_id``):
        each part of its bill under the tier it went to. ``path``: the path kind when the
        outcome does not say it: a mirror's, whose cost is on the bill but which is no
        request of anyone's and so is not in ``tierlink_billed_requests_total``)."""
        path = path or path_kind(outcome, node_id)
        if path != "mirror":
            self.of(self.billed, task, path, site).inc()
        for tier, part, usd in outcome.bill.items():
            self.of(self.cost, task, outcome.model, outcome.model_version, path, site,
                    tier.label, part).inc(usd)

    def count_mirrored(self, task: str, model: str, version: str, samples: int,
                       agreed: int) -> None:
        """What a mirror found for one answer of ``model`` ``version``."""
        self.mirrored.labels(task, model, version).inc(samples)
        self.mirror_agreed.labels(task, model, version).inc(agreed)

    def count_hard_examples(self, outcome: str, n: int) -> None:
        """The hard-example uploader's ``count`` callback."""
        self.hard_examples.labels(self.tier, outcome).inc(n)

    # -- scheduler observer protocol ---------------------------------------------------

    # Queue depth and in-flight are read from the scheduler at scrape time (set_function),
    # so they cannot drift when a waiting job is cancelled.

    def of(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept at hand: a series a request counts is looked up
        once, not validated and locked on every request (never for a series that is removed:
        ``model_info``)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def on_admit(self, priority: Priority) -> None:
        return None

    def on_refuse(self, priority: Priority, reason: str) -> None:
        self.admission_refused.labels(self.tier, reason).inc()

    def on_start(self, priority: Priority, waited_s: float) -> None:
        self.of(self.queue_wait, self.tier, Priority(priority).label).observe(waited_s)

    def on_finish(self, priority: Priority, run_s: float, ok: bool) -> None:
        return None

    def on_expire(self, priority: Priority) -> None:
        self.admission_refused.labels(self.tier, "expired").inc()

    def on_batch(self, key: str, size: int, held_s: float) -> None:
        self.of(self.batch_size, self.tier, key).observe(size)
        self.of(self.batch_hold, self.tier, key).observe(held_s)

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def path_kind(outcome: Outcome, node_id: str) -> str:
    """How a request entering ``node_id`` was answered: by a split plan, after escalating
    for low confidence, here, or by an upstream it was sent to (:data:`PATH_KINDS`)."""
    if outcome.split:
        return "split"
    if outcome.escalations:
        return "escalated"
    return "local" if outcome.served_by == node_id else "remote"
