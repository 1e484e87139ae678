"""One simulation: a fleet file and a workload, run once per policy (each on a fresh fleet
and a fresh simulated clock, so the runs see the same requests and the same conditions),
reported in the demo's schema (``fleet/workload.summarize``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tierlink.core.types import ModelView
from tierlink.fleet.config import FleetConfig
from tierlink.fleet.workload import PrivacyTally, Record, Tally, WorkItem, summarize
from tierlink.policy.ope import Logged
from tierlink.policy.placement import TierlinkPolicy
from tierlink.sim import loop
from tierlink.sim.build import Scenario, build
from tierlink.sim.fleet import drive
from tierlink.sim.http import HttpCosts
from tierlink.sim.node import SimNode
from tierlink.sim.outcomes import Outcomes

# The demo's runs: (name, the policy a request names; None = the fleet's own).
RUNS = (("tierlink", None), ("static_rules", "static_rules"), ("cloud_only", "cloud_only"),
        ("device_only", "device_only"))


@dataclass(frozen=True, slots=True)
class RunResult:
    records: list[Record]
    summary: dict[str, Any]
    counters: dict[str, Any]
    simulated_s: float
    wall_s: float
    shadow_log: list[Logged]  # decisions logged in shadow mode (empty without it)


def run_once(config: FleetConfig, views: Mapping[str, ModelView], outcomes: Outcomes,
             items: Sequence[WorkItem], policy: str | None, seed: int,
             scenario: Scenario | None = None,
             on_done: Callable[[Record], None] = lambda r: None,
             also: Mapping[str, Outcomes] | None = None,
             keep_records: bool = True) -> RunResult:
    """One run of ``items`` (requests of ``outcomes.task``) on a fresh fleet; ``also``:
    the answers of the fleet's other tasks (their models are on the nodes, idle).
    ``keep_records=False``: the summary is added up as requests are answered and the result
    holds no records (a run of millions of requests in the memory of its fleet)."""
    wall = time.perf_counter()
    tally = Tally()

    def added(record: Record) -> None:
        tally.add(record)
        on_done(record)

    done = on_done if keep_records else added  # kept records are summed once, at the end

    async def main() -> tuple[list[Record], Any, float, dict[str, Any]]:
        import asyncio

        clock = asyncio.get_running_loop().time
        fleet, counters = build(config, views, {**(also or {}), outcomes.task: outcomes},
                                clock, seed, scenario)
        timeline: list[dict[str, float]] = []
        sampler = _battery_timeline(fleet.nodes.values(), clock, items, timeline)
        try:
            records = await drive(fleet, items, outcomes.task, outcomes.labels.tolist(),
                                  outcomes.input_bytes, policy, done, keep=keep_records)
        finally:
            if sampler is not None:
                sampler.cancel()
        power = power_summary(fleet.nodes.values(), clock())
        if power and timeline:
            power["timeline"] = timeline
        return records, counters, clock(), {
            **({"power": power} if power else {}),
            "plan_cache": plan_cache_summary(fleet.nodes.values()),
            "peak_queue": {n.node_id: n.scheduler.peak_queue for n in fleet.nodes.values()
                           if n.scheduler.peak_queue}}

    records, counters, simulated, extra = loop.run(main)
    privacy = PrivacyTally(counters.violations, counters.refusals)
    # Kept records are summed in their items' order (as the demo sums its own).
    return RunResult(records, summarize(records, privacy) if keep_records
                     else tally.summary(privacy),
                     {"escalated": counters.escalated, "fallbacks": counters.fallbacks,
                      "retried": counters.retried, "hedged": counters.hedged, **extra},
                     simulated, time.perf_counter() - wall, counters.shadow_log)


@dataclass(frozen=True, slots=True)
class Spread:
    """Where independent runs go: ``workers`` local processes, or the Ray cluster at
    ``ray_address`` (one task per run); one process, in order, by default."""

    workers: int = 1
    ray_address: str | None = None


Job = tuple[FleetConfig, Mapping[str, ModelView], Outcomes, Sequence[WorkItem], str | None,
            int, Scenario | None]


def run_spread(jobs: Mapping[str, Job], spread: Spread,
               on_done: Callable[[str, Record], None] = lambda _n, _r: None,
               also: Mapping[str, Outcomes] | None = None) -> dict[str, RunResult]:
    """``run_once`` of every job, by name. Runs in this process report each record as it
    is answered; runs elsewhere report theirs when the run is back."""
    if spread.ray_address is None and spread.workers <= 1:
        return {name: run_once(*job, on_done=functools.partial(on_done, name), also=also)
                for name, job in jobs.items()}
    if spread.ray_address is not None:
        results = _on_ray(jobs, spread.ray_address, also)
    else:
        results = _on_processes(jobs, spread.workers, also)
    for name, result in results.items():
        for record in result.records:
            on_done(name, record)
    return results


def _on_processes(jobs: Mapping[str, Job], workers: int,
                  also: Mapping[str, Outcomes] | None) -> dict[str, RunResult]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # forkserver: a clean interpreter per worker (no copy of this process's threads)
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        futures = {name: pool.submit(run_once, *job, also=also) for name, job in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def _on_ray(jobs: Mapping[str, Job], address: str,
            also: Mapping[str, Outcomes] | None) -> dict[str, RunResult]:
    import ray

    from tierlink.errors import ConfigError

    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"cannot join the Ray cluster at {address}: {exc}",
                          hint="start one with `ray start --head` and give its address"
                          ) from exc
    remote: Any = ray.remote(num_cpus=1)(run_once)
    refs = {name: remote.remote(*job, also=also) for name, job in jobs.items()}
    return {name: ray.get(ref) for name, ref in refs.items()}


def plan_cache_summary(nodes: Iterable[SimNode]) -> dict[str, Any]:
    """How often the nodes' policies found a decision's second half in their plan cache
    (``policy/plan_cache.py``)."""
    caches = [p.cache for n in nodes for p in n.desk.made() if isinstance(p, TierlinkPolicy)]
    hits, misses = sum(c.hits for c in caches), sum(c.misses for c in caches)
    return {"hits": hits, "misses": misses, "aside": sum(c.aside for c in caches),
            "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None}


TIMELINE_POINTS = 200  # samples of the devices' batteries over a run


def _battery_timeline(nodes: Iterable[SimNode], clock: Callable[[], float],
                      items: Sequence[WorkItem], out: list[dict[str, float]]) -> Any:
    """A task sampling the batteries' mean charge and the devices still up, about
    ``TIMELINE_POINTS`` times over the run's arrivals (None when no device has one)."""
    import asyncio

    powered = [n.power for n in nodes if n.power is not None and n.power.power.battery]
    if not powered or not items:
        return None
    every = max(items[-1].at_s / TIMELINE_POINTS, 1e-3)

    async def sample() -> None:
        while True:
            now = clock()
            charges = [p.charge_at(now) for p in powered]
            out.append({"t_s": round(now, 3),
                        "mean_charge": round(sum(charges) / len(charges), 4),
                        "min_charge": round(min(charges), 4),
                        "up": sum(not p.empty for p in powered)})
            await asyncio.sleep(every)

    return asyncio.get_running_loop().create_task(sample())


