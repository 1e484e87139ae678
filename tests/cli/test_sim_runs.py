"""`tierlink sim --runs` names the demo's runs, bandit, or any registered policy; the fleet
file's own policy runs as itself, the others as a request naming them."""

from dataclasses import replace
from pathlib import Path

import pytest

from tierlink.cli.sim import _runs
from tierlink.errors import ConfigError
from tierlink.fleet.config import load_fleet

FLEET = Path(__file__).resolve().parents[2] / "src/tierlink/demo/fleets/fleet.yaml"


def test_the_demo_runs_and_any_registered_policy() -> None:
    config = load_fleet(FLEET)
    assert _runs("tierlink,cloud_only,bandit", config) == [
        ("tierlink", None), ("cloud_only", "cloud_only"), ("bandit", "bandit")]


def test_a_fleet_whose_own_policy_is_another_runs_tierlink_by_name() -> None:
    config = load_fleet(FLEET)
    other = replace(config, routing=replace(config.routing, policy="device_only"))
    assert _runs("device_only,tierlink", other) == [("device_only", None),
                                                    ("tierlink", "tierlink")]


def test_unknown_runs_and_unallowed_overrides_are_refused() -> None:
    config = load_fleet(FLEET)
    with pytest.raises(ConfigError, match="unknown run"):
        _runs("tierlink,nope", config)
    closed = replace(config, routing=replace(config.routing, allow_policy_override=False))
    with pytest.raises(ConfigError, match="allow_policy_override"):
        _runs("tierlink,static_rules", closed)
    assert _runs("tierlink", closed) == [("tierlink", None)]
