"""Choosing tokens: greedy, temperature and nucleus (top-p) sampling, seeded; and the
speculative acceptance rule that keeps the target's distribution.

``distribution`` turns one row of logits into the distribution a sampler draws from (the
*same* function for a draft and for its verifier, so "the target's distribution" means what
the target alone would have sampled from). ``accept_drafts`` is the rule of Leviathan et al.
(2023) and Chen et al. (2023): draft token x_i, proposed with probability q(x_i), is kept
with probability min(1, p(x_i)/q(x_i)); the first rejected one is replaced by a draw from
the residual max(0, p − q) renormalised; if all k are kept, one more token is drawn from p.
Greedy decoding is the temperature-0 case: keep while the draft equals the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tierlink.llm.params import MAX_TOKENS_LIMIT, SamplingParams  # noqa: F401 (re-exported)


def generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else int(torch.seed()) & 0x7FFF_FFFF)
    return g


def distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities (vocab,) after temperature, top-k and top-p; greedy: one-hot argmax."""
    if params.greedy:
        out = torch.zeros_like(logits)
        out[int(torch.argmax(logits))] = 1.0
        return out
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    if params.top_k or params.top_p < 1.0:
        probs = _truncate(probs, params.top_k, params.top_p)
    return probs


def _truncate(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    sorted_p, order = torch.sort(probs, descending=True)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if top_k:
        keep[top_k:] = False
    if top_p < 1.0:
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        keep &= before < top_p  # the smallest prefix whose mass reaches top_p
    kept = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    out = torch.zeros_like(probs)
    out[order] = kept
    return out / out.sum()


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> int:
    if params.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(distribution(logits, params), 1, generator=gen))


@dataclass(frozen=True, slots=True)
class Proposal:
    """One drafted token and the draft's distribution it was drawn from, sparse: ``support``
    token ids with ``probs`` (empty for greedy drafts, whose proposal is the token itself)."""

    token: int
    support: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()

    def dense(self, vocab: int) -> torch.Tensor:
        q = torch.zeros(vocab, dtype=torch.float64)
        if self.support:
            q[list(self.support)] = torch.tensor(self.probs, dtype=torch.float64)
        else:
            q[self.token] = 1.0
        return q


def propose(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> Proposal:
    """Draw a draft token; sampled drafts carry their (top-k limited) distribution."""
    if params.greedy:
        return Proposal(int(torch.argmax(logits)))
    q = distribution(logits, params)
    token = int(torch.multinomial(q, 1, generator=gen))
    support = torch.nonzero(q).flatten()
    return Proposal(token, tuple(support.tolist()), tuple(q[support].tolist()))


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: int  # how many draft tokens were kept
    tokens: tuple[int, ...]  # the kept drafts plus the verifier's own next token


def accept_drafts(target_logits: torch.Tensor, drafts: list[Proposal],
                  params: SamplingParams, gen: torch.Generator) -> Verdict:
    """``target_logits``: k+1 rows, row i the target's logits after draft i-1 (row 0: after
    the context alone). Returns the accepted prefix and one token of the target's own."""
    kept: list[int] = []
    vocab = target_logits.shape[-1]
    for i, proposal in enumerate(drafts):
        p = distribution(target_logits[i], params)
        if params.greedy:
            best = int(torch.argmax(p))
            if proposal.token != best:
                return Verdict(len(kept), (*kept, best))
            kept.append(best)
            continue
        q = proposal.dense(vocab)
        x = proposal.token
        ratio = float(p[x] / q[x]) if q[x] > 0 else 0.0
        if float(torch.rand(1, generator=gen, dtype=torch.float64)) < min(1.0, ratio):
            kept.append(x)
            continue
        residual = torch.clamp(p - q, min=0.0)
        total = float(residual.sum())
        nxt = int(torch.multinomial(residual / total if total > 0 else p, 1, generator=gen))
        return Verdict(len(kept), (*kept, nxt))
    bonus = sample(target_logits[len(drafts)], params, gen)
    return Verdict(len(kept), (*kept, bonus))
