"""An inventory file: what a team runs (its use cases) and what it can run it on (a hardware
catalogue), for ``tierlink plan``.

::

    hours_per_month: 730
    energy_usd_per_kwh: 0.15
    transfer_usd_per_gb: 0.05          # into the cloud (the site's LAN is free)
    headroom: 0.3                      # planned on P95 x (1 + headroom), never on the peak
    sla_target: 0.99                   # the share answered within its latency target
    rtt_ms: {device: 0, edge: 10, cloud: 80}   # from where requests arise
    hardware:
      - {name: phone-npu, tier: device, power_w: 4, throughput: {fmnist-small: 400}}
      - {name: edge-box, tier: edge, price_usd: 2000, lifetime_months: 36, power_w: 60,
         throughput: {fmnist-medium: 3000, smollm2: {tokens_per_s: 400}}}
      - {name: a100, tier: cloud, price_per_hour: 2.0, power_w: 400, flops: 312e12,
         throughput: {fmnist-large: 20000, smollm2: {tokens_per_s: 8000}}}
    use_cases:
      - {name: inspection, model: fmnist-small, peak_rps: 400, p95_rps: 250,
         input_bytes: 3136, latency_ms: 30, privacy: site, devices: 200}
      - {name: assistant, model: smollm2, output_tokens: 200, peak_rps: 20, p95_rps: 12,
         latency_ms: 3000, privacy: any}
      - {name: retrain, training: {params: 2.1e6, tokens: 6e9, days: 1, mfu: 0.4}}

A throughput is requests per second per instance (a number) or ``{tokens_per_s: N}`` for a
generative model (a request costs its ``output_tokens``). Unknown keys are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tierlink.core.types import Privacy, Tier
from tierlink.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Throughput:
    per_s: float
    tokens: bool = False  # per_s counts tokens, not requests


@dataclass(frozen=True, slots=True)
class Hardware:
    name: str
    tier: Tier
    throughput: Mapping[str, Throughput]
    price_per_hour: float = 0.0  # rented (the cloud)
    price_usd: float = 0.0  # bought (an edge box), spread over its lifetime
    lifetime_months: float = 36.0
    power_w: float = 0.0
    flops: float = 0.0  # peak for training (6·N·D)


@dataclass(frozen=True, slots=True)
class Training:
    params: float
    tokens: float
    days: float = 1.0
    mfu: float = 0.4  # the share of peak FLOPs a training run really reaches


@dataclass(frozen=True, slots=True)
class UseCase:
    name: str
    model: str = ""
    peak_rps: float = 0.0
    p95_rps: float = 0.0
    input_bytes: int = 0
    output_tokens: int = 0
    latency_ms: float = 1000.0
    privacy: Privacy = Privacy.ANY
    devices: int = 0  # devices the requests come from (0: none can answer them)
    training: Training | None = None


@dataclass(frozen=True, slots=True)
class Inventory:
    use_cases: tuple[UseCase, ...]
    hardware: tuple[Hardware, ...]
    headroom: float = 0.3
    sla_target: float = 0.99  # the share of requests answered within their latency target
    hours_per_month: float = 730.0
    energy_usd_per_kwh: float = 0.15
    transfer_usd_per_gb: float = 0.05
    rtt_ms: Mapping[Tier, float] = field(default_factory=lambda: {
        Tier.DEVICE: 0.0, Tier.EDGE: 10.0, Tier.CLOUD: 80.0})


def load_inventory(path: Path) -> Inventory:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the inventory {path}: {exc}") from None
    return parse_inventory(raw, str(path))


TOP = ("use_cases", "hardware", "headroom", "sla_target", "hours_per_month",
       "energy_usd_per_kwh", "transfer_usd_per_gb", "rtt_ms")


def parse_inventory(raw: Any, where: str = "inventory") -> Inventory:
    m = _mapping(raw, where, TOP)
    try:
        hardware = tuple(_hardware(h, f"{where}.hardware[{i}]")
                         for i, h in enumerate(m.get("hardware") or ()))
        cases = tuple(_use_case(u, f"{where}.use_cases[{i}]")
                      for i, u in enumerate(m.get("use_cases") or ()))
        rtt = {Tier.parse(k): float(v) for k, v in (m.get("rtt_ms") or {}).items()}
        inv = Inventory(cases, hardware, float(m.get("headroom", 0.3)),
                        float(m.get("sla_target", 0.99)),
                        float(m.get("hours_per_month", 730.0)),
                        float(m.get("energy_usd_per_kwh", 0.15)),
                        float(m.get("transfer_usd_per_gb", 0.05)),
                        {**Inventory((), ()).rtt_ms, **rtt})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not cases:
        raise ConfigError(f"{where} lists no use case", hint="use_cases: [{name: ..., ...}]")
    if not hardware:
        raise ConfigError(f"{where} lists no hardware", hint="hardware: [{name: ..., ...}]")
    if len({u.name for u in cases}) != len(cases):
        raise ConfigError(f"{where}: use case names must be unique")
    return inv


def _mapping(raw: Any, where: str, known: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping")
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}", hint=f"known: {', '.join(known)}")
    return raw


def _hardware(raw: Any, where: str) -> Hardware:
    m = _mapping(raw, where, ("name", "tier", "throughput", "price_per_hour", "price_usd",
                              "lifetime_months", "power_w", "flops"))
    throughput = {}
    for model, t in (m.get("throughput") or {}).items():
        if isinstance(t, Mapping):
            throughput[str(model)] = Throughput(float(_mapping(t, f"{where}.throughput.{model}",
                                                               ("tokens_per_s",))
                                                      ["tokens_per_s"]), tokens=True)
        else:
            throughput[str(model)] = Throughput(float(t))
    return Hardware(str(m["name"]), Tier.parse(str(m["tier"])), throughput,
                    float(m.get("price_per_hour", 0.0)), float(m.get("price_usd", 0.0)),
                    float(m.get("lifetime_months", 36.0)), float(m.get("power_w", 0.0)),
                    float(m.get("flops", 0.0)))


def _use_case(raw: Any, where: str) -> UseCase:
    m = _mapping(raw, where, ("name", "model", "peak_rps", "p95_rps", "input_bytes",
                              "output_tokens", "latency_ms", "privacy", "devices", "training"))
    training = None
    if m.get("training") is not None:
        t = _mapping(m["training"], f"{where}.training", ("params", "tokens", "days", "mfu"))
        training = Training(float(t["params"]), float(t["tokens"]), float(t.get("days", 1.0)),
                            float(t.get("mfu", 0.4)))
    peak = float(m.get("peak_rps", 0.0))
    p95 = float(m.get("p95_rps", peak))
    if p95 > peak or p95 < 0:
        raise ConfigError(f"{where}: p95_rps must be between 0 and peak_rps")
    if not training and (not m.get("model") or peak <= 0):
        raise ConfigError(f"{where}: an inference use case needs a model and peak_rps > 0")
    return UseCase(str(m["name"]), str(m.get("model", "")), peak, p95,
                   int(m.get("input_bytes", 0)), int(m.get("output_tokens", 0)),
                   float(m.get("latency_ms", 1000.0)),
                   Privacy.parse(str(m.get("privacy", "any"))), int(m.get("devices", 0)),
                   training)
