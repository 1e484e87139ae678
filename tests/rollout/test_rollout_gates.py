from dataclasses import replace

import pytest

from tierlink.errors import ConfigError
from tierlink.rollout.gates import (
    Baseline,
    Gates,
    Outcome,
    Verdict,
    enough_data,
    evaluate,
    z_score,
)
from tierlink.rollout.stats import LATENCY_BUCKETS_MS, VersionStats

NB = len(LATENCY_BUCKETS_MS)
CONF = (0, 0, 0, 0, 1, 2, 3, 6, 13, 75)


def hist(shares, n):
    return tuple(round(s * n / sum(shares)) for s in shares)


def lat_at(bucket, n):
    counts = [0] * NB
    counts[bucket] = n
    return tuple(counts)


def vs(n=400, err=0.0, esc=0.1, bucket=4, conf=CONF, fb=0, acc=0.9):
    return VersionStats(requests=n, errors=round(n * err), escalations=round(n * esc),
                        latency_ms_buckets=lat_at(bucket, n), confidence_buckets=hist(conf, n),
                        feedback=fb, feedback_correct=round(fb * acc))


def by_gate(verdicts):
    return {v.gate: v for v in verdicts}


def test_all_pass_on_equal_stats_accuracy_insufficient_without_feedback():
    v = by_gate(evaluate(Gates(), 100, vs(), [Baseline(vs(n=4000))]))
    assert [v[g].outcome for g in ("error_rate", "p95_latency", "escalation_rate",
                                   "confidence_psi")] == [Outcome.PASS] * 4
    assert v["feedback_accuracy"].outcome is Outcome.INSUFFICIENT
    assert "need 100" in v["feedback_accuracy"].reason


def test_error_rate_fails_with_readable_reason():
    v = by_gate(evaluate(Gates(), 100, vs(err=0.125), [Baseline(vs(err=0.005))]))["error_rate"]
    assert v.outcome is Outcome.FAIL
    assert v.reason == "error rate 12.5% vs 0.5% (+12.0 pt > 2.0 pt) over 400 requests"


def test_accuracy_drop_reason_and_minimum_feedback():
    gates = Gates(min_feedback=200)
    v = by_gate(evaluate(gates, 100, vs(fb=240, acc=0.8125),
                         [Baseline(vs(fb=1000, acc=0.91))]))["feedback_accuracy"]
    assert v.outcome is Outcome.FAIL
    assert v.reason == ("accuracy on labelled feedback 81.2% vs 91.0% (-9.8 pt, drop > 2.0 pt)"
                        " over 240 answers")
    short = by_gate(evaluate(gates, 100, vs(fb=150, acc=0.5),
                             [Baseline(vs(fb=1000, acc=0.91))]))["feedback_accuracy"]
    assert short.outcome is Outcome.INSUFFICIENT


def test_p95_needs_ratio_and_absolute_increase():
    # 1 ms -> 2 ms is 2x but only +1 ms: passes
    v = by_gate(evaluate(Gates(), 100, vs(bucket=1), [Baseline(vs(bucket=0))]))["p95_latency"]
    assert v.outcome is Outcome.PASS
    v = by_gate(evaluate(Gates(), 100, vs(bucket=6), [Baseline(vs(bucket=4))]))["p95_latency"]
    assert v.outcome is Outcome.FAIL and "x > 1.50x" in v.reason


def test_psi_gate_fails_on_shift():
    shifted = (2, 3, 5, 10, 15, 15, 15, 15, 10, 10)
    v = by_gate(evaluate(Gates(), 100, vs(conf=shifted), [Baseline(vs())]))["confidence_psi"]
    assert v.outcome is Outcome.FAIL and "significant shift" in v.reason and v.value > 0.25


def test_escalation_gate():
    v = by_gate(evaluate(Gates(), 100, vs(esc=0.3), [Baseline(vs(esc=0.1))]))
    assert v["escalation_rate"].outcome is Outcome.FAIL


def test_fallback_baseline_is_used_and_named():
    empty_window = Baseline(VersionStats())
    before = Baseline(vs(n=2000, err=0.0), "vs 1 before this stage")
    v = by_gate(evaluate(Gates(), 100, vs(err=0.1), [empty_window, before]))["error_rate"]
    assert v.outcome is Outcome.FAIL and v.reason.endswith("(vs 1 before this stage)")
    assert enough_data(100, vs(), [empty_window, before])
    assert not enough_data(100, vs(n=50), [empty_window, before])
    assert not enough_data(100, vs(), [empty_window])


def test_insufficient_on_both_sides():
    v = evaluate(Gates(), 100, vs(n=20), [Baseline(vs(n=20))])
    assert all(x.outcome is Outcome.INSUFFICIENT for x in v)
    assert evaluate(Gates(), 100, vs(), [])[0].outcome is Outcome.INSUFFICIENT


def test_gates_json_and_validation():
    g = Gates(max_psi=0.2, min_feedback=50)
    assert Gates.from_dict(g.to_dict()) == g
    assert Gates.from_dict({}) == Gates()
    with pytest.raises(ConfigError, match="max_psy"):
        Gates.from_dict({"max_psy": 0.1})
    with pytest.raises(ConfigError, match="max_error_rate_delta"):
        Gates(max_error_rate_delta=-1)
    with pytest.raises(ConfigError, match="max_p95_ratio"):
        Gates(max_p95_ratio=0.5)
    with pytest.raises(ConfigError, match="min_feedback"):
        Gates(min_feedback=0)


def test_verdict_json_round_trip():
    for v in evaluate(Gates(), 100, vs(err=0.2, fb=300), [Baseline(vs(fb=300))]):
        assert Verdict.from_dict(v.to_dict()) == v