def power_summary(nodes: Iterable[SimNode], now: float) -> dict[str, Any]:
    """What the devices' batteries and heat did by ``now`` (empty without them)."""
    states = {n.node_id: n.power for n in nodes if n.power is not None}
    for state in states.values():
        state.advance(now)
    if not states:
        return {}
    charges = [s.charge_at(now) for s in states.values() if s.power.battery is not None]
    return {"devices": len(states),
            "energy_j": round(sum(s.energy_j for s in states.values()), 3),
            "throttled_s": round(sum(s.throttled_s for s in states.values()), 3),
            "peak_heat": round(max(s.peak_heat for s in states.values()), 4),
            "empty": sorted(n for n, s in states.items() if s.empty),
            # battery life: when the first device went flat (None: none did)
            "first_empty_s": min((s.empty_at for s in states.values()
                                  if s.empty_at is not None), default=None),
            "mean_charge_share": round(sum(charges) / len(charges), 4) if charges else 1.0,
            "min_charge_share": round(min(charges, default=1.0), 4)}


def simulate(config: FleetConfig, views: Mapping[str, ModelView], outcomes: Outcomes,
             items: Sequence[WorkItem], seed: int, runs: Sequence[tuple[str, str | None]] = RUNS,
             scenario: Scenario | None = None, bins: int = 30,
             on_done: Callable[[str, Record], None] = lambda _n, _r: None,
             http_by_run: Mapping[str, HttpCosts] | None = None,
             also: Mapping[str, Outcomes] | None = None, spread: Spread | None = None
             ) -> tuple[dict[str, Any], dict[str, list[Record]]]:
    """Every run of ``runs`` over the same items: the report (``runs`` as the demo's, the
    simulator's own counters and speed under ``sim``, per-window ``series``) and each
    run's records. ``http_by_run``: HTTP costs of a run's own (measured for its policy),
    instead of the scenario's. ``spread``: the runs side by side on local processes or a
    Ray cluster (each is independent: a fleet of its own from the same seed)."""
    from tierlink.fleet.breakdown import breakdown
    from tierlink.sim.plots import series

    report: dict[str, Any] = {"fleet": config.name, "requests": len(items), "seed": seed,
                              "runs": {}, "sim": {}, "series": {}}
    records: dict[str, list[Record]] = {}
    jobs = {}
    for name, policy in runs:
        own = (http_by_run or {}).get(name)
        sc = scenario if own is None else replace(scenario or Scenario(), http=own)
        jobs[name] = (config, views, outcomes, items, policy, seed, sc)
    results = run_spread(jobs, spread or Spread(), on_done, also)
    for name, _policy in runs:
        result = results[name]
        records[name] = result.records
        report["runs"][name] = result.summary | breakdown(result.records, config, None)
        report["sim"][name] = {**result.counters, "simulated_s": round(result.simulated_s, 3),
                               "wall_s": round(result.wall_s, 3),
                               "requests_per_wall_s": round(len(items) / result.wall_s, 1)}
        report["series"][name] = series(result.records, bins)
    return report, records
