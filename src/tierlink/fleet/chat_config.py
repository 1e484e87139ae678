"""A node's ``chat:`` block in the fleet file: the language models it serves.

::

    - id: dev-1
      tier: device
      chat:
        task: chat                 # the task name requests may use (routed to these models)
        models:
          - name: smollm2          # what requests and /v1/models call it
            model: smollm2-135m    # a packaged model (tierlink llm list) or a directory
            runtime: torch         # optional: torch (default) or llama.cpp (the GGUF as it
                                   # ships; ./scripts/setup.sh --llama builds it)
            quantize: int8         # optional: serve an INT8 copy (a device's own model)
            verifier: cloud-1/smollm2   # optional: draft for that upstream's model
            draft_ahead: true      # optional: draft the next round while one is verified
            kv_cache_mib: 12       # optional: bounded KV cache per sequence (sliding window)
            router: router.json    # optional: easy prompts answered here, hard ones verified
            quality: 0.563         # optional: measured on labelled prompts; placement weighs it
            kv_move: auto          # optional: ship a conversation's cache to the upstream that
                                   # answers its next turn: auto (when faster than prefilling
                                   # there), always or never
            kv_codec: int8         # optional: the cache on the wire: fp32 (exact), fp16, int8,
                                   # int4
            split:                 # optional: run only the first `cut` layers here and the rest
              to: cloud-1/smollm2  # on that upstream's model (the same weights), sending the
              cut: 8               # rows' hidden states (codec fp16, fp32, int8 or int8c):
              codec: fp16          # where routing.local_features_may_leave lets them go
        kv_copies: false           # optional: keep a copy of each conversation this node
                                   # relays (its new KV slots fetched after every turn), so
                                   # the next turn can go elsewhere if the holder fails

A verifier (and a split's `to`) must be a node this one has a link to, serving that model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tierlink.errors import ConfigError
from tierlink.llm.source import CODECS, MOVES, RUNTIMES, LMSource
from tierlink.settings.fields import known_keys


@dataclass(frozen=True, slots=True)
class ChatConfig:
    models: tuple[LMSource, ...]  # the language models the node serves (at least one)
    # A name requests may give as their model: it is answered by the first of `models`
    task: str | None = None
    # Keep copies of the conversations this node relays upstream (chat/copies.py)
    kv_copies: bool = False

    def tasks(self) -> dict[str, str]:
        return {self.task: self.models[0].name} if self.task and self.models else {}

    def to_dict(self) -> dict[str, Any]:
        """A node's ``chat:`` block (what :func:`parse_chat` reads)."""
        out: dict[str, Any] = {"models": [_source_dict(m) for m in self.models]}
        return out | ({"task": self.task} if self.task else {}) | (
            {"kv_copies": True} if self.kv_copies else {})


def _source_dict(src: LMSource) -> dict[str, Any]:
    out: dict[str, Any] = {"name": src.name, "model": src.path,
                           "max_sequences": src.max_sequences}
    optional = {"runtime": None if src.runtime == "torch" else src.runtime,"quantize": src.quantize, "verifier": src.verifier, "router": src.router,
                "quality": src.quality,
                "kv_move": None if src.kv_move == "auto" else src.kv_move,
                "kv_codec": None if src.kv_codec == "int8" else src.kv_codec,
                "draft_ahead": None if src.draft_ahead else False,
                "split": None if src.split is None else
                {"to": src.split, "cut": src.split_cut, "codec": src.split_codec},
                "kv_cache_mib": None if src.kv_cache_bytes is None
                else src.kv_cache_bytes / 2**20}
    return out | {k: v for k, v in optional.items() if v is not None}


def parse_chat(raw: Any, where: str) -> ChatConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping with 'models' (and 'task')")
    known_keys(raw, ("models", "task", "kv_copies"), where)
    models = raw.get("models")
    if not isinstance(models, list) or not models:
        raise ConfigError(f"{where}.models must be a non-empty list of language models",
                          hint="e.g. [{name: smollm2, model: smollm2-135m}]")
    sources = tuple(_source(m, f"{where}.models[{i}]") for i, m in enumerate(models))
    task = raw.get("task")
    if task is not None and (not isinstance(task, str) or not task):
        raise ConfigError(f"{where}.task must be a name, e.g. chat")
    copies = raw.get("kv_copies", False)
    if not isinstance(copies, bool):
        raise ConfigError(f"{where}.kv_copies must be true or false, got {copies!r}")
    return ChatConfig(sources, task, copies)


