"""``tierlink demo``: a real fleet, a real workload, and the baselines, in one run.

Starts the example fleet (control plane, 1 cloud, 2 edges, 4 devices, emulated links,
throttled device CPUs), drives the same Fashion-MNIST workload three times — routed by
tierlink, then all to the cloud, then all on the device — and reports each run side by side.
Privacy is counted from the nodes' own counters, not from the plans: the inputs a node received
that it may not hold (``tierlink_inputs_received_total{verdict="violation"}``: none, as no
tierlink node sends one) and the plans a node's router refused for moving an input further
than its privacy allows (``tierlink_privacy_refusals_total``: a baseline that ignores privacy
makes them).

Each run then sends a small photo workload (:class:`PhotoPhase`): MobileNetV2 on real
224x224 photos (602 KB inputs, where split computing pays; Fashion-MNIST's 3 KB never do),
from the devices that hold the model's head (``heads:``) and, for contrast, one that does
not. The report counts how many requests a split plan served and at which cut/codec, and
checks their answers against the unsplit model's.
"""

from __future__ import annotations

import asyncio
import os
import platform
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tierlink.fleet.breakdown import Prediction
from tierlink.fleet.config import FleetConfig
from tierlink.fleet.launcher import RunningFleet
from tierlink.fleet.workload import (
    PHOTO_SLA,
    PrivacyTally,
    Record,
    WorkItem,
    drive,
    make_photo_workload,
    make_workload,
)
from tierlink.zoo.photo_models import PHOTO_TASK

# tierlink, then the baselines: what a team without a router would deploy (each request to
# the most capable tier its privacy allows), and the two extremes.
WARM_UP_S = 3.0  # of traffic per policy before its run (see warm_up)
RUNS = (("tierlink", None), ("static_rules", "static_rules"), ("cloud_only", "cloud_only"),
        ("device_only", "device_only"))


@dataclass(frozen=True, slots=True)
class DemoSettings:
    requests: int = 1500
    rate_per_s: float = 25.0
    seed: int = 7
    task: str = "fmnist"
    photo_requests: int = 120  # per run; 0 = no photo workload
    photo_rate_per_s: float = 4.0
    photo_deadline_ms: float = PHOTO_SLA[0]  # every photo request's deadline

    @classmethod
    def quick(cls) -> DemoSettings:
        return cls(requests=600, rate_per_s=25.0, photo_requests=40)


@dataclass(frozen=True, slots=True)
class PhotoPhase:
    """The photo workload of one demo: the same items in every run."""

    model: str
    items: tuple[WorkItem, ...]
    images: np.ndarray  # (N, 3, 224, 224) float32 in [0, 1]
    reference: np.ndarray  # (N,) the unsplit model's top-1, computed here once
    confidence: np.ndarray  # (N,) its top-1 probability (what the simulator answers with)


def privacy_counts(fleet: RunningFleet) -> PrivacyTally:
    """Every node's privacy counters summed: received-input violations and plans refused
    for privacy (counters: diff them around a run)."""
    from prometheus_client.parser import text_string_to_metric_families

    violations = refusals = 0.0
    with httpx.Client(timeout=5.0, trust_env=False, verify=fleet.verify()) as client:
        for url in fleet.node_urls.values():
            text = client.get(f"{url}/metrics").text
            for family in text_string_to_metric_families(text):
                totals = [s for s in family.samples if s.name.endswith("_total")]
                if family.name == "tierlink_inputs_received":
                    violations += sum(s.value for s in totals
                                      if s.labels.get("verdict") == "violation")
                elif family.name == "tierlink_privacy_refusals":
                    refusals += sum(s.value for s in totals)
    return PrivacyTally(int(violations), int(refusals))


def drain(fleet: RunningFleet, timeout_s: float = 30.0) -> bool:
    """Wait until no node has work in flight, so one run's stragglers are not counted in the
    next run's figures. False if the fleet did not drain in time."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, trust_env=False, verify=fleet.verify()) as client:
        while time.monotonic() < deadline:
            busy = 0
            for url in fleet.node_urls.values():
                try:
                    s = client.get(f"{url}/tierlink/v1/status").json()
                except httpx.HTTPError:
                    continue  # a dead node holds no work
                busy += int(s["inflight"]) + int(s["queue_depth"]) + sum(s["outstanding"].values())
            if busy == 0:
                return True
            time.sleep(0.2)
    return False


def run_workload(fleet: RunningFleet, items: list[WorkItem], images: Any, labels: Any,
                 task: str, policy: str | None, on_done: Callable[[Record], None],
                 send_labels: bool = True) -> tuple[list[Record], PrivacyTally]:
    """Drive ``items`` through the fleet's devices; (records, privacy counts)."""
    devices = {n.node_id: fleet.node_urls[n.node_id] for n in fleet.config.nodes
               if n.tier.label == "device"}
    drain(fleet)
    before = privacy_counts(fleet)
    # On a fleet with TLS the driver is an application: it trusts the fleet CA and
    # presents no certificate (a node's claims are not its to make).
    tls = fleet.pki.client_context(operator=False) if fleet.pki else None
    records = asyncio.run(drive(items, images, labels, devices, task, policy, on_done,
                                send_labels=send_labels, tls=tls))
    drain(fleet)
    return records, privacy_counts(fleet).since(before)


