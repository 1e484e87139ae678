"""A node's router under the fleet's routing revision, changed while it serves.

The control plane numbers the fleet's routing configurations
(:mod:`tierlink.control.routing_revisions`); a heartbeat answer carries the current one when
the node runs another. :meth:`NodeRouting.apply` builds a whole new
:class:`~tierlink.routing.router.Router` — the policy made with its options, the shadow
candidate, the desk — from the running configuration with the revision's live keys
(``settings.routing.with_live``), and swaps it in with one assignment. A request holds the
router it arrived under until it is answered: it is planned, fed back and labelled
(``tierlink.routing_revision``) under the revision that placed it, whatever came since. A
revision the node cannot make (a policy this node lacks) is refused, logged and counted;
the node keeps the one it runs.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any, TextIO

from tierlink.errors import TierlinkError
from tierlink.node.shadowing import open_shadow_file, shadow_for
from tierlink.node.spec import NodeSpec
from tierlink.routing.desk import PolicyDesk
from tierlink.routing.router import Router
from tierlink.settings.routing import RoutingConfig, parse_routing, with_live
from tierlink.telemetry.metrics import NodeMetrics

__all__ = ["NodeRouting"]

log = logging.getLogger("tierlink.node")


class NodeRouting:
    """The node's current :class:`Router` (``router``), the configuration it was made from
    (``config``) and its revision (``router.revision``; 0: the spec file's own)."""

    def __init__(self, spec: NodeSpec, rng: random.Random, metrics: NodeMetrics) -> None:
        self._spec, self._rng, self._metrics = spec, rng, metrics
        self._label = spec.tier.label
        self._shadow_file: TextIO | None = None
        self.config = spec.routing
        self.router = self._build(spec.routing, spec.routing_revision)
        metrics.routing_revision.labels(self._label).set(spec.routing_revision)

    @property
    def revision(self) -> int:
        return self.router.revision

    def apply(self, raw: Any) -> bool:
        """A heartbeat answer's ``routing`` (``{"revision", "config"}``; None: nothing new).
        True when the node now runs that revision."""
        if raw is None:
            return False
        revision = raw.get("revision") if isinstance(raw, Mapping) else None
        section = raw.get("config") if isinstance(raw, Mapping) else None
        if not isinstance(revision, int) or revision < 1 or not isinstance(section, Mapping):
            log.error("heartbeat answer: routing must be {revision, config}, got %.200r", raw)
            return False
        if revision == self.revision:
            return False
        try:
            revised = with_live(self.config, parse_routing(section,
                                                           self.config.cost.to_mapping()))
            router = self._build(revised, revision)
        except TierlinkError as exc:
            self._metrics.routing_refused.labels(self._label).inc()
            log.error("routing revision %d refused, still on %d: %s", revision, self.revision,
                      exc.message)
            return False
        self.config, self.router = revised, router  # the swap: one assignment
        self._metrics.routing_revision.labels(self._label).set(revision)
        log.info("routing revision %d: policy %s", revision, revised.policy)
        return True

    def close(self) -> None:
        if self._shadow_file is not None:
            self._shadow_file.close()

    def _build(self, routing: RoutingConfig, revision: int) -> Router:
        spec, label = self._spec, self._label
        received, refusals = self._metrics.inputs_received, self._metrics.privacy_refusals
        desk = PolicyDesk(spec.node_id, spec.tier, routing,
                          lambda privacy, verdict: received.labels(label, privacy, verdict).inc())
        shadow = None
        if routing.shadow is not None:
            shadow = shadow_for(routing, spec.node_id, self._file(),
                                self._metrics.shadow_dropped.labels(label).inc)
        return Router(desk, self._rng, shadow, revision=revision,
                      refused=lambda privacy, policy: refusals.labels(label, privacy,
                                                                      policy).inc())

    def _file(self) -> TextIO:
        if self._shadow_file is None:
            self._shadow_file = open_shadow_file(self._spec.state_dir)
        return self._shadow_file

