"""Routers judged as the field judges them: quality at each share of large-model calls,
PGR, APGR and CPT — with random and the oracle as the references."""

from __future__ import annotations

import numpy as np
import pytest

from tierlink.chat.router_eval import (
    SHARES,
    apgr_interval,
    curve,
    knn_scores,
    oracle_scores,
    random_curve,
)
from tierlink.errors import ConfigError

# 10 prompts: the small model right on 4, the large one on 7; only the large right on 4,
# only the small right on 1.
SMALL = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 0], dtype=bool)
LARGE = np.array([1, 1, 1, 0, 1, 1, 1, 1, 0, 0], dtype=bool)


def test_the_ends_of_every_curve_are_the_two_models() -> None:
    c = curve(np.arange(10.0), SMALL, LARGE)
    assert c.quality[0] == pytest.approx(0.4) and c.quality[-1] == pytest.approx(0.7)
    assert c.pgr[0] == pytest.approx(0.0) and c.pgr[-1] == pytest.approx(1.0)


def test_random_recovers_the_gap_in_proportion_and_scores_half() -> None:
    c = random_curve(SMALL, LARGE)
    assert np.allclose(c.pgr, SHARES)
    assert c.apgr == pytest.approx(0.5)
    assert c.cpt(0.5) == pytest.approx(0.5) and c.cpt(0.95) == pytest.approx(0.95)


def test_the_oracle_sends_what_only_the_large_model_gets_right_first() -> None:
    small, large = np.tile(SMALL, 10), np.tile(LARGE, 10)  # a share grid of 1% per prompt
    c = curve(oracle_scores(small, large), small, large)
    # 4 prompts gained of a gap of 3: the oracle passes the large model at 40% of the calls
    assert c.quality[40] == pytest.approx(0.8)
    assert c.pgr.max() == pytest.approx(4 / 3)
    assert c.cpt(1.0) == pytest.approx(0.3)  # three of the four gains recover the whole gap
    assert c.apgr > random_curve(small, large).apgr


def test_a_router_ranked_backwards_does_worse_than_random() -> None:
    backwards = curve(-oracle_scores(SMALL, LARGE), SMALL, LARGE)
    assert backwards.apgr < 0.5
    assert backwards.cpt(0.5) is not None and backwards.cpt(0.5) > 0.5
    assert set(backwards.figures()) == {"apgr", "cpt50", "cpt80", "cpt95"}


def test_knn_reads_its_neighbours_labels() -> None:
    train = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    needed = np.array([1, 1, 0, 0])
    assert knn_scores(train, needed, np.array([[1.0, 0.05], [0.05, 1.0]]), k=2).tolist() \
        == [1.0, 0.0]
    with pytest.raises(ConfigError, match="k must be"):
        knn_scores(train, needed, train, k=5)


def test_mismatched_or_gapless_answers_are_refused() -> None:
    with pytest.raises(ConfigError, match="same prompts"):
        curve(np.zeros(3), SMALL[:3], LARGE)
    with pytest.raises(ConfigError, match="no gap"):
        random_curve(SMALL, SMALL)
    with pytest.raises(ConfigError, match="scores for"):
        curve(np.zeros(4), SMALL, LARGE)


def test_the_interval_above_random_brackets_the_oracle_above_and_its_reverse_below() -> None:
    small, large = np.tile(SMALL, 10), np.tile(LARGE, 10)
    rng = np.random.default_rng(0)
    lo, hi = apgr_interval(oracle_scores(small, large), small, large, rng, rounds=100)
    assert 0 < lo <= hi
    lo, hi = apgr_interval(-oracle_scores(small, large), small, large, rng, rounds=100)
    assert lo <= hi < 0