def warm_up(fleet: RunningFleet, items: list[WorkItem], images: Any, labels: Any, task: str,
            policy: str | None, seconds: float = WARM_UP_S) -> list[Record]:
    """Right before a run is measured, ``seconds`` of its workload through its policy, not
    counted; the records come back (``demo --log`` keeps them as the run's warm-up: the
    simulator can measure the HTTP costs from them, taken on the machine as the run found
    it).
    A node's first requests pay once for what is made on first use (a policy, connection
    pools, first-run code paths: stalls of up to ~150 ms on every device in its first
    seconds of traffic); unwarmed, the run would carry all of it."""
    first = [i for i in items if i.at_s < seconds]
    records, _ = run_workload(fleet, first, images, labels, task, policy, lambda _r: None,
                              send_labels=False)
    return records


def run_photos(fleet: RunningFleet, phase: PhotoPhase, policy: str | None,
               on_done: Callable[[Record], None]) -> tuple[list[Record], PrivacyTally]:
    """The photo workload once; each record's ``label`` is the unsplit model's answer."""
    return run_workload(fleet, list(phase.items), phase.images, phase.reference, PHOTO_TASK,
                        policy, on_done, send_labels=False)


def open_heads(fleet: RunningFleet, phase: PhotoPhase,
               timeout_s: float = 0.0) -> dict[str, list[str]]:
    """Per device holding ``phase.model``'s head, the cuts it has open (its split warmer
    opens, in the background, those its policy would pick for a task in use: the first
    photo requests upload the raw photo while it does). Waits up to ``timeout_s`` for each
    to have one; sends no requests."""
    holders = [o for o in dict.fromkeys(i.origin for i in phase.items)
               if phase.model in fleet.config.node(o).heads]
    deadline = time.monotonic() + timeout_s
    opened: dict[str, list[str]] = {}
    with httpx.Client(timeout=5.0, trust_env=False, verify=fleet.verify()) as http:
        for origin in holders:
            while True:
                status = http.get(f"{fleet.node_urls[origin]}/tierlink/v1/status").json()
                opened[origin] = list(status.get("split_open", {}).get(phase.model, []))
                if opened[origin] or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
    return opened


# -- the photo workload's model and items ------------------------------------------------------


def photo_model(fleet: FleetConfig) -> str | None:
    """The fleet's model of the photo task some device holds a head of (None: no photos)."""
    return next((m for n in fleet.nodes for m in n.heads
                 if m.startswith(f"{PHOTO_TASK}-") and n.tier.label == "device"), None)


def photo_origins(fleet: FleetConfig, model: str) -> tuple[str, ...]:
    """The devices holding ``model``'s head, then the first device that does not (its
    requests can only upload the raw photo: the contrast)."""
    devices = [n for n in fleet.nodes if n.tier.label == "device"]
    heads = [n.node_id for n in devices if model in n.heads]
    other = next((n.node_id for n in devices if model not in n.heads), None)
    return (*heads, *([other] if other else []))


def photo_phase(fleet: FleetConfig, settings: DemoSettings,
                models: dict[str, tuple[Path, Path]]) -> PhotoPhase | None:
    """The photo workload for ``fleet``, or None when it names no photo model with a
    device head (or the settings ask for none). Loads the photos (10 views each) and runs
    the unsplit model on them once, here, for the reference answers."""
    from tierlink.models.evaluate import onnx_logits, softmax
    from tierlink.zoo.photos import imagenet_photos

    model = photo_model(fleet)
    if model is None or settings.photo_requests <= 0:
        return None
    images, _ = imagenet_photos(views=True)  # (100, 3, 224, 224)
    logits = onnx_logits(models[model][0], images, batch_size=25, threads=1)  # (100, 1000)
    items = make_photo_workload(settings.photo_requests, settings.photo_rate_per_s,
                                photo_origins(fleet, model), len(images), settings.seed,
                                deadline_ms=settings.photo_deadline_ms)
    probs = softmax(logits, 1.0)
    return PhotoPhase(model, tuple(items), images, probs.argmax(axis=1), probs.max(axis=1))


