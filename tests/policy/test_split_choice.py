"""The policy prices split plans from the nodes' split profiles and the live link: when the
bandwidth changes, the chosen cut changes (pure: snapshots in, plans out)."""

import random

from tierlink.core.types import (
    ClusterView,
    LinkView,
    ModelView,
    NodeView,
    Privacy,
    Request,
    SplitPoint,
    Tier,
)
from tierlink.policy.base import PolicyConfig, Weights
from tierlink.policy.placement import TierlinkPolicy

INPUT = 150_528 * 4  # a 224x224 RGB image in FP32
# Head latencies on a throttled device, tail latencies in the cloud (an ImageNet-size net).
HEAD = (SplitPoint("b3", 20.0, 0.0, 294 * 1024), SplitPoint("b7", 45.0, 0.0, 49 * 1024),
        SplitPoint("b14", 110.0, 0.0, 31 * 1024))
TAIL = (SplitPoint("b3", 0.0, 9.0, 294 * 1024), SplitPoint("b7", 0.0, 6.0, 49 * 1024),
        SplitPoint("b14", 0.0, 1.0, 31 * 1024))
SMALL = ModelView("net-small", "net", "1", 0.60, 8.0)
BIG = ModelView("net-big", "net", "1", 0.72, 10.0, splits=TAIL)


def view(mbit: float, rtt: float = 10.0, heads=True) -> ClusterView:
    device = NodeView("dev-1", Tier.DEVICE, (SMALL,),
                      heads=(ModelView("net-big", "net", "1", 0.72, 150.0, splits=HEAD),)
                      if heads else ())
    cloud = NodeView("cloud-1", Tier.CLOUD, (BIG,), workers=4)
    return ClusterView.build("dev-1", [device, cloud],
                             [LinkView("dev-1", "cloud-1", rtt, mbit)])


def choose(v: ClusterView, privacy: Privacy = Privacy.ANY, **cfg):
    """The first placement of a plan that weighs latency, not cost (a WAN upload of the raw
    image is dear, so with the default weights splits also win on cost)."""
    request = Request("r", "net", 300.0, origin="dev-1", privacy=privacy, input_bytes=INPUT)
    policy = TierlinkPolicy(PolicyConfig(weights=Weights(cost=0.0), **cfg))
    return policy.plan(request, v, random.Random(0)).placements[0]


def test_the_cut_follows_the_bandwidth():
    fat = choose(view(1000.0, rtt=2.0))
    assert fat.kind == "remote" and not fat.cut  # upload the image: the cloud is fast
    mid = choose(view(10.0))
    assert mid.cut == "b7" and mid.model == "net-big"
    # fp16 (lossless here) beats int8+zstd (12 ms faster, but priced at 0.05 pt accuracy,
    # worth 15 ms at latency weight 1 and a 300 ms deadline)
    assert mid.codec == "fp16"
    thin = choose(view(0.1))
    assert thin.kind == "local" and thin.model == "net-small"  # no uplink worth using


def test_no_split_without_heads_or_for_local_privacy():
    assert not choose(view(10.0, heads=False)).cut
    assert choose(view(10.0), privacy=Privacy.LOCAL).kind == "local"
    allowed = choose(view(10.0), privacy=Privacy.LOCAL, local_features_may_leave=True)
    assert allowed.cut == "b7"


def exits_view(mbit: float, rtt: float) -> ClusterView:
    """A device that serves a multi-exit net (slow: throttled) and may split it at its exit
    boundaries; the cloud serves the same net (fast). 80% of inputs exit at exit 1."""
    from tierlink.models.exits import exit_split_points

    bounds = [("features1", 25_088), ("features2", 12_544)]
    dev_points = exit_split_points((3.0, 30.0, 30.0), (0.8, 0.15, 0.05), bounds)
    cloud_points = exit_split_points((0.3, 3.0, 3.0), (0.8, 0.15, 0.05), bounds)
    local_ms = 3.0 + 30.0 * 0.2 + 30.0 * 0.05
    exits_dev = ModelView("net-exits", "net", "1", 0.70, local_ms, splits=dev_points)
    exits_cloud = ModelView("net-exits", "net", "1", 0.70, 0.3 + 3.0 * 0.25, splits=cloud_points)
    device = NodeView("dev-1", Tier.DEVICE, (exits_dev,), heads=(exits_dev,))
    cloud = NodeView("cloud-1", Tier.CLOUD, (exits_cloud,), workers=4)
    return ClusterView.build("dev-1", [device, cloud],
                             [LinkView("dev-1", "cloud-1", rtt, mbit)])


def test_exit_and_split_are_chosen_together():
    """Weak uplink: the device runs the multi-exit net itself, exiting early. Strong
    uplink: it runs the first segment, answers the 80% its first exit is sure of, and sends
    only the rest at the first boundary (cheaper than uploading every input)."""
    request = Request("r", "net", 300.0, origin="dev-1", input_bytes=3136)
    policy = TierlinkPolicy(PolicyConfig(weights=Weights(cost=0.0)))
    weak = policy.plan(request, exits_view(0.5, rtt=80.0), random.Random(0)).placements[0]
    assert weak.kind == "local" and weak.model == "net-exits"
    strong = policy.plan(request, exits_view(50.0, rtt=10.0), random.Random(0)).placements[0]
    assert strong.cut == "features1" and strong.model == "net-exits"
    # the estimate: 3 ms here, then 20% x (send + tail) -- below local (10.5) and remote (11.6)
    assert strong.est_ms < 7.0


def test_a_split_with_early_exits_pays_for_the_link_only_for_what_it_sends():
    """The cost of a split at an exit boundary: the head for every input, the transfer and
    the tail only for the 20% the first exit did not answer."""
    from tierlink.estimate.cost import CostModel
    from tierlink.policy.placement import split_plans

    cfg = PolicyConfig(weights=Weights(cost=0.0))
    v = exits_view(50.0, rtt=10.0)
    request = Request("r", "net", 300.0, origin="dev-1", input_bytes=3136)
    choice = TierlinkPolicy(cfg)._split(v.nodes["dev-1"], v.nodes["cloud-1"], request, v)
    assert choice is not None and choice.cut == "features1"
    plan = next(p for p in split_plans(v.nodes["dev-1"], v.nodes["cloud-1"],
                                       v.nodes["cloud-1"].models[0], v, cfg)
                if (p.cut, p.codec) == (choice.cut, choice.codec))
    assert abs(plan.continue_share - 0.2) < 1e-9
    cost: CostModel = cfg.cost
    head = cost.compute(Tier.DEVICE, plan.head_ms)
    tail_ms = plan.tail_ms - cfg.estimates.hop_overhead_ms  # no queue in the cloud here
    onward = cost.transfer(Tier.CLOUD, plan.wire_bytes) + cost.compute(Tier.CLOUD, tail_ms)
    assert abs(choice.est.cost - (head + 0.2 * onward)) < 1e-12
