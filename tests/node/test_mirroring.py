"""Mirroring on a node: which answers are sampled, that the answer never waits for a mirror,
and what a mirror counts (agreement per version, the bill under path ``mirror``)."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tierlink.core.types import Outcome, Placement, Plan, Privacy, Request, Tier
from tierlink.errors import DeadlineExceeded, Overloaded, UpstreamUnavailable
from tierlink.estimate.cost import DEFAULT_COST_MODEL
from tierlink.node.dispatcher import StepResult
from tierlink.node.mirroring import Mirrors, agreement
from tierlink.node.version_stats import VersionStatsBook
from tierlink.settings.routing import MirrorConfig
from tierlink.telemetry.metrics import NodeMetrics


def answer(node: str, model: str, labels: list[int], **outcome: object) -> StepResult:
    return StepResult({"label": np.array(labels)},
                      Outcome(node, Tier.DEVICE if node.startswith("dev") else Tier.CLOUD,
                              model, (node,), 0.99, model_version="1", **outcome))


class Upstream:
    """The most capable model, as a fake route: answers ``labels`` after ``gate`` opens."""

    def __init__(self, labels: list[int], fail: Exception | None = None) -> None:
        self.labels, self.fail = labels, fail
        self.gate = asyncio.Event()
        self.asked: list[Request] = []

    def plan(self, req: Request, answered: Outcome) -> Plan | None:
        if req.privacy is Privacy.LOCAL:
            return None  # the device's own model is the most capable it may reach
        return Plan((Placement("remote", "cloud-1", Tier.CLOUD),), "most_capable")

    async def __call__(self, plan: Plan, req: Request, inputs: dict) -> StepResult:
        self.asked.append(req)
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        bill = DEFAULT_COST_MODEL.compute_bill(Tier.CLOUD, 10.0)
        return answer("cloud-1", "large", self.labels, bill=bill)


def mirrors(route, share: float = 0.05, in_flight: int = 4, standby=(0.0, False)):
    metrics = NodeMetrics("device", CollectorRegistry())
    stats = VersionStatsBook(clock=lambda: 1.0)
    made = Mirrors(MirrorConfig(share=share, max_in_flight=in_flight), "dev-1", "s1",
                   random.Random(0), route.plan, route, lambda m, v: standby, stats, metrics)
    return made, stats, metrics


def sample(metrics: NodeMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


REQ = Request("r1", "toy", 500.0, "dev-1", Privacy.ANY, input_bytes=3136)


def test_agreement_compares_labels_sample_by_sample():
    assert agreement(np.array([1, 2, 3]), np.array([1, 0, 3])) == (3, 2)
    assert agreement(np.array([[1, 2], [3, 4]]), np.array([[1, 2], [3, 5]])) == (2, 1)
    assert agreement(np.array([1, 2]), np.array([1, 2, 3])) == (0, 0)


def test_a_sampled_answer_is_mirrored_in_the_background_and_counted_per_version():
    async def main() -> None:
        up = Upstream([1, 0, 3, 3])
        made, stats, metrics = mirrors(up, share=0.05)
        offered = 400
        for i in range(offered):  # the answer goes out at once: offer never waits
            made.offer("toy", REQ, {}, answer("dev-1", "small", [1, 2, 3, 4]))
            if made.in_flight == 4:
                break
        assert made.in_flight == 4 and len(up.asked) == 0  # scheduled, not yet run
        made.offer("toy", REQ, {}, answer("dev-1", "small", [1, 2, 3, 4]))
        await asyncio.sleep(0)
        assert {r.mirror for r in up.asked} == {True}
        assert {r.priority.label for r in up.asked} == {"batch"}
        assert {r.privacy for r in up.asked} == {Privacy.ANY}  # never more than the request's
        up.gate.set()
        await asyncio.sleep(0.01)
        assert stats.get("small", "1")["mirrored"] == 16
        assert stats.get("small", "1")["agreed"] == 8
        assert sample(metrics, "tierlink_mirrored_samples_total", task="toy", model="small",
                      version="1") == 16
        assert sample(metrics, "tierlink_mirror_agreed_samples_total", task="toy",
                      model="small", version="1") == 8
        assert sample(metrics, "tierlink_cost_usd_total", task="toy", model="large",
                      version="1", path="mirror", site="s1", tier="cloud",
                      part="compute") > 0
        assert sample(metrics, "tierlink_billed_requests_total", task="toy", path="mirror",
                      site="s1") == 0  # on the bill; no request of anyone's
        assert sample(metrics, "tierlink_mirrors_total", outcome="compared") == 4

    asyncio.run(main())


def test_share_of_answers_mirrored_holds_and_busy_slots_skip():
    async def main() -> None:
        up = Upstream([1])
        made, _, _ = mirrors(up, share=0.05, in_flight=1000)
        for _ in range(4000):
            made.offer("toy", REQ, {}, answer("dev-1", "small", [1]))
        assert 0.04 <= len(made._tasks) / 4000 <= 0.06
        up.gate.set()
        await made.stop()
        busy_up = Upstream([1])
        busy, _, busy_metrics = mirrors(busy_up, share=0.05, in_flight=1)
        for _ in range(1000):
            busy.offer("toy", REQ, {}, answer("dev-1", "small", [1]))
        assert busy.in_flight == 1
        assert sample(busy_metrics, "tierlink_mirrors_total", outcome="busy") > 20
        await busy.stop()

    asyncio.run(main())


@pytest.mark.parametrize("why", ["a mirror", "answered upstream", "escalated", "split",
                                 "no label", "off"])
def test_what_is_never_mirrored(why: str) -> None:
    async def main() -> None:
        up = Upstream([1])
        made, _, metrics = mirrors(up, share=0.0 if why == "off" else 0.05, in_flight=1000)
        req = Request("r1", "toy", 500.0, "dev-1", mirror=why == "a mirror")
        result = answer("cloud-1" if why == "answered upstream" else "dev-1", "small", [1],
                        escalations=int(why == "escalated"),
                        split="cut/fp16" if why == "split" else "")
        if why == "no label":
            result = StepResult({"value": np.array([0.5])}, result.outcome)
        for _ in range(200):
            made.offer("toy", req, {}, result)
        assert made.in_flight == 0 and not up.asked
        if why == "no label":
            assert sample(metrics, "tierlink_mirrors_total", outcome="no_label") > 0

    asyncio.run(main())


def test_an_answer_nothing_more_capable_may_see_passes_its_turn_on():
    async def main() -> None:
        up = Upstream([1])
        made, _, _ = mirrors(up, share=0.05, in_flight=10_000)
        local = Request("r2", "toy", 500.0, "dev-1", Privacy.LOCAL)
        for i in range(4000):  # every other answer a local input
            made.offer("toy", local if i % 2 else REQ, {}, answer("dev-1", "small", [1]))
        # 5% of all 4000 answers, every one of them on an input that may go up
        assert 0.04 <= made.in_flight / 4000 <= 0.06
        await asyncio.sleep(0)
        assert {r.privacy for r in up.asked} == {Privacy.ANY}
        await made.stop()

    asyncio.run(main())


@pytest.mark.parametrize("error, outcome", [
    (UpstreamUnavailable("the cloud is away"), "failed"),
    (Overloaded("the cloud sheds batch work"), "shed"),
    (DeadlineExceeded("no time left"), "shed"),
])
def test_a_mirror_that_failed_or_was_shed_is_counted_and_costs_the_answer_nothing(
        error: Exception, outcome: str):
    async def main() -> None:
        up = Upstream([1], fail=error)
        made, stats, metrics = mirrors(up, share=0.05, in_flight=1000)
        for _ in range(200):
            made.offer("toy", REQ, {}, answer("dev-1", "small", [1]))
        up.gate.set()
        await asyncio.sleep(0.01)
        counted = {o: sample(metrics, "tierlink_mirrors_total", outcome=o)
                   for o in ("failed", "shed")}
        assert counted[outcome] > 0 and sum(counted.values()) == counted[outcome]
        assert stats.get("small", "1") is None  # nothing compared, nothing counted

    asyncio.run(main())


def test_a_canary_gets_half_the_mirrors():
    async def main() -> None:
        canary, _, _ = mirrors(Upstream([1]), share=0.05, in_flight=10_000,
                               standby=(0.1, True))
        active, _, _ = mirrors(Upstream([1]), share=0.05, in_flight=10_000,
                               standby=(0.1, False))
        for _ in range(2000):
            canary.offer("toy", REQ, {}, answer("dev-1", "small", [1]))
            active.offer("toy", REQ, {}, answer("dev-1", "small", [1]))
        assert 0.2 <= canary.in_flight / 2000 <= 0.3
        assert 0.02 <= active.in_flight / 2000 <= 0.035
        await canary.stop()
        await active.stop()

    asyncio.run(main())
