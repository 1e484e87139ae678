"""The fault suite: what tierlink loses, and how fast it recovers, when things break under load.

Each case starts its own real fleet on loopback (control plane, link emulator, node processes,
the ``test`` zoo's Fashion-MNIST models unless ``--zoo-profile full``), drives a steady load of
real test images through the devices' routed endpoints (``fleet.workload.drive``), breaks
something, and measures:

* ``kill_edge``: kill -9 the busiest edge node — requests lost (no answer at all; must be 0),
  p99 latency of the requests sent during failover, recovery time (from the kill until the
  last request that was not answered within its deadline).
* ``control_restart``: stop the control plane for ``--control-down-s`` under load and start
  it again — requests that failed (any error; must be 0: the registry is not on the request
  path).
* ``slow_node``: one of two edges gets 10x slower compute (fault injection) with hedging on —
  p99 against the deadline, hedges sent, and the extra load they cost (hedges / requests).
* ``uplink_cut``, ``bad_canary_accuracy``, ``bad_canary_crash``, ``tampered``: see their
  functions (store-and-forward, rollouts, the model repository).

Prints a table, writes JSON (``{"cases": {name: figures}}``, the shape issue 5 asks for)::

    .venv/bin/python benchmarks/faults.py [--json PATH] [--cases kill_edge,slow_node]
        [--zoo-profile test|full] [--rate 40] [--control etcd] [--netns]

Every process it starts is stopped at the end of its case (the fleet's context manager), also
when a case fails; a failing case is reported with its error and the others still run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from tierlink.core.types import Priority, Privacy
from tierlink.fleet.config import parse_fleet
from tierlink.fleet.launcher import RunningFleet, launch
from tierlink.fleet.workload import Record, WorkItem, drive

Models = dict[str, tuple[Path, Path]]
EDGES = ("edge-1", "edge-2")
DEVICES = ("dev-1", "dev-2")


# -- fleets and load ------------------------------------------------------------------------


@dataclass
class Bench:
    """What every case gets: the zoo, the test images, a work directory and the options."""

    models: Models
    images: np.ndarray  # (N, 1, 28, 28) float32
    labels: np.ndarray  # (N,) int64
    hard: np.ndarray  # indices of images the device model escalates
    work: Path
    rate: float
    control_down_s: float
    profile: str
    scale: float = 1.0  # multiplies the long cases' durations (the integration tests use < 1)
    control: str = "sqlite"  # etcd: two control-plane replicas over a three-member etcd
    netns: bool = False  # every node in a network namespace of its own (tierlink up --netns)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10.0,
                                                                     trust_env=False))


@contextmanager
def fleet_of(bench: Bench, yaml_text: str, name: str) -> Iterator[RunningFleet]:
    config = parse_fleet(yaml.safe_load(yaml_text), source=f"<{name}>")
    if bench.control == "etcd":
        config = replace(config, control_store="etcd", control_replicas=2, etcd_members=3)
    fleet = launch(config, bench.models, bench.work / name, netns=bench.netns)
    try:
        yield fleet
    finally:
        fleet.stop()


def steady(bench: Bench, seconds: float, deadline_ms: float,
           privacies: tuple[Privacy, ...] = (Privacy.ANY, Privacy.SITE)) -> list[WorkItem]:
    """``--rate`` requests/s from both devices on inputs the devices escalate."""
    n = int(bench.rate * seconds)
    return [WorkItem(seq=i, sample=int(bench.hard[i % len(bench.hard)]), origin=DEVICES[i % 2],
                     deadline_ms=deadline_ms, priority=Priority.INTERACTIVE,
                     privacy=privacies[(i // 2) % len(privacies)], at_s=i / bench.rate)
            for i in range(n)]


class Load(threading.Thread):
    """``drive`` on its own event loop; ``done`` fills in completion order, ``started`` is
    the monotonic time the first item was due. ``bench``: anything with the test images
    and their ``labels`` (``benchmarks/drift.py`` drives its load, without labels, too)."""

    def __init__(self, bench: Bench, items: list[WorkItem], urls: dict[str, str],
                 send_labels: bool = True) -> None:
        super().__init__(name="fault-load", daemon=True)
        self.bench, self.items, self.urls = bench, items, urls
        self.send_labels = send_labels
        self.done: list[Record] = []
        self.records: list[Record] = []
        self.error: BaseException | None = None
        self.started = 0.0

    def run(self) -> None:
        self.started = time.monotonic()
        try:
            self.records = asyncio.run(drive(self.items, self.bench.images, self.bench.labels,
                                             self.urls, "fmnist", None,
                                             on_done=self.done.append,
                                             send_labels=self.send_labels))
        except BaseException as exc:  # noqa: BLE001 (reported by finish())
            self.error = exc

    def at(self, seconds: float) -> None:
        """Block until ``seconds`` into the load."""
        while time.monotonic() < self.started + seconds and self.is_alive():
            time.sleep(0.02)

    def finish(self, timeout_s: float = 120.0) -> list[Record]:
        self.join(timeout_s)
        if self.is_alive():
            raise RuntimeError("the load did not finish")
        if self.error is not None:
            raise RuntimeError(f"the load failed: {self.error!r}") from self.error
        return self.records


def p99(records: list[Record]) -> float | None:
    lat = [r.latency_ms for r in records if r.answered]
    return round(float(np.percentile(lat, 99)), 1) if lat else None


def errors(records: list[Record]) -> dict[str, int]:
    """Error codes of the requests not answered, counted."""
    out: dict[str, int] = {}
    for r in records:
        if not r.answered:
            out[r.error or "lost"] = out.get(r.error or "lost", 0) + 1
    return out


def metric_sum(http: httpx.Client, url: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus counter's samples at ``url`` matching ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(http.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def busiest_edge(records: list[Record]) -> str:
    counts = {e: sum(r.served_by == e for r in records) for e in EDGES}
    return max(counts, key=lambda e: counts[e])


# -- (a) kill -9 an edge --------------------------------------------------------------------

EDGE_FLEET = """
name: faults-{name}
seed: 5
zoo: {{profile: {profile}}}
control: {{ttl_s: 3}}
fault_injection: true
routing:
  policy: tierlink
  thresholds: {{fmnist-small: 0.9}}
  breaker: {{failure_threshold: 3, cooldown_s: 1}}
  hedging: {{enabled: {hedging}}}
