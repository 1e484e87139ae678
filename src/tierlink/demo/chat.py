"""The demo's chat phase: a mixed set of prompts from the devices, at three privacy levels,
answered three ways on a real chat fleet (``demo/fleets/chat-fleet.yaml``).

Everyday questions and labelled ones (a movie review: positive or negative?, from Rotten
Tomatoes snippets no model or router of the fleet was measured or trained on), a third each
``local``, ``site`` and ``any``; each device sends its share in order, the devices at once;
greedy answers of up to 32 tokens (8 for a labelled prompt: one word is asked for, a
sentence often comes).

* ``cloud_only``: every prompt to the cloud's model (relayed by the device, ``mode: remote``)
  as a team without tierlink would send it — prompts that were not allowed to leave the device
  count as privacy violations. Its answers are the reference: what the large model says.
* ``tierlink``: the device's node decides (a ``local`` or ``site`` prompt is answered by the
  device's own model, an ``any`` prompt is drafted on the device and verified by the cloud);
* ``device_only``: every prompt answered by the device's own model.

Quality is measured twice: on the everyday questions, "the same answer as the large model"
(exact text: speculative decoding must score 100% on what it serves); on the labelled
prompts, the share answered right (the first label word in the answer is the label).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from tierlink.client.chat_stream import ChatStream
from tierlink.fleet.launcher import RunningFleet
from tierlink.llm.prompts import QUESTIONS

PRIVACY_MIX = ("local", "site", "any")
RUNS = ("cloud_only", "tierlink", "device_only")  # the reference first
LABELS = ("negative", "positive")  # a labelled prompt's answer words, by label
# Labelled prompts from here on in the seeded order: benchmarks/llm_route.py measures the
# models' quality and trains the routers on the first 1,200
LABELLED_FROM = 2000
LABELLED_TOKENS = 8  # enough for "The movie review is positive"


@dataclass(frozen=True, slots=True)
class ChatItem:
    device: str
    text: str
    privacy: str
    label: int | None = None  # a labelled prompt's right answer (an index of LABELS)


def chat_items(devices: list[str], per_device: int) -> list[ChatItem]:
    return [ChatItem(device, QUESTIONS[(d * per_device + i) % len(QUESTIONS)],
                     PRIVACY_MIX[i % 3])
            for d, device in enumerate(devices) for i in range(per_device)]


def labelled_items(devices: list[str], per_device: int, seed: int = 0) -> list[ChatItem]:
    """Movie reviews to be called positive or negative, a third at each privacy level."""
    from tierlink.llm.labelled import SENTIMENT_QUESTION, rotten_tomatoes

    reviews = rotten_tomatoes(seed)[LABELLED_FROM:LABELLED_FROM + len(devices) * per_device]
    return [ChatItem(device, SENTIMENT_QUESTION.format(text=r.text), PRIVACY_MIX[i % 3],
                     r.label)
            for d, device in enumerate(devices)
            for i, r in enumerate(reviews[d * per_device:(d + 1) * per_device])]


def right(item_label: int | None, text: str) -> bool:
    """Whether the first label word in a labelled prompt's answer is its label's ("The
    review is positive, but..." answers positive)."""
    found = re.search(r"\b(" + "|".join(LABELS) + r")\b", text.lower())
    return item_label is not None and found is not None and \
        found.group(1) == LABELS[item_label]


def _body(item: ChatItem, run: str, max_tokens: int) -> dict[str, Any]:
    tl: dict[str, Any] = {"privacy": item.privacy, "deadline_ms": 60_000}
    if run == "cloud_only":
        tl = {"privacy": "any", "mode": "remote", "deadline_ms": 60_000}
    elif run == "device_only":
        tl["mode"] = "local"
    if item.label is not None:
        max_tokens = min(max_tokens, LABELLED_TOKENS)
    return {"model": "chat", "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "tierlink": tl,
            "messages": [{"role": "user", "content": item.text}]}


async def _ask(http: httpx.AsyncClient, url: str, item: ChatItem, run: str,
               max_tokens: int) -> dict[str, Any]:
    stream = ChatStream()
    error: str | None = None
    try:
        async with http.stream("POST", url + "/v1/chat/completions",
                               json=_body(item, run, max_tokens)) as r:
            if r.status_code != 200:
                error = f"{r.status_code}"
            else:
                async for line in r.aiter_lines():
                    stream.feed(line)
    except httpx.HTTPError as exc:
        error = type(exc).__name__
    meta = stream.tierlink
    ended = time.perf_counter() - stream.started
    return {"device": item.device, "prompt": item.text, "privacy": item.privacy,
            "label": item.label, "text": stream.text, "answered": error is None,
            "error": error, "ttft_ms": 1e3 * (stream.ttft_s or ended),
            "latency_ms": 1e3 * ended,
            "tier": meta.get("tier"), "mode": meta.get("mode"),
            "cost_usd": float(meta.get("cost_usd") or 0.0),
            "left_device": run == "cloud_only" or meta.get("mode") in ("speculative", "remote"),
            "drafted": meta.get("drafted", 0), "accepted": meta.get("accepted", 0)}


def run_chat(fleet: RunningFleet, items: list[ChatItem], run: str, max_tokens: int = 32,
             progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    by_device: dict[str, list[ChatItem]] = {}
    for item in items:
        by_device.setdefault(item.device, []).append(item)
    done: list[dict[str, Any]] = []

    async def device(http: httpx.AsyncClient, name: str, mine: list[ChatItem]) -> None:
        for item in mine:
            done.append(await _ask(http, fleet.node_urls[name], item, run, max_tokens))
            if progress is not None:
                progress(len(done))

    async def all_devices() -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            await asyncio.gather(*[device(http, n, m) for n, m in by_device.items()])
    asyncio.run(all_devices())
    return done


def summarize(records: list[dict[str, Any]],
              reference: dict[tuple[str, str], str]) -> dict[str, Any]:
    """``reference``: (device, prompt) -> the large model's answer (the cloud-only run).
    "Same as large" is over the everyday questions, "labelled right" over the labelled
    prompts; the rest over both."""
    def group(rs: list[dict[str, Any]]) -> dict[str, Any]:
        answered = [r for r in rs if r["answered"]]
        everyday = [r for r in rs if r.get("label") is None]
        labelled = [r for r in rs if r.get("label") is not None]
        same = [r["text"] == reference.get((r["device"], r["prompt"]))
                for r in everyday if r["answered"]]
        ttfts = sorted(r["ttft_ms"] for r in answered) or [0.0]
        drafted = sum(r["drafted"] for r in rs)
        return {
            "requests": len(rs), "answered": len(answered),
            "same_as_large": round(sum(same) / max(len(everyday), 1), 3),
            "labelled": len(labelled),
            "labelled_right": round(sum(r["answered"] and right(r["label"], r["text"])
                                        for r in labelled) / len(labelled), 3)
            if labelled else None,
            "ttft_p50_ms": round(statistics.median(ttfts), 1),
            "ttft_p95_ms": round(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], 1),
            "cost_per_1k": round(1000 * sum(r["cost_usd"] for r in rs) / max(len(rs), 1), 6),
            "left_device": sum(r["left_device"] for r in rs) / max(len(rs), 1),
            "acceptance": round(sum(r["accepted"] for r in rs) / drafted, 3) if drafted else None,
            "privacy_violations": sum(r["left_device"] and r["privacy"] != "any"
                                      for r in rs)}
    out = group(records)
    out["by_privacy"] = {p: group([r for r in records if r["privacy"] == p])
                         for p in PRIVACY_MIX}
    return out