def test_z_score():
    assert z_score(0, 100, 0, 1000) == 0.0
    assert z_score(100, 100, 0, 1000) > 10
    assert z_score(5, 100, 50, 1000) == pytest.approx(0.0)
    se = (0.03 * 0.97 / 100 + 0.005 * 0.995 / 1000) ** 0.5
    assert z_score(3, 100, 5, 1000) == pytest.approx(0.025 / se)
    assert z_score(0, 100, 5, 1000) < 0


def test_marginal_regression_is_suspect_not_fail():
    # 3.0% vs 0.5% over 100 requests: +2.5 pt > 2 pt, but z ~ 1.5
    v = by_gate(evaluate(Gates(), 100, vs(n=100, err=0.03), [Baseline(vs(n=1000, err=0.005))]))
    err = v["error_rate"]
    assert err.outcome is Outcome.SUSPECT and "not yet significant: z" in err.reason
    big = by_gate(evaluate(Gates(), 100, vs(n=2000, err=0.03),
                           [Baseline(vs(n=20000, err=0.005))]))
    assert big["error_rate"].outcome is Outcome.FAIL


def test_accuracy_noise_at_the_threshold_is_not_a_rollback():
    # 88.8% vs 90.9% over 169 answers: -2.1 pt is within sampling noise (+-2.4 pt)
    v = by_gate(evaluate(Gates(), 100, vs(fb=169, acc=0.888),
                         [Baseline(vs(fb=2000, acc=0.909))]))["feedback_accuracy"]
    assert v.outcome is Outcome.SUSPECT


def mirrored(stats, n, agreement):
    from dataclasses import replace
    return replace(stats, mirrored=n, agreed=round(n * agreement))


def test_agreement_tells_a_broken_version_from_a_smaller_models_normal_disagreement():
    # A device model agrees with the cloud's on ~98% of what it answers; one confidently
    # wrong on a class of ten on ~88%: a drop of 10 points fails; the previous version's
    # own 2% of disagreement is the baseline, not a failure.
    base = [Baseline(mirrored(vs(n=4000), 400, 0.98))]
    broken = by_gate(evaluate(Gates(), 100, mirrored(vs(), 100, 0.88), base))["agreement"]
    assert broken.outcome is Outcome.FAIL
    assert broken.reason == ("agreement with the most capable model 88.0% vs 98.0% (-10.0 pt, "
                             "drop > 3.0 pt) over 100 mirrored samples")
    healthy = by_gate(evaluate(Gates(), 100, mirrored(vs(), 80, 0.975), base))["agreement"]
    assert healthy.outcome is Outcome.PASS
    # -3.8 pt over 80 samples is within noise: held for more data, not rolled back
    noisy = by_gate(evaluate(Gates(), 100, mirrored(vs(), 80, 0.9375), base))["agreement"]
    assert noisy.outcome is Outcome.SUSPECT


def test_agreement_without_mirroring_is_insufficient_and_does_not_block():
    v = by_gate(evaluate(Gates(), 100, mirrored(vs(), 20, 0.5),
                         [Baseline(mirrored(vs(n=4000), 400, 0.98))]))["agreement"]
    assert v.outcome is Outcome.INSUFFICIENT and "need 50" in v.reason
    assert enough_data(100, vs(), [Baseline(vs(n=4000))])


def test_agreed_beyond_mirrored_is_refused_by_name():
    from tierlink.errors import InvalidRequest
    with pytest.raises(InvalidRequest, match="agreed exceeds stats.mirrored"):
        VersionStats.from_dict({"mirrored": 3, "agreed": 4})
    assert VersionStats.from_dict({"mirrored": 4, "agreed": 3}).agreement() == 0.75
    with pytest.raises(ConfigError, match="min_mirrored"):
        Gates(min_mirrored=0)


def test_a_confidence_shift_small_samples_can_show_by_chance_holds_instead_of_failing():
    from tierlink.rollout.gates import psi_critical
    assert psi_critical(2.58, 9, 115, 115) == pytest.approx(0.41, abs=0.01)
    assert psi_critical(2.58, 9, 400, 400) == pytest.approx(0.118, abs=0.005)
    shifted = (0, 0, 0, 0, 1, 2, 3, 6, 40, 48)
    small = by_gate(evaluate(Gates(), 30, vs(n=40, conf=shifted),
                             [Baseline(vs(n=40))]))["confidence_psi"]
    assert small.value > 0.25 and small.outcome is Outcome.SUSPECT
    assert "not yet significant" in small.reason
    big = by_gate(evaluate(Gates(), 100, vs(n=4000, conf=shifted),
                           [Baseline(vs(n=4000))]))["confidence_psi"]
    assert big.outcome is Outcome.FAIL


def test_psi_is_not_made_of_the_sparse_bins_of_a_confident_model():
    """80% of a device model's answers in the top bin: over ~115 answers the low bins hold
    0-2 each, and how those few fall would be most of a PSI over the raw bins."""
    from tierlink.rollout.stats import merge_sparse, psi
    base = (0, 0, 1, 0, 2, 3, 5, 8, 15, 81)
    new = (0, 1, 0, 2, 0, 4, 4, 9, 14, 81)
    assert psi(base, new) > 0.25  # the raw bins' reading
    merged = merge_sparse(base, new)
    assert merged == ([6, 13, 15, 81], [7, 13, 14, 81])
    verdicts = evaluate(Gates(), 100, replace(vs(n=115), confidence_buckets=new),
                        [Baseline(replace(vs(n=115), confidence_buckets=base))])
    v = by_gate(verdicts)["confidence_psi"]
    assert v.outcome is Outcome.PASS and v.value < 0.1
