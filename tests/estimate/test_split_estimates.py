import pytest

from tierlink.core.types import LinkView
from tierlink.estimate.split import (
    LOCAL_CUT,
    REMOTE_CUT,
    CodecProfile,
    best,
    candidates,
    chain_segments,
    estimate,
)

# A MobileNetV2-like profile on a throttled device: the input is big, mid-network features
# are much smaller, the device is slow and the cloud fast.
SEGMENTS = chain_segments(
    cuts=["block3", "block7", "block14"], head_ms=[20.0, 60.0, 120.0],
    tail_ms=[8.0, 4.0, 1.0], feature_bytes=[294 * 1024, 49 * 1024, 31 * 1024],
    input_bytes=150_528 * 4, local_ms=150.0, remote_ms=10.0)
CODECS = [CodecProfile("fp32", 1.0, 0.0, 0.0),
          CodecProfile("int8", 4.0, 0.01, 0.01, 0.1),
          CodecProfile("topk:0.05", 12.0, 0.05, 0.02, 3.0)]  # too lossy


def link(mbit, rtt=10.0):
    return LinkView("dev", "cloud", rtt_ms=rtt, bandwidth_mbit=mbit)


def test_estimate_adds_head_codec_transfer_queue_and_tail():
    seg = SEGMENTS[2]  # block7
    e = estimate(seg, CODECS[1], link(8.0), queue_ms=3.0)
    wire = 49 * 1024 // 4
    assert e.wire_bytes == wire
    assert e.transfer_ms == pytest.approx(10.0 + wire * 8 / 8000.0)
    assert e.codec_ms == pytest.approx(49 * 0.02)
    assert e.total_ms == pytest.approx(60.0 + e.codec_ms + e.transfer_ms + 3.0 + 4.0)


def test_the_best_cut_moves_with_bandwidth():
    fast = best(SEGMENTS, CODECS, link(1000.0, rtt=2.0))
    assert fast.cut == REMOTE_CUT  # a fat pipe: upload the input, the cloud is fast
    mid = best(SEGMENTS, CODECS, link(20.0))
    assert mid.cut not in (REMOTE_CUT, LOCAL_CUT) and mid.codec == "int8"
    slow = best(SEGMENTS, CODECS, link(0.5))
    assert slow.cut == LOCAL_CUT  # a trickle: stay on the device


def test_lossy_codecs_beyond_the_budget_are_never_chosen():
    plans = candidates(SEGMENTS, CODECS, link(1.0), max_accuracy_loss=0.5)
    assert all(p.codec != "topk:0.05" for p in plans)
    allowed = candidates(SEGMENTS, CODECS, link(1.0), max_accuracy_loss=5.0)
    assert any(p.codec == "topk:0.05" for p in allowed)
    assert [p.total_ms for p in plans] == sorted(p.total_ms for p in plans)


def test_no_offload_leaves_only_the_local_plan():
    choice = best(SEGMENTS, CODECS, link(1000.0, rtt=1.0), allow_offload=False)
    assert choice.cut == LOCAL_CUT and choice.total_ms == 150.0 and choice.wire_bytes == 0


def test_real_requests_cost_more_than_probes_and_the_estimate_prices_requests():
    """Probes (cheap padding) fix the wire's line; real requests land 12 ms above it on a
    throttled sender. The estimator learns that, and keeps pricing requests at their real
    cost when the link goes idle and only probes come back."""
    from tierlink.estimate.latency import LinkEstimator, transfer_ms

    def probes(est: LinkEstimator, rtt: float, mbit: float) -> None:
        for _ in range(6):
            for nbytes in (1024, 65_536):
                est.observe(rtt + nbytes * 8 / (mbit * 1000), 0.0, nbytes, probe=True)

    est = LinkEstimator(LinkView("dev", "cloud", 10.0, 20.0))
    probes(est, 10.0, 20.0)
    for _ in range(20):  # real 20 KB feature payloads, 5 ms of each spent upstream
        est.observe(5.0 + 10.0 + 20_480 * 8 / 20_000 + 12.0, 5.0, 20_480)
    real = 10.0 + 20_480 * 8 / 20_000 + 12.0
    assert 9.0 < est.request_ms < 13.0
    assert abs(transfer_ms(20_480, est.view()) - real) < 0.15 * real
    probes(est, 10.0, 20.0)  # idle again: only probes
    assert abs(transfer_ms(20_480, est.view()) - real) < 0.15 * real
    probes(est, 10.0, 5.0)  # the link slows while idle: requests are priced slower too
    slower = 10.0 + 20_480 * 8 / 5_000 + 12.0
    assert abs(transfer_ms(20_480, est.view()) - slower) < 0.15 * slower


