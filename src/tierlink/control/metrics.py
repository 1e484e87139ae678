"""The control plane's Prometheus series."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class ControlMetrics:
    """The control plane's Prometheus series, in a registry of their own (one per app)."""

    registry: CollectorRegistry
    nodes: Gauge
    heartbeats: Counter
    expired: Counter
    request_duration: Histogram
    hard_examples: Counter
    hard_examples_stored: Gauge

    @classmethod
    def create(cls) -> ControlMetrics:
        registry = CollectorRegistry(auto_describe=True)
        return cls(
            registry=registry,
            nodes=Gauge("tierlink_control_nodes", "Alive nodes by tier.", ["tier"],
                        registry=registry),
            heartbeats=Counter("tierlink_control_heartbeats", "Heartbeats accepted.",
                               registry=registry),
            expired=Counter("tierlink_control_expired", "Nodes expired for going silent.",
                            registry=registry),
            request_duration=Histogram(
                "tierlink_control_request_duration_seconds",
                "Control plane HTTP request duration.", ["method", "route", "status"],
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                registry=registry,
            ),
            hard_examples=Counter(
                "tierlink_control_hard_examples",
                "Hard examples received, by outcome: stored, duplicate (a retried batch), "
                "evicted (oldest, over the row cap), rejected (an invalid batch, or an "
                "invalid item delivered to /v1/results)", ["outcome"],
                registry=registry),
            hard_examples_stored=Gauge("tierlink_control_hard_examples_stored",
                                       "Hard examples in the store now", registry=registry),
        )
