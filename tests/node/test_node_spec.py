"""A node's spec: the address it registers (``advertise_url``, else the bound one; never
an address no peer could use) survives the JSON the launcher writes."""

from __future__ import annotations

import pytest

from tierlink.core.types import Tier
from tierlink.errors import ConfigError
from tierlink.fleet.config import parse_fleet
from tierlink.node.spec import NodeSpec


def _spec(**kw: object) -> NodeSpec:
    return NodeSpec(node_id="edge-1", tier=Tier.EDGE, models=(), **kw)  # type: ignore[arg-type]


def test_the_registered_address_is_the_advertised_one_else_the_bound_one() -> None:
    assert _spec(host="127.0.0.1").advertised(8001) == "http://127.0.0.1:8001"
    spec = _spec(host="0.0.0.0", advertise_url="http://edge-1.site-a.example:8001/")
    assert spec.advertised(8001) == "http://edge-1.site-a.example:8001"
    assert NodeSpec.from_json(spec.to_json()).advertise_url == spec.advertise_url
    with pytest.raises(ConfigError, match="binds every interface") as caught:
        _spec(host="0.0.0.0").advertised(8001)
    assert "advertise_url" in str(caught.value.hint)
    with pytest.raises(ConfigError, match="advertise_url must be a base URL"):
        _spec(advertise_url="edge-1:8001").advertised(8001)


def test_a_fleet_file_names_the_address_a_node_advertises() -> None:
    raw = {"name": "f", "nodes": [
        {"id": "edge-1", "tier": "edge", "models": [], "advertise_url": "https://e1.example"},
        {"id": "dev-1", "tier": "device", "models": []}], "links": []}
    config = parse_fleet(raw)
    assert config.node("edge-1").advertise_url == "https://e1.example"
    assert config.node("dev-1").advertise_url is None
    raw["nodes"][1]["advertise_url"] = "dev-1"
    with pytest.raises(ConfigError, match=r"nodes\[1\].advertise_url"):
        parse_fleet(raw)


def test_a_nodes_thread_budget_reaches_every_model_it_loads(monkeypatch) -> None:
    """``threads`` opens each model's session with that many intra-op threads: at start
    (``load_runtimes``) and for every version installed later (``model_host``)."""
    from pathlib import Path

    from tierlink.core.types import Tier
    from tierlink.models.runtimes import LoadSpec
    from tierlink.node import main
    from tierlink.node.spec import ModelSource, NodeSpec

    loaded: list[LoadSpec] = []
    monkeypatch.setattr(main.model_runtimes, "load", lambda spec: loaded.append(spec) or spec)
    spec = NodeSpec("c", Tier.CLOUD, (ModelSource("m", "m.onnx", "card.json"),), threads=2)
    main.load_runtimes(spec, main.model_runtimes.load)
    main.model_host(spec)(LoadSpec(card=Path("v2/card.json")))
    assert [s.threads for s in loaded] == [2, 2]
    assert NodeSpec.from_json(spec.to_json()).threads == 2