nodes:
  - {{id: edge-1, tier: edge,   models: [fmnist-medium]}}
  - {{id: edge-2, tier: edge,   models: [fmnist-medium]}}
  - {{id: dev-1,  tier: device, models: [fmnist-small]}}
  - {{id: dev-2,  tier: device, models: [fmnist-small]}}
links:
  - {{from: [dev-1, dev-2], to: [edge-1, edge-2], delay_ms: 2}}
"""


def edge_fleet(bench: Bench, name: str, hedging: bool = True) -> str:
    return EDGE_FLEET.format(name=name, profile=bench.profile, hedging=str(hedging).lower())


def kill_edge(bench: Bench) -> dict[str, Any]:
    """kill -9 the busiest edge 3 s into a 12 s load (500 ms deadlines)."""
    with fleet_of(bench, edge_fleet(bench, "kill-edge"), "kill-edge") as fleet:
        load = Load(bench, steady(bench, 12.0, 500.0), fleet.node_urls)
        load.start()
        load.at(3.0)
        dead = busiest_edge(list(load.done))
        fleet.kill(dead)
        killed_at = time.monotonic() - load.started
        records = load.finish()
    after = [r for r in records if r.item.at_s >= killed_at]
    bad = [r.item.at_s for r in after if not r.answered or r.latency_ms > r.item.deadline_ms]
    return {"requests": len(records), "lost": sum(r.lost for r in records),
            "failed": sum(not r.answered for r in records), "errors": errors(records),
            "killed": dead,
            "p99_ms": p99([r for r in after if r.item.at_s < killed_at + 3.0]),
            "p99_before_ms": p99([r for r in records if r.item.at_s < killed_at]),
            "recovery_s": round(max(bad) - killed_at, 2) if bad else 0.0}


# -- (e) restart the control plane ----------------------------------------------------------


def control_restart(bench: Bench) -> dict[str, Any]:
    """Stop the control plane 3 s into a 12 s load, keep it down ``--control-down-s``,
    start it again on the same port and database."""
    with fleet_of(bench, edge_fleet(bench, "control-restart"), "control-restart") as fleet:
        load = Load(bench, steady(bench, 12.0, 500.0), fleet.node_urls)
        load.start()
        load.at(3.0)
        fleet.restart_control(down_s=bench.control_down_s)
        records = load.finish()
        back = wait_registered(bench.http, fleet, 15.0)
    return {"requests": len(records), "failed": sum(not r.answered for r in records),
            "errors": errors(records), "lost": sum(r.lost for r in records), "down_s": bench.control_down_s,
            "nodes_back": back, "p99_ms": p99(records)}


def wait_registered(http: httpx.Client, fleet: RunningFleet, timeout_s: float) -> int:
    """How many nodes the restarted control plane lists within ``timeout_s``."""
    deadline, seen = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        try:
            seen = len(http.get(f"{fleet.control_url}/v1/nodes",
                                headers=fleet.admin_headers).json()["nodes"])
        except (httpx.HTTPError, KeyError, ValueError):
            seen = 0
        if seen == len(fleet.config.nodes):
            break
        time.sleep(0.2)
    return seen


# -- (f) a slow node, hedged ----------------------------------------------------------------


def slow_node(bench: Bench) -> dict[str, Any]:
    """The busiest edge turns 10x slower (injected fault: its compute takes 10x as long and
    holds its worker that long) 4 s into a 12 s load with 150 ms deadlines; hedging on (the
    fleet default: p95 delay, 5% budget), then the same without hedging. ``p99_after_ms``:
    the requests sent in the 3 s after the fault, when estimates have not caught up yet."""
    hedged = _slow_node(bench, hedging=True)
    unhedged = _slow_node(bench, hedging=False)
    keep = ("p99_ms", "p99_after_ms", "late")
    return {**hedged, "unhedged": {k: unhedged[k] for k in keep}}


def _slow_node(bench: Bench, hedging: bool) -> dict[str, Any]:
    deadline_ms = 150.0
    name = "slow-node" if hedging else "slow-node-unhedged"
    with fleet_of(bench, edge_fleet(bench, name, hedging), name) as fleet:
        load = Load(bench, steady(bench, 12.0, deadline_ms), fleet.node_urls)
        load.start()
        load.at(4.0)
        slow = busiest_edge(list(load.done))
        bench.http.post(f"{fleet.node_urls[slow]}/tierlink/v1/faults",
                        json={"slowdown": 10}).raise_for_status()
        records = load.finish()
        sent = sum(metric_sum(bench.http, fleet.node_urls[d], "tierlink_hedges_total",
                              outcome="sent") for d in DEVICES)
        won = sum(metric_sum(bench.http, fleet.node_urls[d], "tierlink_hedges_total",
                             outcome="won") for d in DEVICES)
    late = sum(not r.answered or r.latency_ms > deadline_ms for r in records)
    after = [r for r in records if 4.0 <= r.item.at_s < 7.0]
    worst = sorted(records, key=lambda r: -r.latency_ms if r.answered else float("-inf"))[:5]
    return {"requests": len(records), "p99_ms": p99(records), "p99_after_ms": p99(after),
            "deadline_ms": deadline_ms, "slow": slow,
            # when the slowest were sent (s into the load) and what they took: a tail that
            # comes from elsewhere than the slow node shows itself here
            "worst": [(round(r.item.at_s, 2), round(r.latency_ms, 1)) for r in worst],
            "late": late, "hedges": int(sent), "hedges_won": int(won),
            "extra_load_share": round(sent / max(1, len(records)), 4)}


# -- (b) cut the device -> edge uplink ------------------------------------------------------


def uplink_cut(bench: Bench) -> dict[str, Any]:
    """Asynchronous requests (``tierlink.async``) from both devices for 50 s; every
    device->edge link is cut from 5 s to 35 s; dev-1 is killed -9 at 15 s (during the
    outage) and restarted. Results travel device outbox -> edge inbox/outbox -> control
    plane. Counted after recovery: every accepted (202) result must arrive exactly once."""
    from tierlink.netem.server import LinkControlClient

    links = [f"{d}->{e}" for d in DEVICES for e in EDGES]
    cut, kill, restore, end = (t * bench.scale for t in (5.0, 15.0, 35.0, 50.0))
    with fleet_of(bench, edge_fleet(bench, "uplink-cut"), "uplink-cut") as fleet, \
            LinkControlClient(fleet.links_url) as netem:
        sender = AsyncSender(bench, fleet.node_urls, seconds=end)
        sender.start()
        sender.at(cut)
        for link in links:
            netem.update(link, up=False)
        sender.at(kill)
        fleet.kill("dev-1")
        fleet.restart_node("dev-1")
        restarted_at = time.monotonic() - sender.started
        sender.at(restore)
        for link in links:
            netem.update(link, up=True)
        sender.join(120.0)
        delivered, duplicates = wait_delivered(bench, fleet, sender.accepted, 90.0)
    keys = [a["result_key"] for a in sender.accepted]
    return {"queued": len(keys), "delivered": len(delivered & set(keys)),
            "lost": len(set(keys) - delivered), "duplicates": 0,  # else stored_keys raised
            "redeliveries_deduped": duplicates,
            "accepted_while_down": sum(a["uplink"] == "down" for a in sender.accepted),
            "not_accepted": sender.refused, "requests": sender.sent,
            "outage_s": round(restore - cut, 1), "restart_s": round(restarted_at - kill, 1)}


class AsyncSender(threading.Thread):
    """``--rate`` async requests/s alternating between the devices for ``seconds``; keeps
    the 202 answers (``accepted``) and counts requests that got none (a device being
    restarted refuses connections: those were never accepted, so nothing is owed)."""

    def __init__(self, bench: Bench, urls: dict[str, str], seconds: float) -> None:
        super().__init__(name="async-load", daemon=True)
        self.bench, self.urls, self.seconds = bench, urls, seconds
        self.accepted: list[dict[str, Any]] = []
        self.refused = 0
        self.sent = 0
        self.started = time.monotonic()

    def at(self, seconds: float) -> None:
        while time.monotonic() < self.started + seconds and self.is_alive():
            time.sleep(0.02)

    def run(self) -> None:
        self.started = time.monotonic()
        with httpx.Client(timeout=5.0, trust_env=False) as http:
            i = 0
            while (now := time.monotonic() - self.started) < self.seconds:
                due = i / self.bench.rate
                if now < due:
                    time.sleep(due - now)
                self.one(http, i)
                i += 1

    def one(self, http: httpx.Client, i: int) -> None:
        device = DEVICES[i % 2]
        sample = int(self.bench.hard[i % len(self.bench.hard)])
        body = {"id": f"req-{i}", "inputs": [{
            "name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28],
            "data": self.bench.images[sample].reshape(-1).tolist()}],
            "parameters": {"tierlink.async": True, "tierlink.deadline_ms": 500,
                           "tierlink.privacy": "any", "tierlink.label": int(self.bench.labels[sample])}}
        self.sent += 1
        try:
            response = http.post(f"{self.urls[device]}/v2/models/fmnist/infer", json=body)
        except httpx.HTTPError:
            self.refused += 1
            return
        if response.status_code == 202:
            self.accepted.append(response.json())
        else:
            self.refused += 1


def wait_delivered(bench: Bench, fleet: RunningFleet, accepted: list[dict[str, Any]],
                   timeout_s: float) -> tuple[set[str], int]:
    """Keys stored at the control plane once every accepted one is there (or the timeout),
    and the redeliveries it answered ``duplicate`` (stored once, counted; hard examples'
    included). A key stored twice would raise in :func:`stored_keys`."""
    want = {a["result_key"] for a in accepted}
    deadline = time.monotonic() + timeout_s
    while True:
        stored = stored_keys(bench, fleet)
        if want <= stored or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    duplicates = metric_sum(bench.http, fleet.control_url, "tierlink_control_results_total",
                            outcome="duplicate")
    return stored, int(duplicates)


def stored_keys(bench: Bench, fleet: RunningFleet) -> set[str]:
    counts = stored_key_counts(bench.http, fleet)
    twice = sum(n - 1 for n in counts.values())
    if twice:
        raise RuntimeError(f"the control plane stored {twice} keys twice")
    return set(counts)


def stored_key_counts(http: httpx.Client, fleet: RunningFleet) -> Counter[str]:
    """How many times the control plane stored each asynchronous result's key."""
    keys: list[str] = []
    after = 0
    while True:
        page = http.get(f"{fleet.control_url}/v1/results",
                        params={"after": after, "limit": 1000},
                        headers=fleet.admin_headers).json()
        keys += [r["key"] for r in page["results"]]
        if page.get("next_after") is None:
            break
        after = page["next_after"]
    return Counter(keys)


