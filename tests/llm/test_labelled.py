"""Labelled prompts offline: Rotten Tomatoes, and label-word scoring on the real model."""

from __future__ import annotations

from tierlink.llm.labelled import label_token_ids, rotten_tomatoes, score


def test_rotten_tomatoes_snippets() -> None:
    items = rotten_tomatoes(seed=0)
    assert len(items) > 12_000
    assert {it.label for it in items} == {0, 1}
    assert items[:5] == rotten_tomatoes(seed=0)[:5]  # a seeded order


def test_label_words_score_a_review(target, codec) -> None:
    ids = label_token_ids(codec, ("Negative", "Positive"))
    assert ids[0] and ids[1] and not set(ids[0]) & set(ids[1])
    items = rotten_tomatoes(seed=0)[:3]
    result = score(target, codec, items)
    assert result.probs.shape == (3, 2) and result.features.shape == (3, 576)
    # the label words' share of the first answer token: compared with each other, not 1
    assert (result.probs > 0).all() and (result.probs.sum(axis=1) <= 1.0).all()
    assert set(result.predictions()) <= {0, 1}
