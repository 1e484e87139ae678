"""How many tokens to draft: expected yield and the adaptive choice."""

from __future__ import annotations

import pytest

from tierlink.estimate.speculation import SpecEstimator, best_k, expected_tokens


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 4) == pytest.approx(1.0)
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)


def test_a_slow_link_and_a_good_draft_draft_more() -> None:
    short = best_k(0.8, draft_s=0.02, round_s=0.005, per_row_s=0.002)
    long = best_k(0.8, draft_s=0.02, round_s=0.2, per_row_s=0.002)
    assert long > short
    assert best_k(0.1, draft_s=0.02, round_s=0.05, per_row_s=0.002) <= 2


def test_the_estimator_learns_acceptance_and_clamps_to_what_is_left() -> None:
    est = SpecEstimator()
    for _ in range(20):
        k = est.next_k(100)
        est.observe(k, k, draft_s=0.01 * k, round_s=0.1)
    assert est.alpha > 0.9 and est.acceptance == 1.0
    assert est.next_k(100) >= 4
    assert est.next_k(3) <= 2
