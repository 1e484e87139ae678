"""A draft model derived from its target, for speculative decoding on a device.

``int8_draft`` quantizes every matrix of the target (attention, MLP and the tied output
head) to INT8 per output channel and runs them with PyTorch's dynamic-quantization kernels
(activations quantized per call): a quarter of the bytes and about three times the decode
speed of the FP32 target on one core, with the same tokenizer — so its tokens are proposals
the target can check. ``fake_quantized`` makes a group-wise low-bit copy in FP32 (for
studying how agreement falls with bits; it is no faster).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from tierlink.llm.model import LlamaModel


class Int8Matrix:
    """A prepacked INT8 weight (per-channel scales) for ``torch.ops.quantized``."""

    def __init__(self, weight: torch.Tensor) -> None:
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
        zeros = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
        self.packed: Any = torch.ops.quantized.linear_prepack(q, None)
        self.shape = tuple(weight.shape)
        self.nbytes = weight.numel() + weight.shape[0] * 8

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed)  # type: ignore[no-any-return]


def int8_draft(target: LlamaModel) -> LlamaModel:
    """A draft sharing the target's embeddings and norms, its matrices in INT8."""
    draft = LlamaModel.__new__(LlamaModel)
    draft.config = target.config
    draft.exact = False
    draft.embed = target.embed
    draft.norm = target.norm
    draft.rope = target.rope.__class__(target.config.head_dim, target.config.rope_theta)
    draft.scale = target.scale
    draft.lm_head = Int8Matrix(target.lm_head)  # type: ignore[assignment]
    draft.layers = []
    for layer in target.layers:
        draft.layers.append(type(layer)(
            layer.attn_norm, Int8Matrix(layer.wqkv), Int8Matrix(layer.wo),  # type: ignore[arg-type]
            layer.mlp_norm, Int8Matrix(layer.wgu), Int8Matrix(layer.wdown)))  # type: ignore[arg-type]
    return draft


def fake_quantized(target: LlamaModel, bits: int, group: int = 32) -> LlamaModel:
    """An FP32 copy whose matrices went through ``bits``-bit group-wise rounding."""
    state: dict[str, torch.Tensor] = {"model.embed_tokens.weight": target.embed,
                                      "model.norm.weight": target.norm}
    for i, layer in enumerate(target.layers):
        p = f"model.layers.{i}."
        q, k, v = _split_qkv(target, layer.wqkv)
        inter = target.config.intermediate_size
        state.update({
            p + "input_layernorm.weight": layer.attn_norm,
            p + "post_attention_layernorm.weight": layer.mlp_norm,
            p + "self_attn.q_proj.weight": _round(q, bits, group),
            p + "self_attn.k_proj.weight": _round(k, bits, group),
            p + "self_attn.v_proj.weight": _round(v, bits, group),
            p + "self_attn.o_proj.weight": _round(layer.wo, bits, group),
            p + "mlp.gate_proj.weight": _round(layer.wgu[:inter], bits, group),
            p + "mlp.up_proj.weight": _round(layer.wgu[inter:], bits, group),
            p + "mlp.down_proj.weight": _round(layer.wdown, bits, group)})
    return LlamaModel(target.config, state, exact=False)


def _split_qkv(model: LlamaModel, wqkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
    cfg = model.config
    q = cfg.num_heads * cfg.head_dim
    kv = cfg.num_kv_heads * cfg.head_dim
    return wqkv[:q], wqkv[q:q + kv], wqkv[q + kv:]


def _round(w: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    levels = 2 ** bits - 1
    scale = (hi - lo).clamp_min(1e-12) / levels
    return (torch.round((g - lo) / scale) * scale + lo).reshape(rows, cols)
