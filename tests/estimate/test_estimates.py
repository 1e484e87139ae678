import pytest

from tierlink.core.types import LinkView, ModelView, NodeView, Tier
from tierlink.estimate import (
    DEFAULT_COST_MODEL,
    CostModel,
    LinkEstimator,
    queue_wait_ms,
    transfer_ms,
)


def test_transfer_is_rtt_plus_serialisation():
    link = LinkView("a", "b", rtt_ms=10.0, bandwidth_mbit=8.0)
    assert transfer_ms(1000, link) == pytest.approx(10.0 + 1.0)  # 8,000 bits at 8 Mbit/s


def test_queue_wait_counts_live_outstanding_requests():
    m = ModelView("m", "t", "1", 0.9, 2.0)
    node = NodeView("n", Tier.EDGE, (m,), queue_depth=3, workers=2)
    assert queue_wait_ms(node, m) == pytest.approx(3.0)
    assert queue_wait_ms(node, m, outstanding=1) == pytest.approx(4.0)


def test_link_estimator_learns_the_real_rtt():
    est = LinkEstimator(LinkView("a", "b", 10.0, 100.0), alpha=0.5)
    for _ in range(20):
        est.observe(total_ms=45.0, server_ms=5.0, nbytes=0)
    assert est.view().rtt_ms == pytest.approx(40.0, rel=0.01)
    assert est.samples == 20


def test_cost_model_prices_cloud_far_above_edge_and_device():
    c = DEFAULT_COST_MODEL
    assert c.compute(Tier.CLOUD, 1000) > 10 * c.compute(Tier.EDGE, 1000) > 0
    assert c.compute(Tier.DEVICE, 1000) < c.compute(Tier.EDGE, 1000)
    assert c.transfer(Tier.CLOUD, 10**9) == pytest.approx(0.05)
    assert c.transfer(Tier.EDGE, 10**9) == 0.0


def test_cost_model_overrides_from_config():
    c = CostModel.from_mapping({"compute_usd_per_s": {"cloud": 1.0}})
    assert c.compute(Tier.CLOUD, 1000) == 1.0
    assert c.compute(Tier.EDGE, 1000) == DEFAULT_COST_MODEL.compute(Tier.EDGE, 1000)


def _exchange(est, nbytes, rtt, mbit, server=2.0):
    est.observe(total_ms=server + rtt + nbytes * 8 / (mbit * 1000.0), server_ms=server,
                nbytes=nbytes)


def test_link_estimator_learns_bandwidth_from_mixed_sizes_and_follows_a_drop():
    est = LinkEstimator(LinkView("a", "b", 10.0, 100.0), window=16)
    sizes = [3_000, 60_000, 3_000, 200_000]
    for i in range(16):
        _exchange(est, sizes[i % 4], rtt=10.0, mbit=100.0)
    assert est.view().bandwidth_mbit == pytest.approx(100.0, rel=0.01)
    for i in range(16):  # the link drops to 5 Mbit/s and gains latency
        _exchange(est, sizes[i % 4], rtt=25.0, mbit=5.0)
    view = est.view()
    assert view.bandwidth_mbit == pytest.approx(5.0, rel=0.01)
    assert view.rtt_ms == pytest.approx(25.0, rel=0.01)


def test_link_estimator_keeps_bandwidth_when_sizes_do_not_vary():
    est = LinkEstimator(LinkView("a", "b", 10.0, 50.0), alpha=1.0)
    for _ in range(10):
        _exchange(est, 3_000, rtt=30.0, mbit=50.0)
    assert est.view().bandwidth_mbit == 50.0
    assert est.view().rtt_ms == pytest.approx(30.0, rel=0.01)
