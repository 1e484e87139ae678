"""Cards written before there was one card, read as today's (:data:`SCHEMA`).

Four shapes came before it: the zoo's card (one ``input`` and ``output``), an import's
card (``imported``, lists of inputs, a ``metric`` object, ``data``), a multi-exit net's
card (``segments`` and ``exits`` at the top) and a language model's (kind ``causal_lm``).
:func:`upgrade` turns each into the current JSON form, key for key, so one parser reads
them all; a card of a newer schema than this tierlink knows is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tierlink.errors import ModelError

SCHEMA = 2
_EXIT_KEYS = ("base_variant", "loss_weights", "segments", "exits", "boundaries", "whole",
              "operating_point")
_LANGUAGE_KEYS = ("architecture", "context_length", "layers", "hidden_size",
                  "kv_bytes_per_token", "prefill_tokens_per_s", "decode_tokens_per_s",
                  "tokenizer", "source", "measured", "measured_for")


def upgrade(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``data`` in the current schema (a copy; ``data`` itself is left as it is)."""
    schema = data.get("schema", 1)
    if not isinstance(schema, int) or schema > SCHEMA:
        raise ModelError(f"{source} has schema {schema!r}; this tierlink reads up to "
                         f"{SCHEMA}", hint="upgrade tierlink to read it")
    if schema == SCHEMA:
        return dict(data)
    if "segments" in data and "exits" in data:
        return _exit_card(data)
    if data.get("kind") == "causal_lm":
        return _language_card(data)
    # A version was not always written: the layout reads such a card as version 1.
    with_version = {"version": "1", **data}
    if data.get("imported") or "data" in data or isinstance(data.get("input"), list):
        return _imported_card(with_version)
    return _zoo_card(with_version)


def _zoo_card(d: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in d.items() if k not in ("input", "output")}
    out.setdefault("format", "onnx")
    out.setdefault("file", "model.onnx")
    if "input" in d:
        out["inputs"] = [d["input"]]
    if "output" in d:
        out["outputs"] = [d["output"]]
    return out


def _imported_card(d: Mapping[str, Any]) -> dict[str, Any]:
    drop = ("input", "output", "imported", "kind", "metric", "cascadable", "import_s",
            "latency_ms_by_provider", "calibration")
    out = {k: v for k, v in d.items() if k not in drop}
    out.setdefault("format", "onnx")
    out.setdefault("file", "model.onnx")
    out["inputs"], out["outputs"] = list(d.get("input", [])), list(d.get("output", []))
    metric = d.get("metric") or {}
    out["metric"] = metric.get("name", "accuracy")
    out["latency_by_provider"] = d.get("latency_ms_by_provider", {})
    calibration = d.get("calibration") or {}
    samples = (d.get("data") or {}).get("calib_samples", 0)
    out["calibration"] = {
        "temperature": d.get("temperature", 1.0), "samples": samples,
        "nll_before": calibration.get("nll_before"), "nll_after": calibration.get("nll_after"),
        "ece_before": calibration.get("ece_before"), "ece_after": calibration.get("ece_after"),
        "test_ece_before": calibration.get("eval_ece_before"),
        "test_ece_after": calibration.get("eval_ece_after")}
    return out


def _exit_card(d: Mapping[str, Any]) -> dict[str, Any]:
    """What the card adds to the net's section (signature, accuracy, curve) is derived
    from it on reading (:func:`tierlink.models.card.with_exit_header`)."""
    return {"name": d["name"], "task": d["task"], "version": d["version"],
            "format": "multi-exit", "file": d["whole"]["file"], "params": d["params"],
            "labels": d["labels"], "training": d["training"],
            "multi_exit": {k: d[k] for k in _EXIT_KEYS}}


def _language_card(d: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": d["name"], "task": d.get("task", "chat"), "version": d.get("version", "1"),
        "format": "llm", "file": "model.safetensors", "params": d.get("parameters", 0),
        "size_bytes": d.get("bytes", 0), "precision": d.get("precision", "fp32"),
        "language": {k: d.get(k) for k in _LANGUAGE_KEYS if k in d}}