def test_a_busy_sender_s_stalls_do_not_make_a_fast_link_look_slow():
    """A throttled device computing locally leaves the link idle, so only probes measure
    it, and its own CPU stalls add up to 80 ms to most of them. Stalls only ever add time:
    the floor of each probe size is the wire's, so a 500 Mbit/s link still reads fast (a
    least-squares line through the raw probes read anything from 3 to 230 Mbit/s)."""
    import random

    from tierlink.estimate.latency import LinkEstimator, transfer_ms

    rng = random.Random(3)
    est = LinkEstimator(LinkView("dev", "cloud", 4.0, 500.0))

    def probe_round(mbit: float, stalled: float = 0.5) -> None:
        for nbytes in (64, 65_536):
            stall = rng.uniform(0.0, 80.0) if rng.random() < stalled else 0.0
            est.observe(4.0 + nbytes * 8 / (mbit * 1000) + stall, 0.0, nbytes, probe=True)

    views = []
    for _ in range(100):
        probe_round(500.0)
        views.append(est.view())
    fast = [v for v in views[4:] if v.bandwidth_mbit > 100.0 and v.rtt_ms < 10.0]
    assert len(fast) >= 0.9 * len(views[4:])
    for _ in range(8):  # the link slows to 3 Mbit/s while idle: shows within a few rounds
        probe_round(3.0, stalled=0.0)
    assert abs(transfer_ms(25_000, est.view()) - (4.0 + 25_000 * 8 / 3_000)) < 10.0
    raw = 602_112  # one raw input sent while it was slow: large, so it has the leverage
    est.observe(4.0 + raw * 8 / 3_000, 0.0, raw)
    probe_round(500.0, stalled=0.0)  # the link recovers: shows at the first clean probe
    assert transfer_ms(25_000, est.view()) < 15.0


def test_requests_that_straddle_a_slowdown_do_not_price_a_recovered_link_for_good():
    """A probe round at 500 Mbit/s, then the link drops to 3 Mbit/s and the first requests
    after the round (two raw uploads, a split) meet it: their extra time is the slower wire,
    not request cost. Once the link is fast again and only probes see it (the device stays
    local), requests must be priced at the fast wire plus the real ~30 ms, not 100 ms more
    (the median of six extras, three of them straddlers, kept it there: the device never
    offloaded again in tests/integration/test_split_switching.py)."""
    from tierlink.estimate.latency import LinkEstimator, transfer_ms

    est = LinkEstimator(LinkView("dev", "cloud", 4.0, 500.0))

    def probes(mbit: float, rounds: int) -> None:
        for _ in range(rounds):
            for nbytes in (64, 65_536):
                est.observe(4.0 + nbytes * 8 / (mbit * 1000), 0.0, nbytes, probe=True)

    def request(mbit: float, nbytes: int) -> None:  # 30 ms of request cost, 10 upstream
        est.observe(4.0 + nbytes * 8 / (mbit * 1000) + 30.0 + 10.0, 10.0, nbytes)

    probes(500.0, 2)
    for _ in range(9):
        request(500.0, 602_112)
    probes(500.0, 1)  # an idle moment between bursts
    request(3.0, 602_112)
    request(3.0, 602_112)
    request(3.0, 60_000)
    probes(3.0, 4)  # the device went local: idle, probes only
    probes(500.0, 4)  # fast again, still only probes
    assert 25.0 < est.request_ms < 35.0
    assert transfer_ms(150_528, est.view()) < 4.0 + 150_528 * 8 / 500_000 + 35.0
