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

__all__ = ["ShadowLog", "open_shadow_file", "shadow_for"]

log = logging.getLogger("tierlink.node")


class ShadowLog:
    """One routing revision's shadow decisions, written to the node's log file as JSON lines
    naming that revision's candidate; a line that cannot be written (a full disk) is counted
    and logged, never at the answer's expense. The file is the node's (line-buffered: a
    crash loses at most a line), shared by the revisions it runs."""

    def __init__(self, file: TextIO, candidate: dict[str, Any],
                 on_dropped: Callable[[], None]) -> None:
        self.file, self.candidate, self._on_dropped = file, candidate, on_dropped

    def __call__(self, logged: Logged) -> None:
        try:
            self.file.write(log_line(logged, self.candidate) + "\n")
        except (OSError, ValueError) as exc:  # ValueError: written after the node closed it
            self._on_dropped()
            log.warning("shadow log: a decision was not written: %s", exc)


def open_shadow_file(state_dir: str | None) -> TextIO:
    """The node's shadow log, ``state_dir/shadow.jsonl``, opened to append."""
    if not state_dir:
        raise ConfigError("routing.shadow needs the node's state_dir for its log")
    path = Path(state_dir) / "shadow.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return path.open("a", buffering=1)
    except OSError as exc:
        raise ConfigError(f"routing.shadow: cannot open the shadow log {path}: {exc}",
                          hint="give the node a writable state_dir") from None


def shadow_for(routing: RoutingConfig, node_id: str, file: TextIO,
               on_dropped: Callable[[], None]) -> ShadowRun:
    """Shadow mode as ``routing.shadow`` asks (which must be set), logging to ``file``."""
    cfg = routing.shadow
    assert cfg is not None
    policy_cfg = routing.policy_config()
    if cfg.weights is not None:
        policy_cfg = replace(policy_cfg, weights=cfg.weights)
    return shadow_run(cfg.policy, policy_cfg, cfg.options, cfg.explore,
                      random.Random(f"shadow:{node_id}"),
                      ShadowLog(file, cfg.to_dict(), on_dropped), routing.reward)
