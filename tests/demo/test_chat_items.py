"""The chat phase's prompts: labelled reviews the fleet's models were never measured on,
a third at each privacy level, scored by the first label word of the answer."""

from __future__ import annotations

from tierlink.demo.chat import LABELLED_FROM, labelled_items, right, summarize
from tierlink.llm.labelled import rotten_tomatoes


def test_labelled_items_come_after_what_the_models_were_measured_on() -> None:
    items = labelled_items(["dev-1", "dev-2"], 6)
    assert len(items) == 12 and {i.privacy for i in items} == {"local", "site", "any"}
    reviews = rotten_tomatoes(0)
    assert items[0].label == reviews[LABELLED_FROM].label
    assert reviews[LABELLED_FROM].text in items[0].text
    assert not any(r.text in items[0].text for r in reviews[:1200])


def test_an_answer_is_right_when_its_first_label_word_is_the_label() -> None:
    assert right(1, "Positive.") and right(0, " negative, mostly") and right(1, "**Positive**")
    assert right(1, "The movie review is positive, but it")
    assert not right(1, "Negative") and not right(0, "") and not right(None, "negative")
    assert not right(0, "The review is positive, not negative")  # the first one counts
    assert not right(1, "It is a nonpositive review")  # whole words only


def test_same_as_large_counts_everyday_answers_and_labelled_ones_apart() -> None:
    base = {"device": "d", "privacy": "any", "answered": True, "ttft_ms": 1.0,
            "cost_usd": 0.0, "left_device": False, "drafted": 0, "accepted": 0}
    records = [{**base, "prompt": "q", "label": None, "text": "yes"},
               {**base, "prompt": "r1", "label": 1, "text": "Positive"},
               {**base, "prompt": "r2", "label": 0, "text": "Positive"}]
    out = summarize(records, {("d", "q"): "yes", ("d", "r1"): "x", ("d", "r2"): "x"})
    assert out["same_as_large"] == 1.0 and out["labelled"] == 2
    assert out["labelled_right"] == 0.5
