"""Shadow mode on a node (``routing.shadow``): a candidate policy decides beside the acting
one on the node's own requests, without acting (:class:`~tierlink.routing.router.Router`);
each decision, its propensity and the outcome's reward go to ``state_dir/shadow.jsonl`` for
``tierlink policy evaluate``."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from tierlink.errors import ConfigError
from tierlink.policy.ope import Logged, log_line
from tierlink.routing.router import ShadowRun, shadow_run
from tierlink.settings.routing import RoutingConfig

__all__ = ["ShadowLog", "open_shadow"]

log = logging.getLogger("tierlink.node")


class ShadowLog:
    """The node's shadow log: one JSON line per decision, line-buffered (a crash loses at
    most a line); a line that cannot be written (a full disk) is counted and logged, never
    at the answer's expense."""

    def __init__(self, file: TextIO, candidate: dict[str, Any],
                 on_dropped: Callable[[], None]) -> None:
        self.file, self.candidate, self._on_dropped = file, candidate, on_dropped

    def __call__(self, logged: Logged) -> None:
        try:
            self.file.write(log_line(logged, self.candidate) + "\n")
        except OSError as exc:
            self._on_dropped()
            log.warning("shadow log: a decision was not written: %s", exc)

    def close(self) -> None:
        self.file.close()


def open_shadow(routing: RoutingConfig, node_id: str, state_dir: str | None,
                on_dropped: Callable[[], None]) -> tuple[ShadowRun, ShadowLog] | None:
    """The fleet's ``routing.shadow`` for this node and its open log (None: off)."""
    cfg = routing.shadow
    if cfg is None:
        return None
    if not state_dir:
        raise ConfigError("routing.shadow needs the node's state_dir for its log")
    policy_cfg = routing.policy_config()
    if cfg.weights is not None:
        policy_cfg = replace(policy_cfg, weights=cfg.weights)
    path = Path(state_dir) / "shadow.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        file = path.open("a", buffering=1)
    except OSError as exc:
        raise ConfigError(f"routing.shadow: cannot open the shadow log {path}: {exc}",
                          hint="give the node a writable state_dir") from None
    sink = ShadowLog(file, cfg.to_dict(), on_dropped)
    return shadow_run(cfg.policy, policy_cfg, cfg.options, cfg.explore,
                      random.Random(f"shadow:{node_id}"), sink, routing.reward), sink
