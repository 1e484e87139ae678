"""A Llama-family decoder over many sequences at once, each with its own KV cache.

One ``forward`` takes a *ragged* batch: every sequence contributes its own rows (a prompt
block, one decode token, or k draft tokens to verify). The linear layers run on all rows
stacked; attention runs per sequence against its own cache. Rows are padded to at least
four: on this CPU's BLAS a row's product then does not depend on how many other rows share
the call (a single row takes a different kernel), and decode and verify rows attend to
exactly the positions before them — so a token's logits are bit-identical whether it was
decoded alone, batched with other devices' sequences, or verified among draft tokens. That is
what lets speculative decoding promise the target's own greedy output, token for token.
``exact=False`` drops both (fast single-row kernels) for drafts, whose output is a proposal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tierlink.llm.kvcache import KVCache
from tierlink.llm.weights import LlamaConfig, load_state, read_config

ROW_TILE = 4


@dataclass(slots=True)
class Step:
    """One sequence's rows in a forward: ``block`` rows (a prompt) attend causally in one
    kernel; other rows (decode, verify) each attend to exactly their prefix."""

    cache: KVCache
    tokens: list[int]
    all_logits: bool = False  # logits for every row (verify) or only the last (decode)
    block: bool = False


@dataclass(slots=True)
class _Layer:
    attn_norm: torch.Tensor
    wqkv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    wgu: torch.Tensor
    wdown: torch.Tensor


class Rope:
    """Rotary position tables, grown on demand; ``rotate`` applies them to (…, n, head_dim)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64)
                                         / head_dim))
        self.cos = torch.empty(0, head_dim)
        self.sin = torch.empty(0, head_dim)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top = int(positions.max()) + 1 if positions.numel() else 0
        if top > self.cos.shape[0]:
            n = max(top, 2 * self.cos.shape[0], 256)
            ang = torch.outer(torch.arange(n, dtype=torch.float64), self.inv_freq)
            ang = torch.cat([ang, ang], dim=-1)
            self.cos, self.sin = ang.cos().float(), ang.sin().float()
        return self.cos[positions], self.sin[positions]

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.tables(positions)
        return x * cos + _rotate_half(x) * sin

    def shift(self, x: torch.Tensor, by: int) -> torch.Tensor:
        """Keys rotated at p -> rotated at p + by (``by`` may be negative)."""
        ang = float(by) * self.inv_freq
        ang = torch.cat([ang, ang])
        return x * ang.cos().float() + _rotate_half(x) * ang.sin().float()


