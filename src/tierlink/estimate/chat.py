"""What answering a chat request one way or another would take (pure, no I/O).

Three ways, each priced from the language models' views (:class:`LanguageModelView`) and
the link between the nodes:

* **local**: this node's model answers. Time to first token = waiting for a free sequence
  slot + prefilling the prompt + one decoding step; tokens/s = one step over every sequence
  it then decodes at once.
* **remote**: an upstream's model answers, relayed here: the same on that node, plus one
  round trip before the first token (later tokens stream behind it).
* **speculative**: this node drafts k tokens, the verifier checks them in one pass of k+1
  rows: tokens/s = expected tokens per round / (k drafts + round trip + the pass), with the
  acceptance the drafts have had (``estimate/speculation.py``); the first token waits for
  the verifier's prefill of the prompt too.

* **split**: this node runs the first layers (a ``split_share`` of them) over the prompt and
  each new token, the upstream the rest: every token costs a round trip; the first token
  waits for both shares of the prefill.

Cost per 1,000 generated tokens: the answering node's price per decoding step of one
sequence; for speculation the verifier's passes, each of k+1 rows costing
``1 + batch_slowdown·k`` steps, spread over the ``expected_tokens`` a round yields (a CPU
verifier's pass is mostly the weights' memory traffic, so rows come cheap).
"""

from __future__ import annotations

from dataclasses import dataclass

from tierlink.core.types import LanguageModelView
from tierlink.estimate.speculation import best_k, expected_tokens

CHARS_PER_TOKEN = 4.0  # a prompt's length in tokens where no tokenizer is at hand
PROMPT_TOKEN_WEIGHT = 0.2  # a prompt token costs a fifth of a generated one


@dataclass(frozen=True, slots=True)
class ChatEstimate:
    ttft_ms: float
    tokens_per_s: float
    cost_per_1k: float  # USD per 1,000 generated tokens (the prompt's share included)
    quality: float | None


def step_ms(lm: LanguageModelView, rows: int) -> float:
    """One decoding step over ``rows`` sequences at once on that model's node."""
    single = 1000.0 / max(lm.decode_tok_s, 1e-6)
    return single * (1.0 + lm.batch_slowdown * max(rows - 1, 0))


def queue_wait_ms(lm: LanguageModelView, expected_tokens_left: float = 64.0) -> float:
    """Waiting for a sequence slot: the sequences ahead in the queue, each freeing a slot
    after about ``expected_tokens_left`` steps, shared among ``max_sequences`` slots."""
    if lm.running + lm.queued < lm.max_sequences:
        return 0.0
    ahead = lm.queued + 1
    steps = expected_tokens_left * ahead / max(lm.max_sequences, 1)
    return steps * step_ms(lm, lm.max_sequences)


def local(lm: LanguageModelView, prompt_tokens: int, max_tokens: int) -> ChatEstimate:
    rows = min(lm.running + 1, lm.max_sequences)
    prefill = 1000.0 * prompt_tokens / max(lm.prefill_tok_s, 1e-6)
    prefill *= 1.0 + lm.batch_slowdown * lm.running  # shares the engine's passes
    ttft = queue_wait_ms(lm) + prefill + step_ms(lm, rows)
    tps = 1000.0 / step_ms(lm, rows)
    return ChatEstimate(ttft, tps, _cost(lm.price_per_1k, prompt_tokens, max_tokens),
                        lm.quality)


def remote(lm: LanguageModelView, prompt_tokens: int, max_tokens: int,
           rtt_ms: float) -> ChatEstimate:
    there = local(lm, prompt_tokens, max_tokens)
    return ChatEstimate(there.ttft_ms + rtt_ms, there.tokens_per_s, there.cost_per_1k,
                        there.quality)


def speculative(draft: LanguageModelView, target: LanguageModelView, prompt_tokens: int,
                max_tokens: int, rtt_ms: float, k_max: int = 8) -> ChatEstimate:
    """``draft`` here, ``target`` on the verifier, ``rtt_ms`` between them."""
    draft_ms = step_ms(draft, min(draft.running + 1, draft.max_sequences))
    rows = min(target.running + 1, target.max_sequences)
    pass_ms = step_ms(target, rows)
    # A verification of k+1 rows costs about k+1 more rows of the verifier's pass.
    per_row_ms = step_ms(target, 1) * target.batch_slowdown
    k = best_k(draft.acceptance, draft_ms / 1e3, (rtt_ms + pass_ms) / 1e3, per_row_ms / 1e3,
               k_max)
    tokens = expected_tokens(draft.acceptance, k)
    round_ms = k * draft_ms + rtt_ms + pass_ms + k * per_row_ms
    prefill_here = 1000.0 * prompt_tokens / max(draft.prefill_tok_s, 1e-6)
    prefill_there = 1000.0 * prompt_tokens / max(target.prefill_tok_s, 1e-6)
    ttft = queue_wait_ms(draft) + queue_wait_ms(target) + prefill_here + prefill_there \
        + round_ms
    steps_per_token = (1.0 + target.batch_slowdown * k) / tokens
    generated = target.price_per_1k * steps_per_token
    cost = generated + target.price_per_1k * PROMPT_TOKEN_WEIGHT * prompt_tokens \
        / max(max_tokens, 1)
    return ChatEstimate(ttft, 1000.0 * tokens / round_ms, cost, target.quality)


def split(head: LanguageModelView, target: LanguageModelView, prompt_tokens: int,
          max_tokens: int, rtt_ms: float) -> ChatEstimate:
    """``head`` runs its ``split_share`` of the layers here, ``target`` the rest there."""
    share = head.split_share
    here = share * step_ms(head, min(head.running + 1, head.max_sequences))
    there = (1.0 - share) * step_ms(target, min(target.running + 1, target.max_sequences))
    prefill = 1000.0 * prompt_tokens * (share / max(head.prefill_tok_s, 1e-6)
                                        + (1.0 - share) / max(target.prefill_tok_s, 1e-6))
    ttft = queue_wait_ms(head) + queue_wait_ms(target) + prefill + here + rtt_ms + there
    cost = _cost(target.price_per_1k * (1.0 - share), prompt_tokens, max_tokens)
    return ChatEstimate(ttft, 1000.0 / (here + rtt_ms + there), cost, target.quality)


def _cost(price_per_1k: float, prompt_tokens: int, max_tokens: int) -> float:
    """Per 1,000 generated tokens, the prompt spread over the ``max_tokens`` it asks for."""
    return price_per_1k * (1.0 + PROMPT_TOKEN_WEIGHT * prompt_tokens / max(max_tokens, 1))
