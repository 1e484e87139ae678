"""The fleet file's ``batching:`` section: per served model, strict, round-tripped."""

from __future__ import annotations

from typing import Any

import pytest

from tierlink.errors import ConfigError
from tierlink.fleet.config import parse_fleet
from tierlink.settings.batching import BatchSettings, parse_batching


def fleet(batching: Any) -> dict[str, Any]:
    return {"nodes": [{"id": "cloud-1", "tier": "cloud", "models": ["fmnist-large"]},
                      {"id": "dev-1", "tier": "device", "models": ["fmnist-small"]}],
            "links": [{"from": "dev-1", "to": "cloud-1"}], "batching": batching}


def test_a_served_model_is_batched_as_its_section_says() -> None:
    config = parse_fleet(fleet({"fmnist-large": {"max_batch": 8, "max_delay_ms": 2}}))
    assert config.batching == {"fmnist-large": BatchSettings(8, 2.0)}
    assert parse_fleet(config.to_dict()) == config
    assert not BatchSettings().on and BatchSettings(2).on


@pytest.mark.parametrize(("section", "message"), [
    ({"fmnist-large": {"max_bacth": 8}}, ("batching.fmnist-large.max_bacth: unknown key "
                                         "(did you mean batching.fmnist-large.max_batch?)")),
    ({"fmnist-large": {"max_batch": 0}}, "batching.fmnist-large.max_batch must be an integer"),
    ({"fmnist-large": {"max_batch": 1000}}, "out of range [1, 256]"),
    ({"fmnist-large": {"max_delay_ms": -1}}, "batching.fmnist-large.max_delay_ms"),
    ({"fmnist-lrage": {"max_batch": 8}}, "batching.fmnist-lrage: no node serves"),
    ({"fmnist-large": 8}, "batching.fmnist-large must be a mapping"),
])
def test_a_mistake_is_refused_naming_the_key(section: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_fleet(fleet(section))
    assert message in str(err.value)


def test_the_section_alone() -> None:
    assert parse_batching({}) == {}
    with pytest.raises(ConfigError, match="batching must be a mapping"):
        parse_batching([1])
