"""Sampling and the speculative acceptance rule on toy distributions (no model)."""

from __future__ import annotations

import pytest
import torch

from tierlink.errors import InvalidRequest
from tierlink.llm.sampling import (
    Proposal,
    SamplingParams,
    accept_drafts,
    distribution,
    generator,
    propose,
    sample,
)


def test_greedy_is_the_argmax() -> None:
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    params = SamplingParams(temperature=0.0)
    assert sample(logits, params, generator(0)) == 1
    assert distribution(logits, params).tolist() == [0.0, 1.0, 0.0, 0.0]


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = distribution(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert p[2] == 0 and p[3] == 0
    assert float(p[0]) == pytest.approx(0.5 / 0.8)


def test_top_k_limits_the_support() -> None:
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    p = distribution(logits, SamplingParams(temperature=1.0, top_k=2))
    assert int((p > 0).sum()) == 2


def test_a_seed_makes_sampling_repeatable() -> None:
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=1.0, seed=7)
    a = [sample(logits, params, g) for g in [generator(7)] for _ in range(20)]
    b = [sample(logits, params, g) for g in [generator(7)] for _ in range(20)]
    assert a == b


@pytest.mark.parametrize("kwargs", [{"max_tokens": 0}, {"temperature": -0.1},
                                    {"top_p": 0.0}, {"stop": ("",)}])
def test_bad_sampling_values_are_refused(kwargs: dict) -> None:
    with pytest.raises(InvalidRequest):
        SamplingParams(**kwargs)


def test_greedy_verdict_keeps_the_matching_prefix_and_corrects() -> None:
    # target argmax per row: 3, 1, 4; drafts 3, 2 -> keep 3, replace 2 by 1
    rows = torch.full((3, 6), -5.0)
    rows[0, 3] = rows[1, 1] = rows[2, 4] = 5.0
    verdict = accept_drafts(rows, [Proposal(3), Proposal(2)], SamplingParams(temperature=0),
                            generator(0))
    assert verdict.accepted == 1 and verdict.tokens == (3, 1)


def test_all_drafts_kept_adds_the_bonus_token() -> None:
    rows = torch.full((3, 6), -5.0)
    rows[0, 3] = rows[1, 1] = rows[2, 4] = 5.0
    verdict = accept_drafts(rows, [Proposal(3), Proposal(1)], SamplingParams(temperature=0),
                            generator(0))
    assert verdict.accepted == 2 and verdict.tokens == (3, 1, 4)


def test_rejection_rule_keeps_the_target_distribution() -> None:
    """A draft proposing from q, judged against p: the first output token is distributed as
    p (chi-square over 20,000 trials), though q is far from p."""
    p = torch.tensor([0.45, 0.25, 0.15, 0.10, 0.05], dtype=torch.float64)
    q = torch.tensor([0.05, 0.10, 0.15, 0.25, 0.45], dtype=torch.float64)
    params = SamplingParams(temperature=1.0)
    target_logits = torch.log(p).float().repeat(2, 1)
    draft_logits = torch.log(q).float()
    gen = generator(1234)
    counts = torch.zeros(5)
    trials = 20_000
    for _ in range(trials):
        proposal = propose(draft_logits, params, gen)
        verdict = accept_drafts(target_logits, [proposal], params, gen)
        counts[verdict.tokens[0]] += 1
    expected = p.float() * trials
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, (counts.tolist(), chi2)  # 4 d.o.f., p = 0.001
    # and the draft's own distribution would fail the same test badly
    q_chi2 = float(((q.float() * trials - expected) ** 2 / expected).sum())
    assert q_chi2 > 1000


def test_sampled_proposals_carry_their_distribution() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, -3.0])
    proposal = propose(logits, SamplingParams(temperature=1.0, top_k=2), generator(3))
    assert set(proposal.support) == {0, 1}
    assert sum(proposal.probs) == pytest.approx(1.0)
    assert proposal.token in proposal.support
