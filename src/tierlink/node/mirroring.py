"""Mirroring on a node (``routing.mirror``; the policy is ``routing/mirror.py``).

After an answer of one of this node's own models went out, a sample of them is asked again
of the most capable model the request's privacy allows, in a background task of its own —
never on the answer's path, never more than ``max_in_flight`` at once (a sampled answer is
skipped while they are busy: a sample may be thinned, an answer never waits; a mirror the
fleet turns away for load or its deadline — batch work, the first shed — is counted ``shed``,
apart from ``failed``). The two
answers' labels are compared sample by sample; what agreed is counted per answering model
version (:class:`~tierlink.node.version_stats.VersionStatsBook`: heartbeats, the rollout's
``agreement`` gate, the fleet view) and exported (``tierlink_mirrored_samples_total``,
``tierlink_mirror_agreed_samples_total``). A mirror is billed at this node under path kind
``mirror``: what watching quality costs is on the bill, apart from serving.

Only answers with a ``label`` tensor (classification kinds) are mirrored; an answer this
node's model gave after an escalation or as a split is not (it was not this model's alone).
A sampled answer whose request may reach nothing more capable (a ``local`` input on its
device) passes its turn to the next answer that may: the share holds over all answers, and
the mirrors go where a comparison exists.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any

import numpy as np

from tierlink.core.types import Outcome, Plan, Priority, Request
from tierlink.errors import Refused, TierlinkError
from tierlink.node.dispatcher import StepResult
from tierlink.node.version_stats import VersionStatsBook
from tierlink.routing.mirror import mirror_odds
from tierlink.settings.routing import MirrorConfig
from tierlink.telemetry.metrics import NodeMetrics

__all__ = ["Mirrors", "agreement"]

log = logging.getLogger("tierlink.node")

Inputs = dict[str, np.ndarray]
# The plan of a mirrored request (the router admitted it); None when the most capable model
# it may reach is the one that answered (nothing to compare). Raises what planning raises.
Planner = Callable[[Request, Outcome], Plan | None]
# Runs that plan. Raises what a routed request raises.
Run = Callable[[Plan, Request, Inputs], Awaitable[StepResult]]
# (model, version) -> (the standby version's weight, whether this version is the standby)
Share = Callable[[str, str], tuple[float, bool]]


def agreement(ours: np.ndarray, theirs: np.ndarray) -> tuple[int, int]:
    """(samples compared, samples with the same label) of two answers' ``label`` tensors;
    (0, 0) when their shapes differ (nothing comparable)."""
    a, b = np.asarray(ours), np.asarray(theirs)
    if a.shape != b.shape or a.ndim == 0:
        return 0, 0
    same = (a == b).reshape(a.shape[0], -1).all(axis=1)
    return int(same.size), int(same.sum())


MAX_OWED = 100  # turns passed on by answers that could not be compared, at most


class Mirrors:
    """The node's mirrors in flight and what they found (see the module doc)."""

    def __init__(self, config: MirrorConfig, node_id: str, site: str, rng: random.Random,
                 plan: Planner, run: Run, share: Share, stats: VersionStatsBook,
                 metrics: NodeMetrics) -> None:
        self.config, self.node_id, self.site = config, node_id, site
        self._rng, self._plan, self._run, self._share = rng, plan, run, share
        self._stats, self._metrics = stats, metrics
        self._tasks: set[asyncio.Task[None]] = set()
        # per (model, version): sampled answers that could not be compared (the next ones
        # of the same version go instead)
        self._owed: dict[tuple[str, str], int] = {}

    def offer(self, task: str, req: Request, inputs: Inputs, result: StepResult) -> None:
        """One answer that went out: mirrored in the background if it is sampled."""
        outcome = result.outcome
        if (self.config.share <= 0.0 or req.mirror or outcome.served_by != self.node_id
                or outcome.escalations or outcome.split):
            return
        key = (outcome.model, outcome.model_version)
        if not self._turn(key):
            return
        ours = result.outputs.get("label")
        if ours is None:
            self._count("no_label")
            self._owed[key] = 0  # this model never has a label: nothing is owed
            return
        mirrored = replace(req, request_id=f"{req.request_id}.mirror", mirror=True,
                           priority=Priority.BATCH, deadline_ms=self.config.deadline_ms,
                           version=None, policy=None)
        try:
            plan = self._plan(mirrored, outcome)
        except TierlinkError as exc:
            self._owed[key] -= 1
            self._count("refused")
            log.info("mirror of %s not planned: %s", req.request_id, exc.message)
            return
        if plan is None:
            return  # nothing more capable may see this input: the turn passes on
        self._owed[key] -= 1
        self._start(self._mirror(task, plan, mirrored, inputs, ours, outcome))

    def _turn(self, key: tuple[str, str]) -> bool:
        """Whether an answer of ``key`` (model, version) is to be mirrored: drawn at the
        version's odds, or owed a turn an earlier draw could not use."""
        weight, on_standby = self._share(*key)
        if self._rng.random() < mirror_odds(self.config.share, weight, on_standby):
            self._owed[key] = min(MAX_OWED, self._owed.get(key, 0) + 1)
        return self._owed.get(key, 0) > 0

    def _start(self, mirror: Coroutine[Any, Any, None]) -> None:
        if len(self._tasks) >= self.config.max_in_flight:
            mirror.close()
            self._count("busy")
            return
        job = asyncio.create_task(mirror, name="mirror")
        self._tasks.add(job)
        job.add_done_callback(self._tasks.discard)

    async def _mirror(self, task: str, plan: Plan, req: Request, inputs: Inputs,
                      ours: np.ndarray, answered: Outcome) -> None:
        try:
            result = await self._run(plan, req, inputs)
        except Refused as exc:  # turned away for load or time: a sample thinned, not a fault
            self._count("shed")
            log.info("mirror of %s shed: %s", req.request_id, exc.message)
            return
        except TierlinkError as exc:
            self._count("failed")
            log.info("mirror of %s failed: %s", req.request_id, exc.message)
            return
        except Exception:  # a background task: logged, never raised
            self._count("failed")
            log.exception("mirror of %s failed", req.request_id)
            return
        n, agreed = agreement(ours, result.outputs.get("label", np.empty(0)))
        if n == 0:
            self._count("incomparable")
            return
        self._count("compared")
        self._stats.mirrored(answered.model, answered.model_version, n, agreed)
        self._metrics.count_mirrored(task, answered.model, answered.model_version, n, agreed)
        self._metrics.bill(task, result.outcome, self.node_id, self.site, path="mirror")

    def _count(self, outcome: str) -> None:
        self._metrics.mirrors.labels(outcome).inc()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def stop(self) -> None:
        """Cancel the mirrors in flight (a sample: nothing is owed to anyone)."""
        for job in list(self._tasks):
            job.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
