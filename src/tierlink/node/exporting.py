"""What a node exports to Prometheus beyond its request metrics: model info per served
version, install counts, queue and in-flight gauges, breaker states, and the dispatcher's
escalations, fallbacks, retries and hedges."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tierlink.core.types import Outcome, Priority
from tierlink.models.runtime import ModelRuntime
from tierlink.node import protocol
from tierlink.node.hard_examples import HardExampleUploader
from tierlink.node.models import ModelManager
from tierlink.node.scheduler import Scheduler
from tierlink.telemetry.metrics import NodeMetrics

__all__ = ["DispatchObserver", "NodeExports"]


class Traffic:
    """Cumulative counts of the routed requests that entered the fleet here, for the
    heartbeat (the control plane's fleet view turns them into rates): SLA results, where
    they were answered (by tier), how many escalated."""

    RESULTS = ("met", "missed", "refused", "failed", "invalid")

    def __init__(self) -> None:
        self.results = dict.fromkeys(self.RESULTS, 0)
        self.served: dict[str, int] = {}
        self.escalated = 0

    def count(self, result: str, outcome: Outcome | None) -> None:
        self.results[result] += 1
        if outcome is not None:
            self.served[outcome.tier.label] = self.served.get(outcome.tier.label, 0) + 1
            self.escalated += outcome.escalations > 0

    def to_dict(self) -> dict[str, Any]:
        return {**self.results, "served": dict(self.served), "escalated": self.escalated}


class NodeExports:
    def __init__(self, metrics: NodeMetrics, tier: str, models: ModelManager) -> None:
        self._m, self._tier = metrics, tier
        self.traffic = Traffic()
        self._model_info: dict[str, tuple[str, ...]] = {}  # model -> its info labels
        metrics.registry.register(_InstallsCollector(models, tier))

    def model_info(self, name: str, rt: ModelRuntime) -> None:
        """``tierlink_model_info`` = 1 for the version served now (its kind and provider)."""
        labels = (self._tier, name, rt.info.version, rt.info.spec_for(rt.outputs).kind,
                  getattr(rt, "provider", rt.platform))
        previous = self._model_info.get(name)
        if previous is not None and previous != labels:  # the version it replaces
            self._m.model_info.remove(*previous)
        self._model_info[name] = labels
        self._m.model_info.labels(*labels).set(1)

    def request(self, kind: str, name: str, outcome: str, seconds: float) -> None:
        self._m.of(self._m.requests, self._tier, kind, name, outcome).inc()
        self._m.of(self._m.latency, self._tier, kind, name, outcome).observe(seconds)

    def sla(self, task: str, params: Mapping[str, Any], server_ms: float | None,
            status: int, outcome: Outcome | None = None) -> None:
        """A routed request that entered the fleet here (not one forwarded to it): ``met``
        when answered within its deadline, ``missed`` when late, ``refused`` (429, 503: said
        so in time), ``failed`` (another 5xx), ``invalid`` (the caller's 4xx: no SLA)."""
        if params.get(protocol.HOPS) not in (None, 0):
            return
        try:
            priority = Priority.parse(params.get(protocol.PRIORITY, "interactive")).label
            deadline_ms = float(params.get(protocol.DEADLINE, protocol.DEFAULT_DEADLINE_MS))
        except (ValueError, TypeError, AttributeError):
            priority, deadline_ms = "invalid", 0.0
        if server_ms is not None:
            result = "met" if server_ms <= deadline_ms else "missed"
        else:
            result = "refused" if status in (429, 503) else \
                "failed" if status >= 500 else "invalid"
        self._m.of(self._m.sla, self._tier, task, priority, result).inc()
        self.traffic.count(result, outcome)

    def gauges(self, scheduler: Scheduler, inflight: Callable[[], int],
               uploader: HardExampleUploader | None) -> None:
        for p in Priority:
            self._m.queue_depth.labels(self._tier, p.label).set_function(
                _depth_of(scheduler, p))
        self._m.inflight.labels(self._tier).set_function(inflight)
        if uploader is not None:
            self._m.hard_examples_pending.labels(self._tier).set_function(
                lambda: uploader.pending)

    def breaker(self, node_id: str, state: str) -> None:
        self._m.breaker_state.labels(self._tier, node_id).set(1.0 if state == "open" else 0.0)


def _depth_of(scheduler: Scheduler, priority: Priority) -> Callable[[], float]:
    return lambda: float(scheduler.snapshot().queue_depth_by_priority.get(priority, 0))


class _InstallsCollector:
    """Exports the manager's install counts (the core never calls the exporter)."""

    def __init__(self, models: ModelManager, tier: str) -> None:
        self._models = models
        self._tier = tier

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "tierlink_model_installs",
            "Model versions brought onto this node, by outcome: ok (verified, loaded, warmed "
            "up), rejected (failed verification), failed (unknown version, failed to load), "
            "crashed (the process died loading it), unreachable (repository; retried)",
            labels=["tier", "model", "outcome"])
        for (model, outcome), n in sorted(self._models.installs.items()):
            family.add_metric([self._tier, model, outcome], n)
        yield family


class DispatchObserver:
    """The dispatcher's observer: what it did, counted."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self._m = metrics

    def escalated(self, model: str) -> None:
        self._m.escalations.labels(self._m.tier, model).inc()

    def fell_back(self, node_id: str, reason: str) -> None:
        self._m.fallbacks.labels(self._m.tier, node_id, reason).inc()

    def retried(self, node_id: str) -> None:
        self._m.retries.labels(self._m.tier, node_id).inc()

    def hedged(self, node_id: str, outcome: str) -> None:
        self._m.hedges.labels(self._m.tier, node_id, outcome).inc()
