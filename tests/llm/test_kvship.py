"""A conversation's KV package: exact in FP32, close in FP16 and INT8, and refused — never
loaded half — when it is another model's, broken, cut short or inconsistent."""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import replace

import pytest
import torch

from tierlink.core.types import Privacy
from tierlink.errors import InvalidRequest, PackageRefused
from tierlink.llm.kvcache import CacheBounds, KVCache
from tierlink.llm.kvship import Holder, pack, package_bytes, read_header, unpack
from tierlink.llm.weights import LlamaConfig

CFG = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=32, num_layers=2,
                  num_heads=2, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5,
                  rope_theta=1e4, context_length=64, bos_token_id=1, eos_token_ids=(2,))
MODEL = "abc123:fp32:exact"


def _cache(n: int = 10) -> KVCache:
    torch.manual_seed(0)
    cache = KVCache(CFG)
    cache.make_room(n, lambda k, _by: k)
    for layer in range(CFG.num_layers):
        cache.write(layer, 0, torch.randn(2, n, 32), torch.randn(2, n, 32) * 3)
    cache.advance(n)
    return cache


def _holder(n: int = 10) -> Holder:
    return Holder(tuple(range(3, 3 + n)), Privacy.SITE, "dev-1")


def test_fp32_round_trip_is_exact() -> None:
    cache = _cache()
    moved, holder = unpack(pack(cache, _holder(), MODEL, "fp32"), CFG, MODEL)
    assert holder == _holder()
    assert (moved.length, moved.seen, moved.evicted) == (10, 10, 0)
    for layer in range(CFG.num_layers):
        assert torch.equal(moved.k[layer][:, :10], cache.k[layer][:, :10])
        assert torch.equal(moved.v[layer][:, :10], cache.v[layer][:, :10])


@pytest.mark.parametrize(("codec", "tolerance"), [("fp16", 2e-3), ("int8", 1.5e-2),
                                                  ("int4", 7e-2)])
def test_lossy_codecs_stay_close_and_are_smaller(codec: str, tolerance: float) -> None:
    cache = _cache()
    blob = pack(cache, _holder(), MODEL, codec)
    moved, _ = unpack(blob, CFG, MODEL)
    for layer in range(CFG.num_layers):
        for got, want in ((moved.k[layer], cache.k[layer]), (moved.v[layer], cache.v[layer])):
            rel = (got[:, :10] - want[:, :10]).abs().max() / want[:, :10].abs().max()
            assert 0 < rel <= tolerance
    assert package_bytes(CFG, 10, codec) < package_bytes(CFG, 10, "fp32")
    assert read_header(blob)["codec"] == codec


def test_another_models_cache_is_refused() -> None:
    blob = pack(_cache(), _holder(), MODEL, "fp16")
    with pytest.raises(PackageRefused, match="same model file"):
        unpack(blob, CFG, "other:fp32:exact")
    with pytest.raises(PackageRefused, match="shape"):
        unpack(blob, replace(CFG, num_layers=3), MODEL)


def test_a_broken_or_inconsistent_package_is_refused() -> None:
    blob = pack(_cache(), _holder(), MODEL, "fp32")
    header = read_header(blob)
    with pytest.raises(PackageRefused):
        unpack(blob[:-40], CFG, MODEL)  # cut short
    flipped = bytearray(blob)
    flipped[-60] ^= 0xFF
    with pytest.raises(PackageRefused):
        unpack(bytes(flipped), CFG, MODEL)  # checksum or inflate
    with pytest.raises(PackageRefused, match="magic"):
        unpack(b"NOPE" + blob[4:], CFG, MODEL)
    # a header that claims other tokens than its slots
    lying = pack(_cache(), Holder(tuple(range(12))), MODEL, "fp32")
    with pytest.raises(PackageRefused, match="tokens"):
        unpack(lying, CFG, MODEL)
    # a body that inflates to more than the header declares is not inflated whole
    squeezed = pack(_cache(), _holder(), MODEL, "fp32", compress=True)
    assert unpack(squeezed, CFG, MODEL)[0].length == 10
    prefix = struct.Struct(">4sBI")
    size = prefix.unpack_from(squeezed)[2]
    bomb_body = zlib.compress(b"\0" * (1 << 24))
    bomb_header = json.loads(squeezed[prefix.size:prefix.size + size]) | {
        "bytes": len(bomb_body)}
    raw = json.dumps(bomb_header).encode()
    bomb = prefix.pack(b"TLKV", 1, len(raw)) + raw + bomb_body
    with pytest.raises(PackageRefused, match="declares"):
        unpack(bomb, CFG, MODEL)
    with pytest.raises(PackageRefused, match="shorter than its prefix"):
        unpack(blob + b"extra", CFG, MODEL)  # what follows a package is the next one
    assert header["length"] == 10