def _numel(t: object) -> int:
    shape = getattr(t, "shape", ())
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class LlamaModel:
    def __init__(self, config: LlamaConfig, state: dict[str, torch.Tensor],
                 exact: bool = True) -> None:
        self.config = config
        self.exact = exact
        self.embed = state["model.embed_tokens.weight"]
        self.lm_head = state.get("lm_head.weight", self.embed)
        self.norm = state["model.norm.weight"]
        self.layers = [self._layer(state, i) for i in range(config.num_layers)]
        self.rope = Rope(config.head_dim, config.rope_theta)
        self.scale = config.head_dim ** -0.5

    @classmethod
    def load(cls, directory: Path, exact: bool = True) -> LlamaModel:
        return cls(read_config(directory), load_state(directory), exact=exact)

    @staticmethod
    def _layer(state: dict[str, torch.Tensor], i: int) -> _Layer:
        p = f"model.layers.{i}."
        qkv = [state[p + f"self_attn.{n}_proj.weight"] for n in ("q", "k", "v")]
        gu = [state[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up")]
        return _Layer(state[p + "input_layernorm.weight"], torch.cat(qkv).contiguous(),
                      state[p + "self_attn.o_proj.weight"],
                      state[p + "post_attention_layernorm.weight"], torch.cat(gu).contiguous(),
                      state[p + "mlp.down_proj.weight"])

    def parameters(self) -> int:
        """Distinct parameters (a tied output head counts once)."""
        n = self.embed.numel() + self.norm.numel()
        if isinstance(self.lm_head, torch.Tensor) and self.lm_head is not self.embed:
            n += self.lm_head.numel()  # (a draft's INT8 head is the tied embedding's copy)
        for layer in self.layers:
            n += sum(_numel(t) for t in (layer.attn_norm, layer.wqkv, layer.wo,
                                         layer.mlp_norm, layer.wgu, layer.wdown))
        return n

    def weights(self) -> list[torch.Tensor]:
        """The matrices a low-bit copy quantizes (embeddings and norms stay)."""
        return [t for layer in self.layers for t in (layer.wqkv, layer.wo, layer.wgu,
                                                     layer.wdown)]

    # -- the forward pass ---------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, steps: list[Step]) -> list[torch.Tensor]:
        """Run every step's rows; returns per step its logits (rows × vocab)."""
        return self._logits(self._hidden(steps), steps)

    @torch.inference_mode()
    def features(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """One step's last-row logits and its final normalised hidden state (what a router
        reads of a prompt the device has prefilled anyway)."""
        x = self._hidden([step])
        h = self._rms(x[-1:], self.norm)
        return self._linear(h, self.lm_head)[0], h[0]

    @torch.inference_mode()
    def head(self, step: Step, cut: int) -> torch.Tensor:
        """A decoder split at layer ``cut`` (``llm/layer_split.py``), the device's side: the
        embedding and layers ``0..cut-1`` of ``step``'s rows; their hidden states (rows ×
        hidden), what crosses the link. ``step.cache`` holds those layers' keys and values."""
        return self._hidden([step], range(self._cut(cut)))

    @torch.inference_mode()
    def tail(self, step: Step, hidden: torch.Tensor, cut: int) -> torch.Tensor:
        """The upstream's side: layers from ``cut`` on over the rows' hidden states, then the
        logits (as :meth:`forward`). ``step.tokens`` only counts the rows: the tail never sees
        a token id; ``step.cache`` holds its own layers' keys and values."""
        if hidden.shape[0] != len(step.tokens):
            raise ValueError(f"{hidden.shape[0]} hidden rows for {len(step.tokens)} positions")
        x = self._hidden([step], range(self._cut(cut), self.config.num_layers), hidden)
        return self._logits(x, [step])[0]

    def _cut(self, cut: int) -> int:
        if not 0 < cut < self.config.num_layers:
            raise ValueError(f"a split runs 1..{self.config.num_layers - 1} layers on the "
                             f"device, not {cut}")
        return cut

    def _hidden(self, steps: list[Step], layers: range | None = None,
                x: torch.Tensor | None = None) -> torch.Tensor:
        """Every step's rows through ``layers`` (all of them by default), from their
        embeddings or from ``x`` (hidden states a split's head computed elsewhere)."""
        cfg = self.config
        for step in steps:
            step.cache.make_room(len(step.tokens), self.rope.shift)
        starts = [s.cache.length for s in steps]
        positions = torch.cat([torch.arange(st, st + len(s.tokens))
                               for st, s in zip(starts, steps, strict=True)])
        if x is None:
            x = self.embed[torch.tensor([t for s in steps for t in s.tokens], dtype=torch.long)]
        q_size = cfg.num_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        for li in layers if layers is not None else range(cfg.num_layers):
            layer = self.layers[li]
            h = self._rms(x, layer.attn_norm)
            qkv = self._linear(h, layer.wqkv)
            q = qkv[:, :q_size].view(-1, cfg.num_heads, cfg.head_dim).transpose(0, 1)
            k = qkv[:, q_size:q_size + kv_size].view(-1, cfg.num_kv_heads, cfg.head_dim)
            v = qkv[:, q_size + kv_size:].view(-1, cfg.num_kv_heads, cfg.head_dim)
            q = self.rope.rotate(q, positions)
            k = self.rope.rotate(k.transpose(0, 1), positions)
            attn = self._attention(li, steps, starts, q, k, v.transpose(0, 1))
            x = x + self._linear(attn, layer.wo)
            h = self._rms(x, layer.mlp_norm)
            gu = self._linear(h, layer.wgu)
            inter = cfg.intermediate_size
            x = x + self._linear(F.silu(gu[:, :inter]) * gu[:, inter:], layer.wdown)
        for step in steps:
            step.cache.advance(len(step.tokens))
        return x

    def _attention(self, li: int, steps: list[Step], starts: list[int], q: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (heads, rows, d); k, v (kv_heads, rows, d) -> (rows, heads·d)."""
        cfg = self.config
        out = torch.empty(q.shape[1], cfg.num_heads * cfg.head_dim)
        row = 0
        for step, start in zip(steps, starts, strict=True):
            n = len(step.tokens)
            step.cache.write(li, start, k[:, row:row + n], v[:, row:row + n])
            keys = step.cache.k[li][:, :start + n]
            values = step.cache.v[li][:, :start + n]
            qs = q[:, row:row + n]
            if step.block or not self.exact:
                o = self._block_attention(qs, keys, values, start)
            else:
                o = self._row_attention(qs, keys, values, start)
            out[row:row + n] = o.transpose(0, 1).reshape(n, -1)
            row += n
        return out

    def _block_attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                         start: int) -> torch.Tensor:
        n, total = q.shape[1], keys.shape[1]
        mask = torch.ones(n, total, dtype=torch.bool).tril(diagonal=start)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                              enable_gqa=True)

    def _row_attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       start: int) -> torch.Tensor:
        """Each row against exactly its prefix, grouped query heads as one (kv, g, d) batch."""
        cfg = self.config
        group = cfg.num_heads // cfg.num_kv_heads
        n = q.shape[1]
        out = torch.empty_like(q)
        for i in range(n):
            length = start + i + 1
            qi = q[:, i].reshape(cfg.num_kv_heads, group, cfg.head_dim)
            scores = torch.matmul(qi, keys[:, :length].transpose(1, 2)) * self.scale
            o = torch.matmul(torch.softmax(scores, dim=-1), values[:, :length])
            out[:, i] = o.reshape(cfg.num_heads, cfg.head_dim)
        return out

    def _logits(self, x: torch.Tensor, steps: list[Step]) -> list[torch.Tensor]:
        rows: list[int] = []
        spans: list[tuple[int, int]] = []
        at = 0
        for step in steps:
            n = len(step.tokens)
            take = range(at, at + n) if step.all_logits else range(at + n - 1, at + n)
            spans.append((len(rows), len(rows) + len(take)))
            rows.extend(take)
            at += n
        h = self._rms(x[rows], self.norm)
        logits = self._linear(h, self.lm_head)
        return [logits[a:b] for a, b in spans]

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.config.rms_norm_eps) * weight

    def _linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if not isinstance(w, torch.Tensor):  # a draft's INT8 matrix (llm/draft.py)
            return w(x)  # type: ignore[no-any-return]
        n = x.shape[0]
        if not self.exact or n >= ROW_TILE:
            return F.linear(x, w)
        padded = torch.cat([x, x.new_zeros(ROW_TILE - n, x.shape[1])])
        return F.linear(padded, w)[:n]