# -- (c) a bad version to a 10% canary, (d) a tampered artifact -----------------------------

CANARY_FLEET = EDGE_FLEET.replace("fault_injection: true", "fault_injection: true\n"
                                  "trusted_keys: [{key}]")
MODEL = "fmnist-medium"  # what the edges serve


def canary_fleet(bench: Bench, name: str, key: str) -> str:
    return CANARY_FLEET.format(name=name, profile=bench.profile, hedging="true", key=key)


def publish(bench: Bench, fleet: RunningFleet, key_file: Path, onnx: Path, version: str,
            notes: str) -> None:
    from tierlink.cli.model import run_publish

    run_publish(MODEL, onnx, bench.models[MODEL][1], version, notes, key_file,
                fleet.control_url, eval_limit=1000, admin_token=fleet.admin_token)


def publish_as_measured_elsewhere(bench: Bench, fleet: RunningFleet, key_file: Path,
                                  onnx: Path, version: str, notes: str) -> None:
    """Publish without measuring here: the validation record is the base model's (as if the
    publisher's machine had loaded it fine). ``tierlink model publish`` would refuse a graph
    it cannot load itself, so a version that only crashes on the nodes gets in this way."""
    from tierlink.repo.client import RepositoryClient
    from tierlink.repo.manifest import Validation
    from tierlink.repo.publish import prepare_version
    from tierlink.repo.signing import load_private_key, sign_manifest

    validation = Validation(dataset="fmnist", split="test", n=1000, accuracy=0.75,
                            measured_at=time.time())
    manifest, onnx_path, card_path = prepare_version(MODEL, onnx, bench.models[MODEL][1],
                                                     version, notes, bench.work / version,
                                                     validation)
    with RepositoryClient(fleet.control_url, headers=fleet.admin_headers) as client:
        client.upload_blob(onnx_path)
        client.upload_blob(card_path)
        client.publish(sign_manifest(manifest, load_private_key(key_file)))


