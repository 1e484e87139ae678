"""A conversation's KV cache as it travels between nodes: packed, checked, loaded.

A package is tied to the model that computed it (:func:`identity`: the weights file's
SHA-256, the precision the node serves it at and its kernels) and to the tokens it covers,
so a node loads only what its own model would have computed for that prefix. Its layout::

    b"TLKV" | version (1 byte) | header length (4 bytes, big-endian) | header (JSON)
    | body (zlib-compressed when the header says ``"zlib": true``)

The header names the identity, the codec, the cache's shape, its counters (``length``,
``seen``, ``evicted``), the tokens fed (``tokens``), the strictest privacy any of them
arrived with, its origin, and the SHA-256 of the uncompressed body. The body holds, layer
by layer, the keys then the values of the ``length`` slots in use, each (kv_heads, length,
head_dim):

* ``fp32`` — as the cache holds them: the next turn is computed exactly as if the
  conversation had not moved;
* ``fp16`` — half the bytes;
* ``int8`` — symmetric, one FP16 scale per (head, position) row of ``head_dim`` values:
  a quarter of the bytes plus 3%;
* ``int4`` — asymmetric in groups of 32 values (an FP16 scale and minimum each): 16% of
  the bytes.

Quantized keys and values change later logits a little: a greedy answer may part from the
unmoved one after some tokens. Keys and values compress poorly (zlib saves ~1% of FP32 and
~14% of INT8 at ~40 MB/s on one core: slower than the links it would save time on), so the
body goes as it is unless ``compress`` is asked for.

Keys are stored rotated (RoPE) at their slot positions, as the cache holds them.

A package may hold only the slots from ``start`` on (a *delta*: what a conversation added
since an earlier package was taken, ``pack(..., start=n)``); its header still lists every
token. Packages laid back to back form a *chain* — a whole package, then deltas each
starting where the one before ended, of the same tokens extended — which :func:`unpack`
loads as one cache: a copy kept of a conversation grows by its new slots each turn, not by
the whole cache again (``chat/copies.py``). The header's ``bytes`` is the body's size as
sent, which is where the next package of a chain begins.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import torch

from tierlink.core.types import Privacy
from tierlink.errors import InvalidRequest, PackageRefused
from tierlink.llm.kvcache import CacheBounds, KVCache
from tierlink.llm.source import CODECS
from tierlink.llm.weights import LlamaConfig

MAGIC = b"TLKV"
VERSION = 1
_PREFIX = struct.Struct(">4sBI")
MAX_HEADER_BYTES = 8 << 20  # the token list of a full context is ~100 KB of JSON


@dataclass(frozen=True, slots=True)
class Holder:
    """What a package says of the conversation beside its cache: everything it has fed
    (``tokens``) and who may hold it (the strictest privacy of its turns, their origin)."""

    tokens: tuple[int, ...]
    privacy: Privacy = Privacy.ANY
    origin: str | None = None


def identity(weights_sha256: str, precision: str, exact: bool) -> str:
    """Which caches a model computes: those of another file, precision or kernel differ."""
    return f"{weights_sha256}:{precision}:{'exact' if exact else 'fast'}"


@dataclass(frozen=True, slots=True)
class Slots:
    """A cache's slots [start, length) with its counters: what a package holds. Taken with
    ``copy=True`` they are the cache's as it was, to pack off the event loop while the
    conversation goes on."""

    config: LlamaConfig
    start: int
    length: int
    seen: int
    evicted: int
    k: tuple[torch.Tensor, ...]  # per layer: (kv_heads, length - start, head_dim)
    v: tuple[torch.Tensor, ...]


def slots(cache: KVCache, start: int = 0, copy: bool = False) -> Slots:
    """``cache``'s slots from ``start`` on (copied with ``copy``: a few ms per thousand)."""
    n = cache.length
    if not 0 <= start <= n:
        raise InvalidRequest(f"a package of slots from {start} on: the cache holds {n}")
    k = tuple(t[:, start:n] for t in cache.k)
    v = tuple(t[:, start:n] for t in cache.v)
    if copy:
        k, v = tuple(t.clone() for t in k), tuple(t.clone() for t in v)
    return Slots(cache.config, start, n, cache.seen, cache.evicted, k, v)


