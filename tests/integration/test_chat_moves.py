"""A conversation that moves between real node processes: a device holding its KV cache
ships it to the cloud that answers the next turn, which continues exactly as the device
would have (FP32 package, the same weights file on both); a ``local`` conversation's cache
never leaves its device; the receiving end refuses what it may not or cannot hold. And a
conversation re-placed between two upstreams: the node its turns enter through asks the
upstream that answered the last turn to ship the cache to the one the next turn goes to,
which answers as the first would have."""

from __future__ import annotations

import signal
import time
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
    run_dir = tmp_path_factory.mktemp("moves")
    cloud_spec = _spec("cloud-1", "cloud", run_dir, llms=(LMSource("smollm2", "smollm2-135m"),))
    with node_process(cloud_spec, run_dir, timeout_s=120) as (cloud, _):
        device_spec = _spec("dev-1", "device", run_dir,
                            upstreams=(UpstreamSpec("cloud-1", cloud),),
                            llms=(LMSource("smollm2", "smollm2-135m", kv_move="always",
                                           kv_codec="fp32"),))
        with node_process(device_spec, run_dir, timeout_s=120) as (device, _):
            yield {"cloud": cloud, "device": device}


def _turn(url: str, messages: list[dict[str, str]], session: str, mode: str,
          privacy: str = "any") -> dict[str, Any]:
    body = {"model": "chat", "messages": messages, "max_tokens": 12, "temperature": 0,
            "tierlink": {"session": session, "mode": mode, "privacy": privacy}}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _second(first: dict[str, Any]) -> list[dict[str, str]]:
    return [*FIRST, {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
            {"role": "user", "content": "Which of them is the longest?"}]


def test_the_next_turn_moves_with_its_cache_and_answers_as_unmoved(fleet) -> None:
    device = fleet["device"]
    first = _turn(device, FIRST, "moved", "local")
    moved = _turn(device, _second(first), "moved", "remote")
    meta = moved["tierlink"]
    assert meta["served_by"] == "cloud-1", meta
    assert meta["kv"]["moved"] is True and meta["kv"]["codec"] == "fp32", meta["kv"]
    assert moved["usage"]["prompt_tokens_details"]["cached_tokens"] > 20  # not prefilled
    # the same conversation kept on the device: the same next answer, token for token
    _turn(device, FIRST, "stayed", "local")
    stayed = _turn(device, _second(first), "stayed", "local")
    assert stayed["tierlink"]["served_by"] == "dev-1"
    assert moved["choices"][0]["message"]["content"] == \
        stayed["choices"][0]["message"]["content"]
    metrics = httpx.get(fleet["cloud"] + "/metrics").text
    assert 'tierlink_llm_kv_moves_total{direction="in",model="smollm2",outcome="moved",' \
           'tier="cloud"} 1.0' in metrics


def test_a_local_conversations_cache_stays_on_its_device(fleet) -> None:
    device = fleet["device"]
    first = _turn(device, FIRST, "private", "local", privacy="local")
    later = _turn(device, _second(first), "private", "remote")  # this turn may leave
    kv = later["tierlink"]["kv"]
    assert kv["moved"] is False and "local" in kv["reason"]
    assert later["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # prefilled there


def test_the_receiving_end_refuses_what_it_may_not_hold(fleet) -> None:
    from tierlink.core.types import Privacy
    from tierlink.llm.kvcache import KVCache
    from tierlink.llm.kvship import Holder, pack
    from tierlink.llm.weights import model_dir, read_config

    cloud = fleet["cloud"] + "/tierlink/v1/llm"
    cache = KVCache(read_config(model_dir("smollm2-135m")))
    local = pack(cache, Holder((), Privacy.LOCAL, "dev-1"), "any:fp32:exact", "fp16")
    refused = httpx.put(f"{cloud}/smollm2/kv", params={"session": "x"}, content=local)
    assert refused.status_code == 403 and refused.json()["code"] == "privacy_violation"
    other = pack(cache, Holder((), Privacy.ANY, "dev-1"), "other:fp32:exact", "fp16")
    wrong = httpx.put(f"{cloud}/smollm2/kv", params={"session": "x"}, content=other)
    assert wrong.status_code == 422 and "same model file" in wrong.json()["hint"]
    junk = httpx.put(f"{cloud}/smollm2/kv", params={"session": "x"}, content=b"junk" * 10)
    assert junk.status_code == 422
    missing = httpx.put(f"{cloud}/nope/kv", params={"session": "x"}, content=other)
    assert missing.status_code == 404
    assert httpx.get(fleet["cloud"] + "/v2/health/ready").status_code == 200


@pytest.fixture(scope="module")
def re_placed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A device with no model of its own that keeps copies of its conversations, a cloud
    whose model is declared the better one (so an `any` prompt goes there) and an edge
    serving the same weights file. The last test of the module kills the cloud."""
    run_dir = tmp_path_factory.mktemp("handoff")
    cloud_spec = _spec("cloud-1", "cloud", run_dir, llms=(
        LMSource("smollm2", "smollm2-135m", quality=0.9, kv_move="always", kv_codec="fp32"),))
    edge_spec = _spec("edge-1", "edge", run_dir,
                      llms=(LMSource("smollm2", "smollm2-135m", quality=0.5),))
    with node_process(cloud_spec, run_dir, timeout_s=120) as (cloud, cloud_proc), \
            node_process(edge_spec, run_dir, timeout_s=120) as (edge, _):
        device_spec = _spec("dev-1", "device", run_dir, kv_copies=True, upstreams=(
            UpstreamSpec("cloud-1", cloud), UpstreamSpec("edge-1", edge)))
        with node_process(device_spec, run_dir, timeout_s=120) as (device, _):
            yield {"cloud": cloud, "edge": edge, "device": device, "cloud_proc": cloud_proc}


def test_the_holder_ships_the_cache_where_the_next_turn_goes(re_placed) -> None:
    fleet = re_placed
    first = _turn(fleet["device"], FIRST, "conv", "auto")
    assert first["tierlink"]["served_by"] == "cloud-1", first["tierlink"]
    second = _second(first)
    moved = _turn(fleet["device"], second, "conv", "auto", privacy="site")  # not the cloud
    meta = moved["tierlink"]
    assert meta["served_by"] == "edge-1", meta
    assert meta["kv"]["moved"] is True and meta["kv"]["from"] == "cloud-1", meta["kv"]
    assert moved["usage"]["prompt_tokens_details"]["cached_tokens"] > 20
    # what the cloud would have answered, had the turn stayed there
    stayed = _turn(fleet["cloud"], second, "conv", "local")
    assert moved["choices"][0]["message"]["content"] == \
        stayed["choices"][0]["message"]["content"]


def test_a_ship_request_is_checked(re_placed) -> None:
    fleet = re_placed
    ship = fleet["cloud"] + "/tierlink/v1/llm/kv/ship"
    gone = httpx.post(ship, json={"session": "nobody", "to": {
        "node_id": "edge-1", "tier": "edge", "url": fleet["edge"],
        "model": {"name": "smollm2"}}})
    assert gone.status_code == 200 and gone.json() == {"moved": False,
                                                       "reason": "no longer held here"}
    bad = httpx.post(ship, json={"session": "conv", "to": {"node_id": "edge-1"}})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"
    assert httpx.post(ship, content=b"{").status_code == 400


def test_a_copy_is_given_only_to_the_conversations_origin(re_placed) -> None:
    kv = re_placed["cloud"] + "/tierlink/v1/llm/smollm2/kv"
    _turn(re_placed["device"], FIRST, "asked", "remote")  # held at the cloud, from dev-1
    whole = httpx.get(kv, params={"session": "asked", "for": "dev-1"})
    assert whole.status_code == 200 and whole.content[:4] == b"TLKV"
    other = httpx.get(kv, params={"session": "asked", "for": "edge-1"})
    assert other.status_code == 403 and other.json()["code"] == "privacy_violation"
    assert httpx.get(kv, params={"session": "nobody", "for": "dev-1"}).status_code == 404
    bad = httpx.get(kv, params={"session": "asked", "for": "dev-1", "since": "x"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"
    assert httpx.get(kv, params={"session": "asked"}).status_code == 400


def _copies_kept(device: str) -> float:
    text = httpx.get(device + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tierlink_llm_kv_moves_total{")
               and 'direction="copy"' in line and 'outcome="kept"' in line)


def test_when_the_holder_fails_the_copy_kept_where_the_turns_enter_moves(re_placed) -> None:
    fleet = re_placed
    first = _turn(fleet["device"], FIRST, "kept", "auto")
    assert first["tierlink"]["served_by"] == "cloud-1", first["tierlink"]
    deadline = time.monotonic() + 30
    while _copies_kept(fleet["device"]) < 1:  # fetched in the background after the turn
        assert time.monotonic() < deadline, "the device kept no copy"
        time.sleep(0.1)
    fleet["cloud_proc"].send_signal(signal.SIGKILL)  # the holder fails
    fleet["cloud_proc"].wait(10)
    second = _second(first)
    moved = _turn(fleet["device"], second, "kept", "auto")
    meta = moved["tierlink"]
    assert meta["served_by"] == "edge-1", meta
    assert meta["kv"]["moved"] is True and meta["kv"]["copy"] is True, meta["kv"]
    assert meta["kv"]["from"] == "dev-1" and meta["kv"]["codec"] == "fp32"
    assert moved["usage"]["prompt_tokens_details"]["cached_tokens"] > 20
    # what the cloud would have answered: the same weights continuing the same history
    _turn(fleet["edge"], FIRST, "reference", "local")
    stayed = _turn(fleet["edge"], second, "reference", "local")
    assert moved["choices"][0]["message"]["content"] == \
        stayed["choices"][0]["message"]["content"]