def signing_key(bench: Bench, name: str) -> tuple[Path, str]:
    from tierlink.repo.signing import generate_key

    path = bench.work / f"{name}.key"
    return path, generate_key(path)


def start_rollout(bench: Bench, fleet: RunningFleet, version: str,
                  **options: Any) -> dict[str, Any]:
    body = {"name": MODEL, "version": version, "tier": "edge", **options}
    response = bench.http.post(f"{fleet.control_url}/v1/rollouts", json=body,
                               headers=fleet.admin_headers)
    response.raise_for_status()
    return dict(response.json())


def wait_phase(bench: Bench, fleet: RunningFleet, rollout_id: int, phases: set[str],
               timeout_s: float) -> dict[str, Any]:
    """Poll the rollout until its phase is one of ``phases``; the last record either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = dict(bench.http.get(f"{fleet.control_url}/v1/rollouts/{rollout_id}",
                                     headers=fleet.admin_headers).json())
        if record["phase"] in phases or time.monotonic() > deadline:
            return record
        time.sleep(0.25)


def bad_canary(bench: Bench, kind: str) -> dict[str, Any]:
    """Roll a bad version of the edges' model (``accuracy``: noisy weights; ``crash``: a
    graph ONNX Runtime cannot load) to a 10% canary of the edge tier under a steady load
    whose requests carry their labels (the feedback the accuracy gate reads)."""
    from tierlink.testing.artifacts import degraded_copy, unloadable_copy

    key_file, public = signing_key(bench, f"canary-{kind}")
    bad = bench.work / f"{MODEL}-{kind}.onnx"
    make = {"accuracy": lambda: degraded_copy(bench.models[MODEL][0], bad, noise=1.5),
            "crash": lambda: unloadable_copy(bench.models[MODEL][0], bad)}[kind]
    make()
    name = f"canary-{kind}"
    with fleet_of(bench, canary_fleet(bench, name, public), name) as fleet:
        how = publish if kind == "accuracy" else publish_as_measured_elsewhere
        how(bench, fleet, key_file, bad, f"2-{kind}", f"a bad version ({kind})")
        load = Load(bench, steady(bench, 60.0 * bench.scale, 500.0), fleet.node_urls)
        load.start()
        load.at(3.0)
        started = time.monotonic()
        rollout = start_rollout(bench, fleet, f"2-{kind}", canary=0.1,
                                soak_s=20.0 * bench.scale, min_requests=int(40 * bench.scale))
        start_s = started - load.started
        record = wait_phase(bench, fleet, rollout["id"], {"rolled_back", "promoted", "failed",
                                                          "paused"}, 55.0 * bench.scale)
        ended = time.monotonic() - started
        records = load.finish()
    during = [r for r in records if r.item.at_s >= start_s and r.served_by in EDGES]
    exposed = sum(r.model_version == f"2-{kind}" for r in during)
    return {"phase": record["phase"], "reason": _last_reason(record),
            "rollback_s": round(ended, 1) if record["phase"] == "rolled_back" else None,
            "exposed_share": round(exposed / max(1, len(during)), 4),
            "exposed_requests": exposed, "edge_requests": len(during), "canary_share": 0.1,
            "requests": len(records), "failed": sum(not r.answered for r in records)}


def _last_reason(record: dict[str, Any]) -> str:
    transitions = record.get("transitions") or []
    return str(transitions[-1].get("reason", "")) if transitions else ""


def bad_canary_accuracy(bench: Bench) -> dict[str, Any]:
    return bad_canary(bench, "accuracy")


def bad_canary_crash(bench: Bench) -> dict[str, Any]:
    return bad_canary(bench, "crash")


def tampered(bench: Bench) -> dict[str, Any]:
    """Three ways to slip in a bad artifact, each must be refused: a manifest edited after
    signing and one signed by a key nobody trusts (the control plane refuses to publish
    them), and a blob changed on the control plane's disk after publication, rolled out to
    every edge at once (each edge must refuse it and keep serving its version)."""
    from tierlink.repo.blobs import BlobStore

    key_file, public = signing_key(bench, "tamper")
    rogue_file, _ = signing_key(bench, "rogue")
    with fleet_of(bench, canary_fleet(bench, "tampered", public), "tampered") as fleet:
        forged = forged_publish(bench, fleet, key_file)
        rogue = refused_publish(bench, fleet, rogue_file, "3-rogue")
        publish(bench, fleet, key_file, bench.models[MODEL][0], "3-flipped", "then tampered")
        entry = bench.http.get(f"{fleet.control_url}/v1/models/{MODEL}/versions/3-flipped",
                               headers=fleet.admin_headers).json()
        flip_byte(BlobStore(fleet.run_dir / "registry.db.blobs").path(
            entry["signed"]["manifest"]["onnx_sha256"]))
        rollout = start_rollout(bench, fleet, "3-flipped", stages=[1.0], soak_s=5.0)
        record = wait_phase(bench, fleet, rollout["id"], {"rolled_back", "promoted"}, 60.0)
        time.sleep(2.0)  # both edges attempt at once; let the second one finish too
        refusing = [e for e in EDGES if metric_sum(bench.http, fleet.node_urls[e],
                                                   "tierlink_model_installs_total",
                                                   outcome="rejected") > 0]
        serving = versions_served(bench, fleet)
    return {"nodes": len(EDGES), "refused": len(refusing), "refusing": refusing,
            "control_plane_refused": {"forged_signature": forged, "untrusted_key": rogue},
            "rollout": {"phase": record["phase"], "reason": _last_reason(record)},
            "serving_after": serving}


def refused_publish(bench: Bench, fleet: RunningFleet, key_file: Path, version: str) -> bool:
    """Publish the edges' model signed by ``key_file``; True when the control plane refuses."""
    from tierlink.errors import ArtifactRejected

    try:
        publish(bench, fleet, key_file, bench.models[MODEL][0], version, "rogue key")
    except ArtifactRejected:
        return True
    return False


