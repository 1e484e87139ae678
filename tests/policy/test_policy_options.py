"""The open policy contract: ``routing.policy: {name, options}`` hands the options to the
policy's factory (its keyword-only parameters, checked by the policy itself), and any policy
that implements ``feedback`` hears how its plans turned out."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from tierlink.core.types import ClusterView, Outcome, Plan, Request
from tierlink.errors import ConfigError
from tierlink.policy import REGISTRY, BanditPolicy, Learner, PolicyConfig, PolicyRegistry
from tierlink.policy.base import give_feedback, policy_options
from tierlink.settings.routing import parse_routing


@dataclass
class Counting:
    """A third party's learning policy: no bandit, just a count of what it heard."""

    config: PolicyConfig
    patience: int = 3
    heard: list[float] = field(default_factory=list)
    name: str = "counting"
    respects_deadline: bool = True

    @classmethod
    def make(cls, config: PolicyConfig, *, patience: int = 3) -> Counting:
        if not isinstance(patience, int) or patience < 1:
            raise ConfigError(f"routing.policy.options.patience must be an integer >= 1, "
                              f"got {patience!r}")
        return cls(config, patience)

    def plan(self, request: Request, view: ClusterView, rng: random.Random) -> Plan:
        return Plan((), self.name, reason="counting")

    def feedback(self, plan: Plan, request: Request, view: ClusterView,
                 outcome: Outcome | None, correct: float, latency_ms: float) -> None:
        self.heard.append(correct)


@pytest.fixture
def registry() -> PolicyRegistry:
    reg = PolicyRegistry(discover=False)
    reg.register("counting", Counting.make)
    return reg


def test_the_fleet_files_options_reach_the_policy_and_it_checks_them(registry):
    routing = parse_routing({"policy": {"name": "counting", "options": {"patience": 7}}})
    assert (routing.policy, dict(routing.policy_options)) == ("counting", {"patience": 7})
    made = registry.create(routing.policy, routing.policy_config(), routing.policy_options)
    assert isinstance(made, Counting) and made.patience == 7
    assert policy_options(Counting.make) == ("patience",)
    with pytest.raises(ConfigError, match="patience must be an integer"):
        registry.create("counting", None, {"patience": 0})
    with pytest.raises(ConfigError, match="takes no option 'patiance'") as info:
        registry.create("counting", None, {"patiance": 2})
    assert "patience" in info.value.hint


def test_a_built_in_policy_takes_its_options_too():
    bandit = REGISTRY.create("bandit", PolicyConfig(), {"prior_weight": 5})
    assert isinstance(bandit, BanditPolicy)
    with pytest.raises(ConfigError, match="prior_weight"):
        REGISTRY.create("bandit", PolicyConfig(), {"prior_weight": -1})
    calm = REGISTRY.create("bandit", PolicyConfig(), {"noise": 0.1})
    assert isinstance(calm, BanditPolicy) and calm.model.noise == 0.1
    with pytest.raises(ConfigError, match="noise"):
        REGISTRY.create("bandit", PolicyConfig(), {"noise": 0})
    with pytest.raises(ConfigError, match="tierlink takes no options"):
        REGISTRY.create("tierlink", PolicyConfig(), {"explore": 0.1})


def test_the_shorthand_and_the_shadows_policy_take_the_same_shape():
    assert parse_routing({"policy": "bandit"}).policy_options == {}
    shadow = parse_routing({"shadow": {"policy": {"name": "bandit",
                                                  "options": {"prior_weight": 9}},
                                       "explore": 0.05}}).shadow
    assert (shadow.policy, dict(shadow.options)) == ("bandit", {"prior_weight": 9})
    assert shadow.to_dict()["policy"] == {"name": "bandit", "options": {"prior_weight": 9}}
    with pytest.raises(ConfigError, match=r"routing.policy.nme: unknown key"):
        parse_routing({"policy": {"nme": "bandit"}})


def test_feedback_reaches_any_learning_policy(registry):
    policy = registry.create("counting", None)
    assert isinstance(policy, Learner)
    req, plan = Request("r", "toy", 100.0, "dev-1"), Plan((), "counting")
    give_feedback(policy, plan, req, ClusterView.build("dev-1", (), ()), None, 1.0, 12.0)
    assert policy.heard == [1.0]
    give_feedback(REGISTRY.create("tierlink", None), plan, req, ClusterView.build("dev-1", (), ()), None,
                  1.0, 12.0)  # a policy that does not learn hears nothing, and that is fine
