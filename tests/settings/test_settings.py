"""The routing and hard-example settings, parsed on their own (as a node reads its spec), and
the rule that keeps them here: the nodes never import the launcher's package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.settings.hard_examples import parse_hard_examples
from tierlink.settings.routing import HedgeConfig, parse_routing

SRC = Path(__file__).resolve().parents[2] / "src" / "tierlink"


def test_a_routing_section_parses_alone() -> None:
    r = parse_routing({"policy": "bandit", "weights": {"cost": 3},
                       "hedging": {"quantile": 0.9}, "shadow": {"policy": "tierlink",
                                                                "explore": 0.1}})
    assert r.policy == "bandit" and r.weights.cost == 3.0
    assert r.hedging == HedgeConfig(quantile=0.9)
    assert r.shadow is not None and r.shadow.explore == 0.1
    assert r.policy_config().weights.cost == 3.0
    with pytest.raises(ConfigError, match=r"routing.hedging.quantile = 0.2 is out of range"):
        parse_routing({"hedging": {"quantile": 0.2}})
    with pytest.raises(ConfigError, match=r"routing.weights.speed: unknown key"):
        parse_routing({"weights": {"speed": 1}})


def test_mirroring_is_a_sample_of_at_most_five_percent() -> None:
    r = parse_routing({"mirror": {"share": 0.02, "max_in_flight": 2}})
    assert r.mirror.share == 0.02 and r.mirror.max_in_flight == 2
    assert parse_routing(r.to_dict()) == r
    assert parse_routing({}).mirror.share == 0.0  # off unless asked for
    with pytest.raises(ConfigError, match=r"routing.mirror.share = 0.1 is out of range"):
        parse_routing({"mirror": {"share": 0.1}})
    with pytest.raises(ConfigError, match=r"routing.mirror.shar: unknown key"):
        parse_routing({"mirror": {"shar": 0.01}})


def test_hard_example_settings_parse_alone() -> None:
    h = parse_hard_examples({"sample_rate": 0.5}, "edge")
    assert h.sample_rate == 0.5 and h.store_tier is Tier.EDGE
    with pytest.raises(ConfigError, match="hard_examples.batch_size must be an integer"):
        parse_hard_examples({"batch_size": 0})


@pytest.mark.parametrize("package", ["node", "settings", "policy", "core", "estimate"])
def test_lower_packages_never_import_the_launcher(package: str) -> None:
    """``fleet/`` starts nodes and reads fleet files; what a node needs of a fleet file lives
    in ``settings/``, so no package below imports ``tierlink.fleet``."""
    offenders = []
    for path in sorted((SRC / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names
                          if n == "tierlink.fleet" or n.startswith("tierlink.fleet.")]
    assert offenders == []