def forged_publish(bench: Bench, fleet: RunningFleet, key_file: Path) -> bool:
    """Publish a manifest whose notes were edited after signing; True when refused."""
    from tierlink.errors import ArtifactRejected
    from tierlink.repo.client import RepositoryClient
    from tierlink.repo.manifest import SignedManifest, Validation
    from tierlink.repo.publish import prepare_version
    from tierlink.repo.signing import load_private_key, sign_manifest

    onnx, card = bench.models[MODEL]
    validation = Validation(dataset="fmnist", split="test", n=1, accuracy=0.99,
                            measured_at=time.time())
    manifest, onnx_path, card_path = prepare_version(MODEL, onnx, card, "3-forged", "honest",
                                                     bench.work / "forged", validation)
    signed = sign_manifest(manifest, load_private_key(key_file)).to_dict()
    signed["manifest"]["notes"] = "edited after signing"
    with RepositoryClient(fleet.control_url, headers=fleet.admin_headers) as client:
        client.upload_blob(onnx_path)
        client.upload_blob(card_path)
        try:
            client.publish(SignedManifest.from_dict(signed))
        except ArtifactRejected:
            return True
    return False


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(data))


def versions_served(bench: Bench, fleet: RunningFleet) -> dict[str, list[str]]:
    """Per edge, the versions of the model its heartbeat lists (active first)."""
    nodes = bench.http.get(f"{fleet.control_url}/v1/nodes", headers=fleet.admin_headers).json()
    return {n["node_id"]: [m["version"] for m in n["models"] if m["name"] == MODEL]
            for n in nodes["nodes"] if n["node_id"] in EDGES}


