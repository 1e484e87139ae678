"""A conversation re-placed between two upstreams: the node its turns enter through asks
the upstream that answered the last turn to ship the cache to the one the policy places the
next turn on, which continues from it — the answer the first upstream would have given."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tierlink.core.types import Tier
from tierlink.llm.source import LMSource
from tierlink.node.spec import NodeSpec, UpstreamSpec
from tierlink.testing.processes import node_process

pytestmark = pytest.mark.integration

FIRST = [{"role": "user", "content": "Name three rivers in Europe."}]


def _spec(node_id: str, tier: str, run_dir: Path, **kw: Any) -> NodeSpec:
    return NodeSpec(node_id=node_id, tier=Tier.parse(tier), models=(), port=0,
                    ready_file=str(run_dir / f"{node_id}.ready"),
                    chat_tasks={"chat": "smollm2"}, **kw)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A device with no model of its own, a cloud whose model is declared the better one
    (so an `any` prompt goes there) and an edge serving the same weights file."""
    run_dir = tmp_path_factory.mktemp("handoff")
    cloud_spec = _spec("cloud-1", "cloud", run_dir, llms=(
        LMSource("smollm2", "smollm2-135m", quality=0.9, kv_move="always", kv_codec="fp32"),))
    edge_spec = _spec("edge-1", "edge", run_dir,
                      llms=(LMSource("smollm2", "smollm2-135m", quality=0.5),))
    with node_process(cloud_spec, run_dir, timeout_s=120) as (cloud, _), \
            node_process(edge_spec, run_dir, timeout_s=120) as (edge, _):
        device_spec = _spec("dev-1", "device", run_dir, upstreams=(
            UpstreamSpec("cloud-1", cloud), UpstreamSpec("edge-1", edge)))
        with node_process(device_spec, run_dir, timeout_s=120) as (device, _):
            yield {"cloud": cloud, "edge": edge, "device": device}


def _turn(url: str, messages: list[dict[str, str]], session: str, privacy: str,
          mode: str = "auto") -> dict[str, Any]:
    body = {"model": "chat", "messages": messages, "max_tokens": 12, "temperature": 0,
            "tierlink": {"session": session, "privacy": privacy, "mode": mode}}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_the_holder_ships_the_cache_where_the_next_turn_goes(fleet) -> None:
    first = _turn(fleet["device"], FIRST, "conv", "any")
    assert first["tierlink"]["served_by"] == "cloud-1", first["tierlink"]
    second = [*FIRST, {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
              {"role": "user", "content": "Which of them is the longest?"}]
    moved = _turn(fleet["device"], second, "conv", "site")  # the cloud may not hold it now
    meta = moved["tierlink"]
    assert meta["served_by"] == "edge-1", meta
    assert meta["kv"]["moved"] is True and meta["kv"]["from"] == "cloud-1", meta["kv"]
    assert moved["usage"]["prompt_tokens_details"]["cached_tokens"] > 20
    # what the cloud would have answered, had the turn stayed there
    stayed = _turn(fleet["cloud"], second, "conv", "any", mode="local")
    assert moved["choices"][0]["message"]["content"] == \
        stayed["choices"][0]["message"]["content"]


def test_a_ship_request_is_checked(fleet) -> None:
    ship = fleet["cloud"] + "/tierlink/v1/llm/kv/ship"
    gone = httpx.post(ship, json={"session": "nobody", "to": {
        "node_id": "edge-1", "tier": "edge", "url": fleet["edge"],
        "model": {"name": "smollm2"}}})
    assert gone.status_code == 200 and gone.json() == {"moved": False,
                                                       "reason": "no longer held here"}
    bad = httpx.post(ship, json={"session": "conv", "to": {"node_id": "edge-1"}})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"
    assert httpx.post(ship, content=b"{").status_code == 400