def test_unknown_codec_is_the_callers_mistake() -> None:
    with pytest.raises(InvalidRequest, match="codec"):
        pack(_cache(), _holder(), MODEL, "bf8")
    narrow = KVCache(replace(CFG, head_dim=8, hidden_size=16))
    with pytest.raises(InvalidRequest, match="groups of 32"):
        pack(narrow, Holder(()), MODEL, "int4")


def test_a_bounded_cache_that_slid_keeps_its_counters() -> None:
    bounds = CacheBounds(max_tokens=24, sinks=2, evict_chunk=4)
    cache = KVCache(CFG, bounds)
    for _ in range(4):  # 32 tokens through a 24-slot window
        cache.make_room(8, lambda k, _by: k)
        start = cache.length
        for layer in range(CFG.num_layers):
            cache.write(layer, start, torch.ones(2, 8, 32), torch.ones(2, 8, 32))
        cache.advance(8)
    assert cache.evicted > 0
    moved, _ = unpack(pack(cache, Holder(tuple(range(32))), MODEL, "fp32"), CFG, MODEL,
                      bounds)
    assert (moved.length, moved.seen, moved.evicted) == (cache.length, 32, cache.evicted)
    assert moved.bounds == bounds


def _cache_at(n: int) -> KVCache:
    """``_cache()`` when the conversation had fed its first ``n`` tokens."""
    early = _cache()
    early.length = early.seen = n
    return early


def _first(n: int) -> bytes:
    """A whole package of the conversation's first ``n`` slots."""
    return pack(_cache_at(n), _holder(n), MODEL, "fp32")


def test_a_chain_of_a_whole_package_and_deltas_loads_as_the_whole_cache() -> None:
    cache = _cache()
    delta = pack(cache, _holder(), MODEL, "fp32", start=6)
    assert len(delta) < len(pack(cache, _holder(), MODEL, "fp32"))  # only the new slots
    assert read_header(delta)["start"] == 6
    moved, holder = unpack(_first(4) + pack(_cache_at(6), _holder(6), MODEL, "fp32", start=4)
                           + delta, CFG, MODEL)
    assert holder == _holder() and (moved.length, moved.seen) == (10, 10)
    for layer in range(CFG.num_layers):
        assert torch.equal(moved.k[layer][:, :10], cache.k[layer][:, :10])
        assert torch.equal(moved.v[layer][:, :10], cache.v[layer][:, :10])


def test_a_chain_with_a_gap_or_other_tokens_is_refused() -> None:
    cache = _cache()
    with pytest.raises(PackageRefused, match="continue"):
        unpack(pack(cache, _holder(), MODEL, "fp32", start=6), CFG, MODEL)  # no whole one
    with pytest.raises(PackageRefused, match="continue"):
        unpack(_first(5) + pack(cache, _holder(), MODEL, "fp32", start=6), CFG, MODEL)
    other = Holder(tuple(range(50, 60)), Privacy.SITE, "dev-1")
    with pytest.raises(PackageRefused, match="continue"):
        unpack(_first(6) + pack(cache, other, MODEL, "fp32", start=6), CFG, MODEL)
    with pytest.raises(InvalidRequest, match="slots from 11"):
        pack(cache, _holder(), MODEL, "fp32", start=11)