# -- running --------------------------------------------------------------------------------

CASES: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "kill_edge": kill_edge, "uplink_cut": uplink_cut, "bad_canary_accuracy": bad_canary_accuracy,
    "bad_canary_crash": bad_canary_crash, "tampered": tampered,
    "control_restart": control_restart, "slow_node": slow_node,
}


def load_bench(profile: str, work: Path, rate: float, control_down_s: float) -> Bench:
    from tierlink.zoo.cache import ensure_zoo
    from tierlink.zoo.datasets import fashion_mnist

    zoo = ensure_zoo(task="fmnist", profile=profile, progress=True)
    models = {name: (zoo.path(name), zoo.card_path(name)) for name in zoo.cards}
    test = fashion_mnist().test
    hard = least_confident(models["fmnist-small"][0], test.input, 100)
    return Bench(models, test.input, test.labels, hard, work, rate, control_down_s, profile)


def least_confident(onnx_path: Path, images: np.ndarray, n: int) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    pool = images[:2000]
    logits = session.run(None, {session.get_inputs()[0].name: pool})[0]
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    confidence = (z / z.sum(axis=1, keepdims=True)).max(axis=1)
    return np.argsort(confidence)[:n]


def run(names: list[str], bench: Bench) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        print(f"[{name}] ...", flush=True)
        start = time.monotonic()
        try:
            results[name] = CASES[name](bench)
        except Exception as exc:  # noqa: BLE001 (one broken case must not hide the others)
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results[name]["wall_s"] = round(time.monotonic() - start, 1)
        print(f"[{name}] {json.dumps(results[name])}", flush=True)
    return results


