"""The fleet file's ``chat:`` blocks: language models per node, verifiers checked."""

from __future__ import annotations

import pytest
import yaml

from tierlink.errors import ConfigError
from tierlink.fleet.config import parse_fleet

FLEET = """
name: chat
nodes:
  - {id: cloud-1, tier: cloud, models: [],
     chat: {task: chat, models: [{name: smollm2, model: smollm2-135m}]}}
  - {id: dev-1, tier: device, models: [],
     chat: {task: chat, models: [{name: smollm2, model: smollm2-135m, quantize: int8,
                                  verifier: cloud-1/smollm2, kv_cache_mib: 12}]}}
links:
  - {from: [dev-1], to: [cloud-1], delay_ms: 10}
"""


def test_chat_models_and_their_verifier() -> None:
    fleet = parse_fleet(yaml.safe_load(FLEET))
    device = next(n for n in fleet.nodes if n.node_id == "dev-1")
    assert device.chat is not None
    source = device.chat.models[0]
    assert source.quantize == "int8" and source.verifier == "cloud-1/smollm2"
    assert source.verifier_tier == "cloud" and source.kv_cache_bytes == 12 * 2**20
    assert device.chat.tasks() == {"chat": "smollm2"}
    assert (source.kv_move, source.kv_codec) == ("auto", "int8")  # the defaults
    moving = parse_fleet(yaml.safe_load(FLEET.replace(
        "kv_cache_mib: 12", "kv_cache_mib: 12, kv_move: always, kv_codec: int4")))
    moved = next(n for n in moving.nodes if n.node_id == "dev-1").chat
    assert moved is not None and (moved.models[0].kv_move, moved.models[0].kv_codec) == \
        ("always", "int4")
    assert source.draft_ahead and not device.chat.kv_copies  # the defaults
    keeping = parse_fleet(yaml.safe_load(FLEET.replace(
        "kv_cache_mib: 12}]}", "kv_cache_mib: 12, draft_ahead: false}], kv_copies: true}")))
    kept = next(n for n in keeping.nodes if n.node_id == "dev-1").chat
    assert kept is not None and kept.kv_copies and not kept.models[0].draft_ahead
    assert kept.to_dict()["kv_copies"] is True
    assert kept.to_dict()["models"][0]["draft_ahead"] is False


def test_a_model_on_the_llama_cpp_runtime() -> None:
    fleet = parse_fleet(yaml.safe_load(FLEET.replace(
        "quantize: int8,", "runtime: llama.cpp,").replace(", kv_cache_mib: 12", "")))
    device = next(n for n in fleet.nodes if n.node_id == "dev-1")
    assert device.chat is not None
    source = device.chat.models[0]
    assert (source.runtime, source.format, source.quantize) == ("llama.cpp", "gguf", None)
    assert device.chat.to_dict()["models"][0]["runtime"] == "llama.cpp"
    cloud = next(n for n in fleet.nodes if n.node_id == "cloud-1").chat
    assert cloud is not None and cloud.models[0].format == "llm"  # torch, the default
    assert "runtime" not in cloud.to_dict()["models"][0]


def test_a_model_split_toward_an_upstream() -> None:
    fleet = parse_fleet(yaml.safe_load(FLEET.replace(
        "quantize: int8,", "split: {to: cloud-1/smollm2, cut: 6, codec: fp32},")))
    device = next(n for n in fleet.nodes if n.node_id == "dev-1").chat
    assert device is not None
    source = device.models[0]
    assert (source.split, source.split_cut, source.split_codec, source.split_tier) == \
        ("cloud-1/smollm2", 6, "fp32", "cloud")
    assert device.to_dict()["models"][0]["split"] == {"to": "cloud-1/smollm2", "cut": 6,
                                                      "codec": "fp32"}


@pytest.mark.parametrize(("old", "new"), [
    ("verifier: cloud-1/smollm2", "verifier: cloud-1/other"),  # not served there
    ("{from: [dev-1], to: [cloud-1], delay_ms: 10}", "{from: [cloud-1], to: [dev-1]}"),
    ("quantize: int8", "quantize: int3"),
    ("kv_cache_mib: 12", "kv_cache_mib: -1"),
    ("kv_cache_mib: 12", "kv_cache: 12"),
    ("verifier: cloud-1/smollm2", "verifier: cloud-1"),
    ("kv_cache_mib: 12", "kv_cache_mib: 12, kv_move: sometimes"),
    ("kv_cache_mib: 12", "kv_cache_mib: 12, kv_codec: int2"),
    ("kv_cache_mib: 12", "kv_cache_mib: 12, draft_ahead: sometimes"),
    ("kv_cache_mib: 12}]}", "kv_cache_mib: 12}], kv_copies: yes please}"),
    ("kv_cache_mib: 12}]}", "kv_cache_mib: 12}], kv_copy: true}"),  # misspelled
    ("quantize: int8,", "quantize: int8, runtime: llamacpp,"),  # misspelled
    ("quantize: int8,", "quantize: int8, runtime: llama.cpp,"),  # a GGUF is quantized
    ("quantize: int8,", "runtime: llama.cpp,"),  # ... and slides no bounded cache
    ("quantize: int8,", "split: {to: cloud-1/other},"),  # not served there
    ("quantize: int8,", "split: {to: cloud-1/smollm2, cut: 0},"),
    ("quantize: int8,", "split: {to: cloud-1/smollm2, codec: int4},"),
    ("quantize: int8,", "split: {to: cloud-1/smollm2, cutt: 8},"),  # misspelled
    ("quantize: int8,", "split: cloud-1/smollm2,"),
])
def test_bad_chat_blocks_are_refused(old: str, new: str) -> None:
    with pytest.raises(ConfigError):
        parse_fleet(yaml.safe_load(FLEET.replace(old, new)))