def _source(raw: Any, where: str) -> LMSource:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) \
            or not isinstance(raw.get("model"), str):
        raise ConfigError(f"{where} needs a name and a model, e.g. "
                          "{name: smollm2, model: smollm2-135m}")
    known_keys(raw, ("name", "model", "runtime", "quantize", "verifier", "kv_cache_mib",
                     "max_sequences", "router", "quality", "kv_move", "kv_codec",
                     "draft_ahead", "split"), where)
    runtime = raw.get("runtime", "torch")
    if runtime not in RUNTIMES:
        raise ConfigError(f"{where}.runtime must be one of {', '.join(RUNTIMES)}, got "
                          f"{runtime!r}")
    if runtime == "llama.cpp":
        given = [k for k in ("quantize", "kv_cache_mib", "router", "split") if k in raw]
        if given:
            raise ConfigError(f"{where}: the llama.cpp runtime takes no {', '.join(given)}",
                              hint="a GGUF is served as it ships (its own quantization)")
    quantize = raw.get("quantize")
    if quantize not in (None, "int8"):
        raise ConfigError(f"{where}.quantize must be int8 (or left out)")
    mib = raw.get("kv_cache_mib")
    if mib is not None and (not isinstance(mib, int | float) or mib <= 0):
        raise ConfigError(f"{where}.kv_cache_mib must be a positive number of MiB")
    verifier = raw.get("verifier")
    if verifier is not None and (not isinstance(verifier, str) or verifier.count("/") != 1):
        raise ConfigError(f"{where}.verifier must be NODE/MODEL, e.g. cloud-1/smollm2")
    router = raw.get("router")
    if router is not None and (not isinstance(router, str) or verifier is None):
        raise ConfigError(f"{where}.router must be a file written by `tierlink cascade "
                          "chat-router`, on a model with a verifier (where hard prompts go)")
    quality = raw.get("quality")
    if quality is not None and (not isinstance(quality, int | float) or not 0 <= quality <= 1):
        raise ConfigError(f"{where}.quality must be a share between 0 and 1, e.g. 0.757")
    move, wire = raw.get("kv_move", "auto"), raw.get("kv_codec", "int8")
    if move not in MOVES:
        raise ConfigError(f"{where}.kv_move must be one of {', '.join(MOVES)}, got {move!r}")
    if wire not in CODECS:
        raise ConfigError(f"{where}.kv_codec must be one of {', '.join(CODECS)}, got {wire!r}")
    ahead = raw.get("draft_ahead", True)
    if not isinstance(ahead, bool):
        raise ConfigError(f"{where}.draft_ahead must be true or false, got {ahead!r}")
    sequences = raw.get("max_sequences", 16)
    if not isinstance(sequences, int) or isinstance(sequences, bool) or sequences < 1:
        raise ConfigError(f"{where}.max_sequences must be a whole number >= 1, got "
                          f"{sequences!r}")
    split, cut, split_codec = _split(raw.get("split"), f"{where}.split")
    return LMSource(name=raw["name"], path=raw["model"], runtime=runtime, quantize=quantize,
                    verifier=verifier, split=split, split_cut=cut, split_codec=split_codec,
                    router=router, quality=None if quality is None else float(quality),
                    kv_cache_bytes=int(mib * 2**20) if mib else None,
                    max_sequences=sequences, kv_move=move, kv_codec=wire,
                    draft_ahead=ahead)


SPLIT_CODECS = ("fp32", "fp16", "int8", "int8c")


def _split(raw: Any, where: str) -> tuple[str | None, int, str]:
    if raw is None:
        return None, 8, "fp16"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping, e.g. {{to: cloud-1/smollm2, cut: 8}}")
    known_keys(raw, ("to", "cut", "codec"), where)
    to, cut, codec = raw.get("to"), raw.get("cut", 8), raw.get("codec", "fp16")
    if not isinstance(to, str) or to.count("/") != 1:
        raise ConfigError(f"{where}.to must be NODE/MODEL, e.g. cloud-1/smollm2")
    if not isinstance(cut, int) or isinstance(cut, bool) or cut < 1:
        raise ConfigError(f"{where}.cut must be a whole number of layers >= 1, got {cut!r}")
    if codec not in SPLIT_CODECS:
        raise ConfigError(f"{where}.codec must be one of {', '.join(SPLIT_CODECS)}, got "
                          f"{codec!r}", hint="fp16 keeps the unsplit model's greedy output")
    return to, cut, codec


def check_verifiers(chats: Mapping[str, ChatConfig], tiers: Mapping[str, str],
                    links: Sequence[tuple[str, str]]) -> dict[str, ChatConfig]:
    """Each verifier (and split target) is an upstream of its node serving the model; fills
    its tier in."""
    out: dict[str, ChatConfig] = {}
    for node, chat in chats.items():
        fixed = []
        for src in chat.models:
            for role in ("verifier", "split"):
                named = getattr(src, role)
                if named is None:
                    continue
                target, model = named.split("/")
                served = {m.name for m in chats[target].models} if target in chats else set()
                if (node, target) not in links or model not in served:
                    raise ConfigError(
                        f"node {node}: {role} {named} must be a node it links to that "
                        f"serves {model!r} in its chat.models",
                        hint=f"add a link {node} -> {target} and {model} to {target}'s chat")
                src = replace(src, verifier_tier=tiers[target]) if role == "verifier" \
                    else replace(src, split_tier=tiers[target])
            fixed.append(src)
        out[node] = replace(chat, models=tuple(fixed))
    return out
