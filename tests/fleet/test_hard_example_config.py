"""The fleet file's ``hard_examples:`` and ``control.tier``, and their way into node specs."""

import pytest

from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.fleet.config import HardExampleConfig, parse_fleet, parse_hard_examples
from tierlink.node.spec import NodeSpec

NODES = {"nodes": [{"id": "dev-1", "tier": "device", "models": ["fmnist-small"]}]}


def test_enabled_by_default_towards_a_cloud_control_plane():
    cfg = parse_fleet(NODES)
    assert cfg.hard_examples == HardExampleConfig() and cfg.hard_examples.enabled
    assert cfg.hard_examples.store_tier is Tier.CLOUD and cfg.control_tier is Tier.CLOUD


def test_settings_and_an_on_site_control_plane():
    cfg = parse_fleet({**NODES, "control": {"tier": "edge"},
                       "hard_examples": {"enabled": True, "sample_rate": 0.25, "max_queue": 10}})
    assert cfg.hard_examples.sample_rate == 0.25 and cfg.hard_examples.max_queue == 10
    assert cfg.hard_examples.store_tier is Tier.EDGE


@pytest.mark.parametrize("section, field", [
    ({"hard_examples": {"sample_rate": 2}}, "hard_examples.sample_rate"),
    ({"hard_examples": {"max_queue": 0}}, "hard_examples.max_queue"),
    ({"hard_examples": {"enabled": "yes"}}, "hard_examples.enabled"),
    ({"hard_examples": {"rate": 1}}, "hard_examples.rate"),
    ({"control": {"tier": "fog"}}, "control.tier"),
])
def test_errors_name_the_field(section, field):
    with pytest.raises(ConfigError, match=field):
        parse_fleet({**NODES, **section})


def test_node_specs_carry_the_settings_through_json():
    spec = NodeSpec("dev-1", Tier.DEVICE, (),
                    hard_examples=parse_hard_examples({"sample_rate": 0.5}, "edge"))
    again = NodeSpec.from_json(spec.to_json())
    assert again.hard_examples.sample_rate == 0.5
    assert again.hard_examples.store_tier is Tier.EDGE
    assert again == spec
    assert NodeSpec("dev-1", Tier.DEVICE, ()).hard_examples == HardExampleConfig()