def table(results: dict[str, Any]) -> str:
    lines = ["| case | figures |", "|---|---|"]
    for name, figures in results.items():
        shown = ", ".join(f"{k}={v}" for k, v in figures.items())
        lines.append(f"| {name} | {shown} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--zoo-profile", default="test", choices=("test", "full"))
    parser.add_argument("--rate", type=float, default=40.0, help="requests/s (both devices)")
    parser.add_argument("--control-down-s", type=float, default=3.0)
    parser.add_argument("--control", choices=("sqlite", "etcd"), default="sqlite",
                        help="etcd: every fleet's control plane is two replicas over etcd")
    parser.add_argument("--netns", action="store_true",
                        help="every node in a network namespace of its own, links shaped "
                             "by the kernel (root only; see tierlink up --netns)")
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    with tempfile.TemporaryDirectory(prefix="tierlink-faults-") as tmp:
        bench = load_bench(args.zoo_profile, Path(tmp), args.rate, args.control_down_s)
        bench.control = args.control
        bench.netns = args.netns
        results = run(names, bench)
        bench.http.close()
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cases": results, "zoo_profile": args.zoo_profile,
                                         "rate_per_s": args.rate, "control": args.control,
                                         "netns": args.netns},
                                        indent=2))
        print(f"wrote {args.json}")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
