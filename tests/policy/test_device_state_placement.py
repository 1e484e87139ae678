"""A device's battery and heat in placement: a low battery (not charging) or a hot device
sends its requests to an upstream that can answer in time and says so in the plan's
reason; it answers itself where no upstream can (privacy, deadline). The state is part of
the snapshot, so the plan cache never serves a plan made under another state."""

from __future__ import annotations

import random

import pytest

from tierlink.core.types import DeviceState, Plan, Privacy, Request
from tierlink.policy import PolicyConfig, TierlinkPolicy
from tierlink.policy.base import DeviceStateRule
from tierlink.testing.views import fleet_view

LOW = DeviceState(battery=0.12)
HOT = DeviceState(battery=0.9, thermal="serious")


def req(privacy: Privacy = Privacy.ANY, deadline: float = 150.0) -> Request:
    return Request("r1", "fmnist", deadline, origin="dev-1", privacy=privacy,
                   input_bytes=3136)


def plan(state: DeviceState | None, request: Request | None = None,
         rule: DeviceStateRule | None = None) -> Plan:
    policy = TierlinkPolicy(PolicyConfig(device_state=rule or DeviceStateRule()))
    return policy.plan(request or req(), fleet_view(device_state=state), random.Random(0))


def test_a_device_with_power_and_a_cool_head_computes_as_usual() -> None:
    for state in (None, DeviceState(battery=0.8), DeviceState(battery=0.12, charging=True),
                  DeviceState(thermal="fair")):
        p = plan(state)
        assert p.placements[0].kind == "local" and p.reason.startswith("cascade"), state


@pytest.mark.parametrize(("state", "why"), [(LOW, "low battery"), (HOT, "thermal serious")])
def test_a_low_battery_or_a_hot_device_sends_work_upstream_and_says_why(
        state: DeviceState, why: str) -> None:
    p = plan(state)
    first = p.placements[0]
    assert first.kind == "remote" and first.node_id.startswith("edge-")
    assert p.reason.endswith(f"({why}: local compute spared)")
    assert any(pl.kind == "local" and pl.node_id == "dev-1" for pl in p.placements[1:])


@pytest.mark.parametrize("request_", [req(Privacy.LOCAL), req(deadline=4.0)],
                         ids=["privacy local", "no time for an upstream"])
def test_it_answers_itself_where_no_upstream_can(request_: Request) -> None:
    p = plan(LOW, request_)
    assert p.placements[0].kind == "local" and p.placements[0].node_id == "dev-1"
    assert "spared" not in p.reason


def test_the_rule_s_thresholds() -> None:
    assert plan(DeviceState(battery=0.3), rule=DeviceStateRule(low_battery=0.35)) \
        .placements[0].kind == "remote"
    assert plan(LOW, rule=DeviceStateRule(low_battery=0.0)).placements[0].kind == "local"
    assert plan(DeviceState(thermal="critical"), rule=DeviceStateRule(hot="none")) \
        .placements[0].kind == "local"
    assert plan(DeviceState(thermal="fair"), rule=DeviceStateRule(hot="fair")) \
        .placements[0].kind == "remote"


def test_the_plan_cache_never_serves_a_plan_made_under_another_state() -> None:
    policy = TierlinkPolicy(PolicyConfig())
    rng = random.Random(0)
    charged, low = fleet_view(device_state=DeviceState(battery=0.9)), fleet_view(
        device_state=LOW)
    for _ in range(30):  # most come from the cache (a key per power-of-two draw)
        assert policy.plan(req(), charged, rng).placements[0].kind == "local"
    assert policy.cache.hits >= 20
    for _ in range(30):
        assert policy.plan(req(), low, rng).placements[0].kind == "remote"
