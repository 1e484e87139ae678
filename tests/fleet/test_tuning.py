"""Thresholds belong to the models they were tuned on: a fleet whose model files changed
since refuses to run on them (``up``) with the command that fixes it."""

import json
from pathlib import Path

import pytest

from tierlink.errors import ConfigError
from tierlink.fleet.config import parse_fleet
from tierlink.fleet.tuning import require_fresh, stale_thresholds


def fleet(tuned_on: dict | None) -> object:
    routing: dict = {"thresholds": {"m-small": 0.8}}
    if tuned_on is not None:
        routing["cascade"] = {"tuned_on": tuned_on}
    return parse_fleet({"nodes": [{"id": "d", "tier": "device", "models": ["m-small"]},
                                  {"id": "e", "tier": "edge", "models": ["m-medium"]}],
                        "links": [{"from": "d", "to": "e"}], "routing": routing})


@pytest.fixture
def models(tmp_path, monkeypatch):
    """Two 'models' whose cards say their sha256 (load_card is replaced: only the hash
    matters here)."""
    from tierlink.models import card as cards

    shas = {"m-small": "a" * 64, "m-medium": "b" * 64}
    out = {}
    for name, sha in shas.items():
        card = tmp_path / f"{name}.json"
        card.write_text(json.dumps({"sha256": sha}))
        out[name] = (tmp_path / f"{name}.onnx", card)
    monkeypatch.setattr(cards, "load_card",
                        lambda p: type("Card", (), json.loads(Path(p).read_text()))())
    return out


def test_thresholds_tuned_on_these_models_are_fresh(models):
    assert stale_thresholds(fleet({"m-small": "a" * 64, "m-medium": "b" * 64}), models) == []


def test_hand_written_thresholds_are_taken_as_given(models):
    assert stale_thresholds(fleet(None), models) == []


def test_a_changed_model_makes_them_stale_and_up_says_how_to_fix_it(models):
    config = fleet({"m-small": "c" * 64, "m-medium": "b" * 64})
    stale = stale_thresholds(config, models)
    assert len(stale) == 1 and stale[0].startswith("m-small: tuned on cccc")
    with pytest.raises(ConfigError) as info:
        require_fresh(config, models, "fleet.yaml")
    assert "tierlink cascade tune fleet.yaml" in info.value.hint


def test_a_bad_digest_is_a_config_error():
    with pytest.raises(ConfigError, match="tuned_on"):
        fleet({"m-small": 42})


def test_a_retune_aims_at_the_target_the_file_records():
    from tierlink.fleet.tuning import fleet_goal, target_of

    config = parse_fleet({"nodes": [{"id": "d", "tier": "device", "models": ["m-small"]}],
                          "routing": {"cascade": {"target": {"accuracy_drop": 0.1,
                                                             "confidence": 0.9}}}})
    goal = fleet_goal(config)
    assert (goal.kind, goal.value, goal.confidence) == ("accuracy_drop", 0.1, 0.9)
    assert target_of(goal) == {"accuracy_drop": 0.1, "confidence": 0.9}
    default = fleet_goal(parse_fleet({"nodes": [{"id": "d", "tier": "device",
                                                 "models": ["m-small"]}]}))
    assert (default.value, default.confidence) == (0.3, 0.95)
    with pytest.raises(ConfigError, match="routing.cascade.target"):
        parse_fleet({"nodes": [{"id": "d", "tier": "device", "models": ["m-small"]}],
                     "routing": {"cascade": {"target": {"accuracy_drop": 0.1, "x": 1}}}})