def pack(cache: KVCache | Slots, holder: Holder, model: str, codec: str = "fp16",
         compress: bool = False, start: int = 0) -> bytes:
    """``cache`` (its slots in use, from ``start`` on; or :class:`Slots` taken earlier) as a
    package for ``model`` (an :func:`identity`)."""
    if codec not in CODECS:
        raise InvalidRequest(f"unknown KV codec {codec!r}", hint=f"one of {', '.join(CODECS)}")
    got = cache if isinstance(cache, Slots) else slots(cache, start)
    cfg = got.config
    if codec == "int4" and cfg.head_dim % GROUP:
        raise InvalidRequest(f"int4 packs groups of {GROUP} values: this model's heads have "
                             f"{cfg.head_dim}", hint="use int8")
    body = b"".join(_encode(t, codec) for layer in range(cfg.num_layers)
                    for t in (got.k[layer], got.v[layer]))
    sent = zlib.compress(body, 1) if compress else body
    header = {"model": model, "codec": codec, "layers": cfg.num_layers,
              "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "start": got.start,
              "length": got.length, "seen": got.seen, "evicted": got.evicted,
              "tokens": list(holder.tokens), "privacy": holder.privacy.value,
              "origin": holder.origin, "sha256": hashlib.sha256(body).hexdigest(),
              "zlib": compress, "bytes": len(sent)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    return _PREFIX.pack(MAGIC, VERSION, len(raw)) + raw + sent


def read_header(blob: bytes) -> dict[str, Any]:
    """The package's header (the body is not read); a chain's: its last package's."""
    return _chain(blob)[-1][0]


def _chain(blob: bytes) -> list[tuple[dict[str, Any], bytes]]:
    """The packages laid back to back in ``blob`` (one or more), each's header and body."""
    out = []
    while True:
        header, rest = _split(blob)
        size = header.get("bytes", len(rest))
        if not isinstance(size, int) or not 0 <= size <= len(rest):
            raise PackageRefused(f"a KV package's body of {size!r} bytes is cut short")
        out.append((header, rest[:size]))
        blob = rest[size:]
        if not blob:
            return out


def _split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    """A package's header and what follows it (its body, then any next package)."""
    if len(blob) < _PREFIX.size:
        raise PackageRefused("a KV package is shorter than its prefix")
    magic, version, size = _PREFIX.unpack_from(blob)
    if magic != MAGIC or version != VERSION:
        raise PackageRefused(f"not a KV package of version {VERSION} (magic {magic!r}, "
                             f"version {version})")
    if size > MAX_HEADER_BYTES or len(blob) < _PREFIX.size + size:
        raise PackageRefused("a KV package's header is cut short or over its size limit")
    try:
        header = json.loads(blob[_PREFIX.size:_PREFIX.size + size])
    except ValueError as exc:
        raise PackageRefused(f"a KV package's header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise PackageRefused("a KV package's header is not a JSON object")
    return header, blob[_PREFIX.size + size:]


def holder_of(header: dict[str, Any]) -> Holder:
    try:
        return Holder(tuple(int(t) for t in header["tokens"]),
                      Privacy.parse(header.get("privacy", "any")), header.get("origin"))
    except (KeyError, TypeError, ValueError) as exc:
        raise PackageRefused(f"a KV package's header is malformed: {exc}") from None


def unpack(blob: bytes, config: LlamaConfig, model: str,
           bounds: CacheBounds | None = None) -> tuple[KVCache, Holder]:
    """The cache a package (or a chain of them) holds, for a node serving ``model`` (an
    :func:`identity`) with ``config``; refused (422, naming why) unless every check
    passes."""
    packages = _chain(blob)
    header = packages[-1][0]
    holder = holder_of(header)
    n = header.get("length")
    limit = (bounds.max_tokens if bounds is not None else None) or config.context_length
    if not isinstance(n, int) or n < 0 or n > limit or header.get("seen", -1) != len(
            holder.tokens) or n != len(holder.tokens) - header.get("evicted", -1):
        raise PackageRefused(f"a KV package's {n!r} slots do not match its "
                             f"{len(holder.tokens)} tokens (or this node's limit of {limit})")
    cache = KVCache(config, bounds, initial=max(n, 1))
    at, tokens = 0, holder.tokens[:0]
    for part, body in packages:
        at, tokens = _load(cache, part, body, config, model, (at, tokens, header))
    cache.length, cache.seen, cache.evicted = n, int(header["seen"]), int(header["evicted"])
    return cache, holder


def _load(cache: KVCache, header: dict[str, Any], packed: bytes, config: LlamaConfig,
          model: str, chain: tuple[int, tuple[int, ...], dict[str, Any]],
          ) -> tuple[int, tuple[int, ...]]:
    """One package of a chain into ``cache``'s slots [start, length); ``chain``: where the
    packages before it ended, their tokens, and the chain's last header. Returns where this
    one ends and its tokens."""
    at, before, last = chain
    if header.get("model") != model:
        raise PackageRefused(
            f"the KV cache was computed by model {header.get('model')!r}; this node's is "
            f"{model!r}", hint="a cache moves only between nodes serving the same model file "
                               "at the same precision")
    shape = (header.get("layers"), header.get("kv_heads"), header.get("head_dim"))
    if shape != (config.num_layers, config.num_kv_heads, config.head_dim):
        raise PackageRefused(f"the KV cache's shape {shape} is not this model's")
    codec, start, end = header.get("codec"), header.get("start", 0), header.get("length")
    tokens = holder_of(header).tokens
    if codec not in CODECS or not isinstance(end, int) or start != at or not at <= end \
            <= last["length"] or tokens[:len(before)] != before \
            or header.get("evicted") != last.get("evicted"):
        raise PackageRefused(f"a KV package of slots [{start!r}, {end!r}) in codec "
                             f"{codec!r} does not continue a chain ending at slot {at}",
                             hint="a chain is a whole package, then deltas of the same "
                                  "conversation, each from where the last one ended")
    rows = (config.num_kv_heads, end - start, config.head_dim)
    size = _encoded_bytes(rows, codec)
    expected = 2 * config.num_layers * size
    body = _inflate(packed, expected) if header.get("zlib") else packed
    if len(body) != expected:
        raise PackageRefused(f"a KV package's body has {len(body)} bytes, not the {expected} "
                             f"its header declares")
    if hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise PackageRefused("a KV package's body does not match its checksum")
    offset = 0
    for layer in range(config.num_layers):
        for store in (cache.k, cache.v):
            store[layer][:, start:end] = _decode(body[offset:offset + size], rows, codec)
            offset += size
    return end, tokens


def _inflate(packed: bytes, expected: int) -> bytes:
    """The body, refused unless it inflates to exactly ``expected`` bytes (never more is
    inflated: a package cannot make a node allocate beyond what its header declares)."""
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(packed, expected + 1)
    except zlib.error as exc:
        raise PackageRefused(f"a KV package's body does not decompress: {exc}") from None
    if len(body) != expected or not inflater.eof:
        raise PackageRefused(f"a KV package's body is not the {expected} bytes its header "
                             f"declares")
    return body


def _encode(t: torch.Tensor, codec: str) -> bytes:
    t = t.contiguous()
    if codec == "fp32":
        return t.numpy().tobytes()
    if codec == "fp16":
        return t.half().numpy().tobytes()
    if codec == "int4":
        return _int4(t)
    scale = (t.abs().amax(dim=-1, keepdim=True) / 127.0).clamp_min(1e-8).half()
    q = torch.round(t / scale.float()).clamp(-127, 127).to(torch.int8)
    return scale.numpy().tobytes() + q.numpy().tobytes()


GROUP = 32  # int4: values per (scale, minimum) pair


def _int4(t: torch.Tensor) -> bytes:
    groups = t.reshape(-1, GROUP)
    low = groups.amin(dim=1, keepdim=True).half()
    scale = ((groups.amax(dim=1, keepdim=True) - low.float()) / 15.0).clamp_min(1e-8).half()
    q = torch.round((groups - low.float()) / scale.float()).clamp(0, 15).to(torch.uint8)
    nibbles = q[:, 0::2] | (q[:, 1::2] << 4)
    return scale.numpy().tobytes() + low.numpy().tobytes() + nibbles.numpy().tobytes()


def _from_int4(raw: bytes, rows: tuple[int, int, int]) -> torch.Tensor:
    n_groups = rows[0] * rows[1] * rows[2] // GROUP
    scale = torch.frombuffer(bytearray(raw[:2 * n_groups]), dtype=torch.float16)
    low = torch.frombuffer(bytearray(raw[2 * n_groups:4 * n_groups]), dtype=torch.float16)
    nibbles = torch.frombuffer(bytearray(raw[4 * n_groups:]), dtype=torch.uint8)
    nibbles = nibbles.view(n_groups, GROUP // 2)
    q = torch.stack([nibbles & 0xF, nibbles >> 4], dim=-1).view(n_groups, GROUP)
    values = q.float() * scale.float().view(-1, 1) + low.float().view(-1, 1)
    return values.view(rows)


def _decode(raw: bytes, rows: tuple[int, int, int], codec: str) -> torch.Tensor:
    if codec == "fp32":
        return torch.frombuffer(bytearray(raw), dtype=torch.float32).view(rows)
    if codec == "fp16":
        return torch.frombuffer(bytearray(raw), dtype=torch.float16).view(rows).float()
    if codec == "int4":
        return _from_int4(raw, rows)
    heads, n, _ = rows
    split = heads * n * 2
    scale = torch.frombuffer(bytearray(raw[:split]), dtype=torch.float16).view(heads, n, 1)
    q = torch.frombuffer(bytearray(raw[split:]), dtype=torch.int8).view(rows)
    return q.float() * scale.float()


def _encoded_bytes(rows: tuple[int, int, int], codec: str) -> int:
    heads, n, dim = rows
    values = heads * n * dim
    return {"fp32": 4 * values, "fp16": 2 * values, "int8": values + 2 * heads * n,
            "int4": values // 2 + 4 * (values // GROUP)}[codec]


def package_bytes(config: LlamaConfig, tokens: int, codec: str) -> int:
    """A package's body size before compression (what a move weighs, for the decision)."""
    return 2 * config.num_layers * _encoded_bytes(
        (config.num_kv_heads, tokens, config.head_dim), codec)
