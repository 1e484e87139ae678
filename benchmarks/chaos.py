"""A chaos run: the demo's fleet keeping its promises while things fail one after another.

The demo's fleet (``src/tierlink/demo/fleets/fleet.yaml``: 4 devices at half a core, 2
edges, a cloud, its links and routing; without the photo model) with its control plane on
etcd (two stateless replicas over a three-member etcd cluster), at twice the demo's rate
(``--rate`` 50 requests/s) in the demo's mix of priorities (realtime 30 ms, interactive
150 ms, batch 1 s) and privacy levels, with asynchronous requests beside them
(``--async-rate``, from dev-1 and dev-2). Every ``--every`` seconds (30) one event, drawn
with ``--seed``:

* ``kill_node``: a random non-origin node (an edge or the cloud) killed with -9 and
  restarted at once from its spec (same id, port, state directory);
* ``cut_link``: a random link cut for 5-20 s (the emulator carries nothing), then restored;
* ``kill_control``: a control-plane replica killed with -9 and restarted;
* ``kill_etcd``: an etcd member killed with -9 and restarted on its data directory.

Reported (``--json``): ``lost`` (a synchronous request without an answer, or an accepted
asynchronous result never delivered), ``duplicated`` (an asynchronous result stored twice
at the control plane, or a request the load saw answered twice), ``sla_by_priority`` (answered within the
deadline / sent), ``unexplained_errors`` (an error answer without a code of the error tree,
or ``internal``), ``errors`` by code, ``rss_growth`` and ``open_files_growth`` per process
incarnation (the mean of its last minute over the mean of its first minute after
``--warmup``; incarnations shorter than three minutes are listed, not judged) and
``events`` (what was done when). Bounds: lost 0, duplicated 0, realtime SLA ≥ 0.99,
unexplained errors 0, growth ≤ 1.10.

    .venv/bin/python benchmarks/chaos.py [--json PATH] [--seconds 600] [--rate 50]
        [--async-rate 2] [--every 30] [--seed 1]

Every process it starts is stopped at the end (the fleet's context manager), also on error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from faults import AsyncSender, Load, stored_key_counts  # the fault suite's load threads

from tierlink.core.types import Priority
from tierlink.errors import TierlinkError
from tierlink.fleet.config import parse_fleet
from tierlink.fleet.launcher import RunningFleet, launch
from tierlink.fleet.workload import Record, make_workload

DEMO_FLEET = Path(__file__).resolve().parents[1] / "src/tierlink/demo/fleets/fleet.yaml"
PHOTO = "imagenet-mobilenetv2"
ORIGINS = ("dev-1", "dev-2", "dev-3", "dev-4")
EVENTS = ("kill_node", "cut_link", "kill_control", "kill_etcd")
BOUNDS = {"lost": 0, "duplicated": 0, "realtime_sla": 0.99, "unexplained_errors": 0,
          "growth": 1.10}
SAMPLE_EVERY_S = 5.0
MIN_JUDGED_S = 180.0  # an incarnation shorter than this is listed, not judged


@dataclass
class Bench:
    """What the load threads need (``faults.Load``, ``faults.AsyncSender``)."""

    images: np.ndarray
    labels: np.ndarray
    hard: np.ndarray  # the inputs the asynchronous sender takes turns on
    rate: float  # the asynchronous sender's requests/s
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10.0,
                                                                     trust_env=False))


def fleet_config(name: str) -> Any:
    raw = yaml.safe_load(DEMO_FLEET.read_text())
    raw["name"] = name
    raw["control"] = {**raw.get("control", {}), "store": "etcd", "replicas": 2,
                      "etcd_members": 3}
    for node in raw["nodes"]:
        node["models"] = [m for m in node["models"] if m != PHOTO]
        node.pop("heads", None)
    return parse_fleet(raw, source=f"<{name}>")


# -- the processes' resources ------------------------------------------------------------------


class Sampler(threading.Thread):
    """Every few seconds, each live process's resident memory and open files, by
    incarnation (name, pid)."""

    def __init__(self, fleet: RunningFleet) -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self.fleet = fleet
        self.samples: dict[tuple[str, int], list[tuple[float, int, int]]] = {}
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.raft: list[tuple[float, int, int]] = []  # (when, raft index, db bytes)

    def processes(self) -> dict[str, int]:
        procs = {name: p.pid for name, p in self.fleet.procs.items() if p.poll() is None}
        if self.fleet.etcd is not None:
            procs |= {m.name: m.process.pid for m in self.fleet.etcd.members
                      if m.process is not None and m.running}
        return procs

    def etcd_summary(self) -> dict[str, Any]:
        """etcd's committed raft entries per second and its last database size (what its
        memory follows)."""
        if len(self.raft) < 2:
            return {}
        (t0, i0, _), (t1, i1, size) = self.raft[0], self.raft[-1]
        return {"raft_entries_per_s": round((i1 - i0) / (t1 - t0), 1),
                "db_size_mib": round(size / 2**20, 1)}

    def sample_etcd(self, now: float) -> None:
        if self.fleet.etcd is None:
            return
        for member in self.fleet.etcd.members:
            if not member.running:
                continue
            try:
                status = httpx.post(f"{member.client_url}/v3/maintenance/status", json={},
                                    timeout=1.0, trust_env=False).json()
                self.raft.append((now, int(status["raftIndex"]), int(status["dbSize"])))
                return
            except (httpx.HTTPError, KeyError, ValueError):
                continue

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_EVERY_S):
            now = time.monotonic() - self.started
            for name, pid in self.processes().items():
                found = read_usage(pid)
                if found is not None:
                    self.samples.setdefault((name, pid), []).append((now, *found))
            self.sample_etcd(now)


def read_usage(pid: int) -> tuple[int, int] | None:
    """(resident KiB, open files) of ``pid``; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        files = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = next((int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmRSS:")), 0)
    return rss, files


def growth(samples: list[tuple[float, int, int]], warmup_s: float) -> dict[str, Any]:
    """One incarnation's last minute over its first minute after ``warmup_s`` of its life."""
    born = samples[0][0]
    settled = [s for s in samples if s[0] - born >= warmup_s]
    life = samples[-1][0] - born
    out: dict[str, Any] = {"life_s": round(life, 1), "judged": life >= MIN_JUDGED_S}
    if len(settled) < 4:
        return out | {"judged": False}
    first = [s for s in settled if s[0] - settled[0][0] <= 60.0]
    last = [s for s in settled if samples[-1][0] - s[0] <= 60.0]
    for key, i in (("rss", 1), ("open_files", 2)):
        a, b = statistics.mean(s[i] for s in first), statistics.mean(s[i] for s in last)
        out[f"{key}_growth"] = round(b / a, 4) if a else None
    out["rss_mib_last"] = round(last[-1][1] / 1024, 1)
    out["open_files_last"] = last[-1][2]
    return out


# -- the events --------------------------------------------------------------------------------


class Chaos:
    """Draws and carries out one event at a time; ``events`` says what was done when."""

    def __init__(self, fleet: RunningFleet, rng: random.Random, started: float) -> None:
        from tierlink.netem.server import LinkControlClient

        self.fleet, self.rng, self.started = fleet, rng, started
        self.netem = LinkControlClient(fleet.links_url)
        self.events: list[dict[str, Any]] = []
        self.restores: list[tuple[float, str]] = []  # (when, link) cuts to undo

    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def one(self) -> None:
        kind = self.rng.choice(EVENTS)
        at = self.now()
        try:
            what = getattr(self, kind)()
        except Exception as exc:  # noqa: BLE001 -- an event that could not be done is reported
            what = {"failed": f"{type(exc).__name__}: {exc}"}
        self.events.append({"at_s": at, "event": kind, **what, "took_s": round(self.now() - at, 2)})
        print(f"[chaos] {at:7.1f} s {kind} {what}", file=sys.stderr, flush=True)

    def kill_node(self) -> dict[str, Any]:
        upstreams = [n.node_id for n in self.fleet.config.nodes if n.node_id not in ORIGINS]
        node = self.rng.choice(upstreams)
        self.fleet.kill(node)
        self.fleet.restart_node(node)
        return {"node": node}

    def cut_link(self) -> dict[str, Any]:
        link = self.rng.choice(sorted({link.name for link in self.fleet.config.links}))
        seconds = round(self.rng.uniform(5.0, 20.0), 1)
        self.netem.update(link, up=False)
        self.restores.append((time.monotonic() + seconds, link))
        return {"link": link, "for_s": seconds}

    def kill_control(self) -> dict[str, Any]:
        replica = self.rng.randrange(self.fleet.config.control_replicas)
        self.fleet.kill_control(replica)
        self.fleet.restart_control(replica=replica)
        return {"replica": replica}

    def kill_etcd(self) -> dict[str, Any]:
        assert self.fleet.etcd is not None
        index = self.rng.randrange(len(self.fleet.etcd.members))
        self.fleet.etcd.kill(index)
        self.fleet.etcd.restart(index)
        return {"member": index}

    def restore_due(self, final: bool = False) -> None:
        for due, link in list(self.restores):
            if final or time.monotonic() >= due:
                self.netem.update(link, up=True)
                self.restores.remove((due, link))
                self.events.append({"at_s": self.now(), "event": "restore_link", "link": link})


# -- the run -----------------------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from tierlink.zoo.cache import ensure_zoo
    from tierlink.zoo.datasets import fashion_mnist

    config = fleet_config("chaos")
    zoo = ensure_zoo(task="fmnist", profile=config.zoo_profile, progress=True)
    models = {n: (zoo.path(n), zoo.card_path(n)) for n in config.model_names()}
    test = fashion_mnist().test
    bench = Bench(test.input, test.labels, np.arange(len(test.labels)), args.async_rate)
    items = make_workload(int(args.rate * args.seconds), args.rate, list(ORIGINS),
                          len(test.labels), seed=args.seed)
    fleet = launch(config, models, work / "fleet")
    try:
        sampler = Sampler(fleet)
        sampler.start()
        load = Load(bench, items, fleet.node_urls)
        sender = AsyncSender(bench, fleet.node_urls, seconds=args.seconds)
        load.start()
        sender.start()
        chaos = Chaos(fleet, random.Random(args.seed), load.started)
        next_event = args.every
        while time.monotonic() < load.started + args.seconds:
            chaos.restore_due()
            if time.monotonic() >= load.started + next_event:
                chaos.one()
                next_event += args.every
            time.sleep(0.05)
        chaos.restore_due(final=True)
        records = load.finish(timeout_s=180.0)
        sender.join(60.0)
        stored = wait_stored(bench, fleet, {a["result_key"] for a in sender.accepted}, 120.0)
        sampler.stop.set()
        sampler.join(10.0)
    finally:
        fleet.stop()
    return report(args, records, sender, stored, sampler, chaos.events)


def wait_stored(bench: Bench, fleet: RunningFleet, want: set[str],
                timeout_s: float) -> dict[str, int]:
    """Each stored result key and how many times it was stored, once every one of ``want``
    is there (or after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = stored_key_counts(bench.http, fleet)
        if want <= set(counts) or time.monotonic() > deadline:
            return dict(counts)
        time.sleep(0.5)


def report(args: argparse.Namespace, records: list[Record], sender: AsyncSender,
           stored: dict[str, int], sampler: Sampler,
           events: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [a["result_key"] for a in sender.accepted]
    delivered = set(stored)
    seqs = [r.item.seq for r in records]
    errors: dict[str, int] = {}
    for r in records:
        if not r.answered:
            errors[r.error or "none"] = errors.get(r.error or "none", 0) + 1
    known = set(_codes())
    unexplained = sum(n for code, n in errors.items() if code not in known or code == "internal")
    incarnations = {f"{name}:{pid}": growth(samples, args.warmup)
                    for (name, pid), samples in sampler.samples.items() if samples}
    worst = worst_growth(incarnations)
    by_kind = {kind: worst_growth({k: v for k, v in incarnations.items()
                                   if k.startswith("etcd") == (kind == "etcd")})
               for kind in ("tierlink", "etcd")}
    sla = sla_by_priority(records)
    out = {"lost": sum(r.lost for r in records) + len(set(keys) - delivered),
           "lost_sync": sum(r.lost for r in records),
           "lost_async": len(set(keys) - delivered),
           # a result stored twice, or a request answered twice by the load
           "duplicated": sum(n - 1 for n in stored.values()) + len(seqs) - len(set(seqs)),
           "async": {"accepted": len(keys), "delivered": len(delivered & set(keys)),
                     "not_accepted": sender.refused},
           "requests": len(records), "sla_by_priority": sla, "errors": errors,
           "unexplained_errors": unexplained, "rss_growth": worst["rss"],
           "open_files_growth": worst["open_files"], "growth_by_kind": by_kind,
           "realtime_misses": misses_by_cause(records, events),
           "etcd": sampler.etcd_summary(),
           "incarnations": incarnations,
           "events": events}
    out["met"] = {"lost": out["lost"] == BOUNDS["lost"],
                  "duplicated": out["duplicated"] == BOUNDS["duplicated"],
                  "realtime_sla": sla.get("realtime", 0.0) >= BOUNDS["realtime_sla"],
                  "unexplained_errors": unexplained == BOUNDS["unexplained_errors"],
                  "growth": all(g is not None and g <= BOUNDS["growth"]
                                for g in worst.values())}
    out["bounds"] = BOUNDS
    out["settings"] = {k: v for k, v in vars(args).items() if k != "json"}
    return out


def misses_by_cause(records: list[Record], events: list[dict[str, Any]],
                    within_s: float = 30.0) -> dict[str, Any]:
    """The realtime requests that missed their deadline, by the last event before them
    (``kind target``, or ``none`` after ``within_s`` quiet seconds), by where they were
    answered and by whether a fallback carried them."""
    marks = sorted((e["at_s"], f"{e['event']} {_target(e)}")
                   for e in events if e["event"] != "restore_link")
    by_event: dict[str, int] = {}
    by_place: dict[str, int] = {}
    fallbacks = refused = 0
    examples: list[dict[str, Any]] = []
    for r in records:
        if r.item.priority != Priority.REALTIME or (r.answered
                                                    and r.latency_ms <= r.item.deadline_ms):
            continue
        before = [name for at, name in marks if at <= r.item.at_s < at + within_s]
        key = before[-1] if before else "none"
        by_event[key] = by_event.get(key, 0) + 1
        place = f"{r.item.origin}->{r.served_by or r.error or 'nothing'}"
        by_place[place] = by_place.get(place, 0) + 1
        fallbacks += r.fallbacks > 0
        refused += not r.answered
        if len(examples) < 20:
            examples.append({"at_s": round(r.item.at_s, 2), "origin": r.item.origin,
                             "served_by": r.served_by, "error": r.error,
                             "latency_ms": round(r.latency_ms, 1), "fallbacks": r.fallbacks,
                             "escalations": r.escalations, "event": key,
                             "timings": dict(r.timings)})
    return {"by_event": dict(sorted(by_event.items(), key=lambda kv: -kv[1])),
            "by_place": dict(sorted(by_place.items(), key=lambda kv: -kv[1])),
            "with_fallback": fallbacks, "refused": refused, "examples": examples}


def _target(event: dict[str, Any]) -> str:
    """What an event acted on: a node, a link, an etcd member or a control replica."""
    return str(next((event[k] for k in ("node", "link", "member", "replica") if k in event), ""))


def worst_growth(incarnations: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """The largest growth of resident memory and of open files over the judged
    incarnations (tierlink's processes and etcd's members are also reported apart: etcd's
    memory follows its keyspace and raft log until it snapshots)."""
    judged = [v for v in incarnations.values() if v.get("judged")]
    return {k: max((v[f"{k}_growth"] for v in judged if v.get(f"{k}_growth")), default=None)
            for k in ("rss", "open_files")}


def sla_by_priority(records: list[Record]) -> dict[str, float]:
    out = {}
    for priority in Priority:
        mine = [r for r in records if r.item.priority == priority]
        if mine:
            met = sum(r.answered and r.latency_ms <= r.item.deadline_ms for r in mine)
            out[priority.label] = round(met / len(mine), 4)
    return out


def _codes() -> list[str]:
    """Every code of the error tree (an error answer with one of them is explicit)."""
    found, todo = [], [TierlinkError]
    while todo:
        cls = todo.pop()
        found.append(cls.code)
        todo.extend(cls.__subclasses__())
    return found


def print_table(result: dict[str, Any]) -> None:
    print(f"requests {result['requests']}, lost {result['lost']} (sync {result['lost_sync']}, "
          f"async {result['lost_async']}), duplicated {result['duplicated']}")
    print(f"SLA by priority: {result['sla_by_priority']}")
    print(f"errors: {result['errors']} (unexplained {result['unexplained_errors']})")
    print(f"async: {result['async']}")
    print(f"growth (worst incarnation judged): rss x{result['rss_growth']}, open files "
          f"x{result['open_files_growth']}; by kind {result['growth_by_kind']}")
    print(f"realtime misses: {result['realtime_misses']}")
    print(f"etcd: {result['etcd']}")
    print(f"events: {len(result['events'])}: "
          + ", ".join(f"{e['at_s']:.0f}s {e['event']}" for e in result["events"]))
    print("met: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in result["met"].items()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--rate", type=float, default=50.0, help="synchronous requests/s")
    parser.add_argument("--async-rate", type=float, default=2.0,
                        help="asynchronous requests/s (dev-1 and dev-2 in turn)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between events")
    parser.add_argument("--warmup", type=float, default=30.0,
                        help="seconds of a process's life before its first judged minute")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tierlink-chaos-") as tmp:
        result = run(args, Path(tmp))
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
