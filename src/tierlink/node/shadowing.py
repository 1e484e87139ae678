"""Shadow mode on a node (``routing.shadow``): a candidate policy decides beside the acting
one on the node's own requests, without acting; each decision, its propensity and the
outcome's reward go to ``state_dir/shadow.jsonl`` for ``tierlink policy evaluate``."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from tierlink.core.types import ClusterView, Outcome, Plan, Request
from tierlink.errors import ConfigError
from tierlink.policy import REGISTRY, Policy
from tierlink.policy.bandit import reward_of
from tierlink.policy.ope import Logged, log_line
from tierlink.policy.placement import TierlinkPolicy
from tierlink.policy.shadow import Decision, Shadow
from tierlink.settings.routing import RoutingConfig

__all__ = ["ShadowMode"]

log = logging.getLogger("tierlink.node")


class ShadowMode:
    def __init__(self, shadow: Shadow, file: TextIO, candidate: dict[str, Any],
                 reward_weights: Any, on_dropped: Callable[[], None]) -> None:
        self.shadow, self.file, self.candidate = shadow, file, candidate
        self._reward = reward_weights
        self._on_dropped = on_dropped

    @classmethod
    def open(cls, routing: RoutingConfig, acting: Policy, node_id: str,
             state_dir: str | None, on_dropped: Callable[[], None]) -> ShadowMode | None:
        """The fleet's ``routing.shadow`` for this node (None: off, or an acting policy that
        does not order the tierlink policy's options). The log is line-buffered: a crash
        loses at most a line."""
        cfg = routing.shadow
        if cfg is None or not isinstance(acting, TierlinkPolicy):
            return None
        if not state_dir:
            raise ConfigError("routing.shadow needs the node's state_dir for its log")
        policy_cfg = routing.policy_config()
        if cfg.weights is not None:
            policy_cfg = replace(policy_cfg, weights=cfg.weights)
        candidate = REGISTRY.create(cfg.policy, policy_cfg, cfg.options)
        if not isinstance(candidate, TierlinkPolicy):
            raise ConfigError(f"routing.shadow.policy {cfg.policy!r} cannot run in shadow "
                              "mode: it does not order the tierlink policy's options")
        path = Path(state_dir) / "shadow.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        shadow = Shadow(acting, candidate, cfg.explore, random.Random(f"shadow:{node_id}"))
        try:
            file = path.open("a", buffering=1)
        except OSError as exc:
            raise ConfigError(f"routing.shadow: cannot open the shadow log {path}: {exc}",
                              hint="give the node a writable state_dir") from None
        return cls(shadow, file, cfg.to_dict(), routing.reward, on_dropped)

    def plan(self, req: Request, view: ClusterView, rng: random.Random
             ) -> tuple[Plan, Decision | None]:
        return self.shadow.plan(req, view, rng)

    def log(self, decision: Decision, policy: TierlinkPolicy, req: Request, view: ClusterView,
            outcome: Outcome | None, correct: float, latency_ms: float) -> None:
        """Append one decision with its reward; a line that cannot be written (a full
        disk) is counted and logged, never at the answer's expense."""
        reward = reward_of(self._reward, req, policy.reference_cost(req, view), outcome,
                           correct, latency_ms)
        line = log_line(Logged(decision.acting, decision.candidate, decision.propensity,
                               reward, decision.acting_features, decision.candidate_features),
                        self.candidate)
        try:
            self.file.write(line + "\n")
        except OSError as exc:
            self._on_dropped()
            log.warning("shadow log: a decision was not written: %s", exc)

    def close(self) -> None:
        self.file.close()
