"""Which nodes a node sends work up to, read from the registry: live topology.

A node's spec names a rule, not a list: its upstreams are the alive nodes of
``upstream_tier`` whose labels named in ``upstream_match`` (``site``, ``region``) equal its
own. A new edge that enrolls is used as soon as the registry lists it -- nobody restarts --
and a node an operator drains (``POST /v1/nodes/{id}/drain``) gets no new work from the
moment its peers' views say so; what it already holds it finishes. A label this node does
not carry matches anything (a device without a ``site`` takes every edge).

The spec's ``upstreams`` are then *how to reach* a node (an emulated link's address in a
local fleet, first guesses of RTT and bandwidth), used when that node is chosen; a chosen
node without one is reached at the address it registered. Without a rule (a static
topology) the spec's list is the upstreams, less the drained ones.

:class:`Topology` keeps the node's upstream dict -- the one its forwarder, split plans and
warmer share -- in step with each new registry view, adding and dropping entries in place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from tierlink.node.spec import NodeSpec, UpstreamSpec

log = logging.getLogger(__name__)

U = TypeVar("U")


@dataclass(frozen=True, slots=True)
class UpstreamRule:
    """Upstreams are alive nodes of ``tier`` whose ``match`` labels equal this node's."""

    tier: str
    match: tuple[str, ...] = ()


def rule_of(spec: NodeSpec) -> UpstreamRule | None:
    """The spec's rule; None for a static topology."""
    return UpstreamRule(spec.upstream_tier, spec.upstream_match) if spec.upstream_tier else None


def choose_upstreams(node_id: str, labels: Mapping[str, str], rule: UpstreamRule | None,
                     records: Iterable[Mapping[str, Any]],
                     declared: Mapping[str, UpstreamSpec]) -> dict[str, UpstreamSpec]:
    """The upstreams a registry view gives this node (see the module), by node id."""
    draining = set()
    chosen: dict[str, UpstreamSpec] = {}
    for rec in records:
        other = str(rec.get("node_id", ""))
        if rec.get("draining"):
            draining.add(other)
            continue
        if rule is None or other == node_id or rec.get("tier") != rule.tier:
            continue
        theirs = rec.get("labels") or {}
        if all(theirs.get(k) == labels[k] for k in rule.match if k in labels):
            chosen[other] = declared.get(other) or UpstreamSpec(other, str(rec["address"]))
    if rule is None:
        return {k: u for k, u in declared.items() if k not in draining}
    return chosen


class _Reached(Protocol):
    @property
    def url(self) -> str: ...


class UpstreamURLs(Mapping[str, str]):
    """A node's upstreams as they are at each read: node id -> base URL (what the chat
    relay takes, so that it follows the registry as the forwarder does)."""

    def __init__(self, upstreams: Mapping[str, _Reached]) -> None:
        self._upstreams = upstreams

    def __getitem__(self, node_id: str) -> str:
        return self._upstreams[node_id].url

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._upstreams))

    def __len__(self) -> int:
        return len(self._upstreams)


class Topology(Generic[U]):
    """A node's upstreams, kept in step with the registry (see the module).

    ``upstreams`` is the live dict others hold; ``make`` turns a chosen
    :class:`UpstreamSpec` into the node's upstream object (its link estimator included).
    """

    def __init__(self, node_id: str, labels: Mapping[str, str], rule: UpstreamRule | None,
                 declared: Iterable[UpstreamSpec], make: Callable[[UpstreamSpec], U]) -> None:
        self.node_id, self.labels, self.rule = node_id, dict(labels), rule
        self.declared = {u.node_id: u for u in declared}
        self._make = make
        self.upstreams: dict[str, U] = {} if rule is not None else \
            {k: make(u) for k, u in self.declared.items()}
        self._specs: dict[str, UpstreamSpec] = {} if rule is not None else dict(self.declared)
        self._seen: object = None
        self.draining = False  # this node, as the control plane last answered

    def sync(self, records: list[dict[str, Any]]) -> bool:
        """Bring the upstreams in line with ``records`` (a registry view; the same list
        object twice is looked at once); True when they changed."""
        if records is self._seen:
            return False
        self._seen = records
        if not records:  # no view yet (or the registry never answered): keep what we have
            return False
        chosen = choose_upstreams(self.node_id, self.labels, self.rule, records, self.declared)
        if chosen == self._specs:
            return False
        for gone in self._specs.keys() - chosen.keys():
            del self.upstreams[gone]
        for node, spec in chosen.items():
            if self._specs.get(node) != spec:
                self.upstreams[node] = self._make(spec)
        log.info("%s: upstreams now %s (were %s)", self.node_id, sorted(chosen),
                 sorted(self._specs))
        self._specs = chosen
        return True
