"""Prometheus series of a node's language models, on every tier alike.

Names follow vLLM's where it has one (``time_to_first_token_seconds``,
``time_per_output_token_seconds``, ``prompt_tokens_total``, ``generation_tokens_total``,
``num_requests_running`` / ``waiting``, speculative ``draft`` / ``accepted`` tokens) under the
``tierlink_llm_`` prefix, with ``tier`` and ``model`` labels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class LLMMetrics:
    def __init__(self, tier: str, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.tier = tier
        r = registry
        labels = ["tier", "model"]
        self.ttft = Histogram("tierlink_llm_time_to_first_token_seconds",
                              "Time from receipt to the first generated token", labels,
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("tierlink_llm_time_per_output_token_seconds",
                              "Time per generated token after the first", labels,
                              buckets=TPOT_BUCKETS, registry=r)
        self.prompt_tokens = Counter("tierlink_llm_prompt_tokens_total",
                                     "Prompt tokens received", labels, registry=r)
        self.cached_tokens = Counter("tierlink_llm_prompt_cached_tokens_total",
                                     "Prompt tokens found in a session's KV cache", labels,
                                     registry=r)
        self.generation_tokens = Counter("tierlink_llm_generation_tokens_total",
                                         "Tokens generated", labels, registry=r)
        self.requests = Counter("tierlink_llm_requests_total",
                                "Chat and completion requests by outcome",
                                ["tier", "model", "outcome"], registry=r)
        self.draft_tokens = Counter("tierlink_llm_spec_decode_draft_tokens_total",
                                    "Draft tokens judged (speculative decoding)",
                                    ["tier", "model", "role"], registry=r)
        self.accepted_tokens = Counter("tierlink_llm_spec_decode_accepted_tokens_total",
                                       "Draft tokens accepted (speculative decoding)",
                                       ["tier", "model", "role"], registry=r)
        self.passes = Counter("tierlink_llm_forward_passes_total",
                              "Forward passes of the model (one per engine step)", labels,
                              registry=r)
        self.kv_moves = Counter("tierlink_llm_kv_moves_total",
                                "Conversations' KV caches shipped to (out) or received from "
                                "(in) another node; kept: a turn relayed without its cache",
                                ["tier", "model", "direction", "outcome"], registry=r)
        self.kv_move_bytes = Counter("tierlink_llm_kv_move_bytes_total",
                                     "Bytes of KV packages shipped or received",
                                     ["tier", "model", "direction"], registry=r)
        self.running = Gauge("tierlink_llm_num_requests_running",
                             "Sequences in the running batch", labels, registry=r)
        self.waiting = Gauge("tierlink_llm_num_requests_waiting",
                             "Sequences waiting to join the batch", labels, registry=r)
        self.kv_bytes = Gauge("tierlink_llm_kv_cache_bytes",
                              "KV cache bytes reserved by sequences and sessions", labels,
                              registry=r)

    def watch(self, model: str, running: Callable[[], float], waiting: Callable[[], float],
              kv_bytes: Callable[[], float]) -> None:
        """Gauges read at scrape time from the engine."""
        self.running.labels(self.tier, model).set_function(running)
        self.waiting.labels(self.tier, model).set_function(waiting)
        self.kv_bytes.labels(self.tier, model).set_function(kv_bytes)