def workload_for(fleet: FleetConfig, settings: DemoSettings, n_samples: int) -> list[WorkItem]:
    devices = [n.node_id for n in fleet.nodes if n.tier.label == "device"]
    return make_workload(settings.requests, settings.rate_per_s, devices, n_samples,
                         settings.seed)


def threshold_prediction(fleet: FleetConfig, models: dict[str, tuple[Path, Path]],
                         task: str) -> Prediction | None:
    """What the device model's cascade threshold predicts (None: no device model of
    ``task`` in the fleet): the share of the calibration split below it, and per test
    sample whether its calibrated confidence is below it."""
    from tierlink.models.card import load_card
    from tierlink.models.evaluate import onnx_logits, softmax
    from tierlink.zoo.datasets import load_splits

    name = next((m for n in fleet.nodes if n.tier.label == "device" for m in n.models
                 if m.startswith(f"{task}-")), None)
    if name is None or name not in models:
        return None
    path, card_path = models[name]
    temperature = load_card(card_path).temperature
    threshold = fleet.routing.policy_config().threshold_for(name)
    splits = load_splits(task)

    def confidence(images: np.ndarray) -> np.ndarray:
        return softmax(onnx_logits(path, images, threads=1), temperature).max(axis=1)

    return Prediction(threshold, float((confidence(splits.calib.input) < threshold).mean()),
                      confidence(splits.test.input) < threshold)


def fleet_summary(fleet: RunningFleet) -> dict[str, Any]:
    cfg = fleet.config
    return {
        "name": cfg.name,
        "nodes": [{"id": n.node_id, "tier": n.tier.label, "models": list(n.models),
                   "heads": list(n.heads), "workers": n.workers, "cpu_quota": n.cpu_quota}
                  for n in cfg.nodes],
        "links": [{"from": l.src, "to": l.dst, "delay_ms": l.delay_ms,
                   "jitter_ms": l.jitter_ms, "bandwidth_mbit": l.bandwidth_mbit,
                   "loss": l.loss} for l in cfg.links],
        "routing": cfg.routing.to_dict(),
        # where the nodes ran: loopback through the link emulator, or namespaces of their
        # own with the kernel shaping links; TLS on every hop or not
        "network": "netns" if fleet.fabric is not None else "loopback",
        "tls": fleet.pki is not None,
    }


def environment(fleet: RunningFleet, settings: DemoSettings, zoo: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime

    from tierlink import __version__

    return {
        "tierlink": __version__, "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__, "platform": platform.platform(),
        "cpus": os.cpu_count(), "device_cpu_throttle": fleet.cpu_mode,
        "requests_per_run": settings.requests, "rate_per_s": settings.rate_per_s,
        "photo_requests_per_run": settings.photo_requests,
        "photo_rate_per_s": settings.photo_rate_per_s, "seed": settings.seed, "zoo": zoo,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cost_model": "docs/cost-model.md (cloud A100 $2.00/h, edge box $0.12/h, device "
                      "energy, WAN $0.05/GB)",
    }


def hard_example_summary(control_url: str, timeout_s: float = 10.0,
                         headers: dict[str, str] | None = None,
                         verify: ssl.SSLContext | bool = True) -> dict[str, Any]:
    """What the control plane's hard-example store holds after the runs: how many, from
    which models and privacy levels, and how often the escalating model was in fact wrong
    (where the client sent the label) — read back from its ``.npz`` export."""
    import io

    import numpy as np

    response = httpx.get(f"{control_url}/v1/hard-examples/export", timeout=timeout_s,
                         headers=headers, verify=verify, trust_env=False)
    response.raise_for_status()
    data = np.load(io.BytesIO(response.content), allow_pickle=False)
    labels, predictions = data["labels"], data["predictions"]
    known = labels >= 0
    return {
        "stored": len(labels),
        "by_model": _counts(data["models"]), "by_privacy": _counts(data["privacy"]),
        "labelled": int(known.sum()),
        "wrong_share_of_labelled": (float((predictions[known] != labels[known]).mean())
                                    if known.any() else None),
    }


def _counts(values: Any) -> dict[str, int]:
    import numpy as np

    if not len(values):
        return {}
    names, counts = np.unique(values, return_counts=True)
    return {str(n): int(c) for n, c in zip(names.tolist(), counts.tolist(), strict=True)}
