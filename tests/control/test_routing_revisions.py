"""The fleet's routing revisions on the control plane: numbered, validated (a policy that
cannot be made, a key that needs a restart), reverted, and handed to each node whose
heartbeat says it runs another."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tierlink.control.app import create_app
from tierlink.control.routing_revisions import RoutingControl, SqliteRoutingRevisions
from tierlink.control.store import SqliteRegistryStore
from tierlink.errors import ConfigError, RoutingConflict
from tierlink.settings.routing import parse_routing


@pytest.fixture
def control(tmp_path: Path) -> Iterator[RoutingControl]:
    store = SqliteRoutingRevisions(tmp_path / "c.db")
    yield RoutingControl(store, clock=lambda: 1000.0, cache_s=0.0)
    store.close()


def section(**routing: Any) -> dict[str, Any]:
    return parse_routing(routing).to_dict()


def test_revisions_are_numbered_kept_and_reverted(control: RoutingControl) -> None:
    with pytest.raises(RoutingConflict, match="no earlier routing revision"):
        control.revert()
    assert control.for_node(0) is None  # none stored yet: nodes run their spec's
    first = control.apply({"policy": "tierlink"}, "tierlink up", start=True)
    second = control.apply({"policy": {"name": "bandit", "options": {"prior_weight": 2}}},
                           "apply")
    assert (first.revision, second.revision) == (1, 2)
    assert control.for_node(2) is None
    assert control.for_node(1) == {"revision": 2, "config": dict(second.routing)}
    back = control.revert()
    assert back.revision == 3 and back.routing == first.routing and back.note == "revert to 1"
    assert [r.revision for r in control.store.history()] == [3, 2, 1]


@pytest.mark.parametrize(("routing", "message"), [
    ({"polcy": "bandit"}, "routing.polcy: unknown key"),
    ({"policy": "no-such-policy"}, "unknown policy"),
    ({"policy": {"name": "bandit", "options": {"prior_wieght": 2}}}, "prior_wieght"),
    ({"shadow": {"policy": "nope"}}, "unknown policy"),
    ({"hedging": {"enabled": False}}, "routing.hedging cannot change on a running fleet"),
    ({"reserve_ms": 9}, "routing.reserve_ms cannot change"),
])
def test_a_revision_no_node_could_run_live_is_refused_naming_why(
        control: RoutingControl, routing: dict[str, Any], message: str) -> None:
    control.apply({}, "tierlink up", start=True)
    with pytest.raises(ConfigError, match=message):
        control.apply(routing, "apply")
    assert [r.revision for r in control.store.history()] == [1]
    # a fleet that restarts with a new file may change anything
    if "cannot change" in message:
        assert control.apply(routing, "tierlink up", start=True).revision == 2


def test_live_keys_change_freely(control: RoutingControl) -> None:
    control.apply({}, "tierlink up", start=True)
    made = control.apply({"policy": "bandit", "weights": {"cost": 0.5},
                          "thresholds": {"m": 0.8}, "accuracy_tolerance": 0.5,
                          "shadow": {"policy": "device_only", "explore": 0.1},
                          "bandit": {"reward": {"miss": 0.9}}}, "apply")
    assert made.revision == 2 and parse_routing(made.routing).shadow is not None


def test_a_heartbeat_answer_carries_the_revision_a_node_does_not_run(
        tmp_path: Path, make_body: Any) -> None:
    registry = SqliteRegistryStore(tmp_path / "control.db")
    try:
        with TestClient(create_app(registry)) as client:
            def beat(running: int) -> dict[str, Any]:
                resp = client.post("/v1/nodes/edge-1/heartbeat",
                                   json=make_body(routing_revision=running))
                assert resp.status_code == 200, resp.text
                return dict(resp.json())

            assert "routing" not in beat(0)  # nothing stored: the spec's routing stands
            made = client.put("/v1/routing", json={"routing": section(policy="bandit"),
                                                   "start": True})
            assert made.status_code == 201 and made.json()["revision"] == 1
            assert beat(0)["routing"]["revision"] == 1
            assert beat(0)["routing"]["config"]["policy"] == "bandit"
            assert "routing" not in beat(1)
            refused = client.put("/v1/routing", json={"routing": {"polcy": "x"}})
            assert refused.status_code == 400 and "did you mean" in refused.text
            assert client.post("/v1/routing/revert").status_code == 409
            assert client.get("/v1/routing").json()["current"]["revision"] == 1
            fleet = client.get("/v1/fleet").json()  # the fleet view: who runs what
            assert fleet["routing_revision"] == 1
            assert [n["routing_revision"] for n in fleet["nodes"]] == [1]
    finally:
        registry.close()
