"""Learned scheduling under shifting conditions, in the simulator: the ``bandit`` policy
against the built-in ``tierlink`` policy and the fixed baselines, on the demo's fleet.

Twenty simulated minutes of Poisson requests in the demo's mix; conditions shift every five:
0-300 s calm; 300-600 s the links from the devices to ``edge-1`` degrade (delay x8);
600-900 s ``edge-2`` computes 20x slower; 900-1200 s the load triples. Every run sees the
same requests and the same shifts; each request's reward is scored alike for every run
(``routing.bandit.reward``: correct answer, latency over the deadline, a missed deadline,
cost over the fleet's dearest answer). Reports the mean reward per minute of each run, the
best fixed policy in hindsight (the baselines, which never learn), and the bandit's
cumulative regret against it and against ``tierlink``.

Off-policy evaluation, checked where the truth is known: ``tierlink`` acts and explores 10%
of the time while a candidate (``tierlink`` weighing accuracy more: latency 0.2, cost 0.5)
decides in shadow mode on the devices; IPS and doubly robust estimate the candidate's reward
per request from that log, and the candidate then acts alone over the same requests for its
true value (``ope``: estimate, 95% interval, true value, whether promotion would go ahead)::

When the estimates are wrong (``drift``): the edges' model has gone bad in production (a new
input pipeline, say) — it answers a wrong class on a third of the inputs, as sure of itself
as before — while its card still claims its test accuracy. ``tierlink`` trusts the card;
the bandit learns from the rewards (requests carry labels). Same runs, no other shift.
``misestimate``: the edges' card overstates its model's accuracy by 5 points *and* the model
answers a wrong class on a fifth of the inputs; the bandit must beat ``tierlink`` by more
than the seed-to-seed spread and come within 0.005 of the best fixed policy (``met``)::

    .venv/bin/python benchmarks/bandit.py [--rate 25] [--seeds 3] [--json PATH] [--png PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "src/tierlink/demo/fleets/fleet.yaml"
RUNS = (("bandit", "bandit"), ("tierlink", None), ("static_rules", "static_rules"),
        ("cloud_only", "cloud_only"), ("device_only", "device_only"))
FIXED = ("static_rules", "cloud_only", "device_only")
SHIFTS = {"link_slow": {"dev-1->edge-1": [[300, 600, 8.0]], "dev-2->edge-1": [[300, 600, 8.0]],
                        "dev-3->edge-1": [[300, 600, 8.0]], "dev-4->edge-1": [[300, 600, 8.0]]},
          "slow": {"edge-2": [[600, 900, 20.0]]}}
DURATION_S, WINDOW_S = 1200.0, 60.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=25.0)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--png", type=Path)
    return p.parse_args(argv)


def setup() -> tuple[Any, Any, Any]:
    from tierlink.fleet.config import load_fleet
    from tierlink.fleet.tuning import fresh_thresholds
    from tierlink.models.catalog import Catalog, SourceOptions
    from tierlink.models.runtime import ModelInfo
    from tierlink.sim.outcomes import model_outcomes

    config = load_fleet(FLEET)
    names = tuple(m for m in config.model_names() if m.startswith("fmnist-"))
    catalog = Catalog.default(SourceOptions(profile=config.zoo_profile, progress=False))
    models = catalog.paths(names)
    config, _ = fresh_thresholds(config, models, "fmnist", lambda m: print(m, file=sys.stderr))
    views = {n: ModelInfo.from_card(models[n][1]).view() for n in names}
    return config, views, model_outcomes("fmnist", names)


def reference_cost(config: Any, views: Any, input_bytes: int) -> float:
    """The fleet's dearest answer (compute at the costliest node plus moving the input
    there): the cost term's unit, as the policies use it."""
    cost = config.routing.cost
    return max(cost.compute(n.tier, views[m].latency_ms) + cost.transfer(n.tier, input_bytes)
               for n in config.nodes for m in n.models if m in views)


def rewards(records: list[Any], weights: Any, ref: float) -> np.ndarray:
    out = np.empty(len(records))
    for i, r in enumerate(records):
        if r.answered:
            out[i] = weights.reward(float(r.correct), r.latency_ms, r.item.deadline_ms, r.cost,
                                    ref, left_device=r.served_by != r.item.origin)
        else:
            out[i] = weights.reward(0.0, 2 * r.item.deadline_ms, r.item.deadline_ms, 0.0, ref)
    return out


def per_window(records: list[Any], values: np.ndarray) -> list[float]:
    bins = int(DURATION_S / WINDOW_S)
    sums, counts = np.zeros(bins), np.zeros(bins)
    for r, v in zip(records, values, strict=True):
        k = min(int(r.item.at_s // WINDOW_S), bins - 1)
        sums[k] += v
        counts[k] += 1
    return [round(float(s / c), 5) if c else 0.0 for s, c in zip(sums, counts, strict=True)]


def drifted(outcomes: Any, edge: str = "fmnist-medium", share: float = 1 / 3,
            seed: int = 0) -> Any:
    """``outcomes`` where the edge model answers a wrong class on ``share`` of the inputs,
    as sure of itself as before (a model gone bad is wrong with confidence)."""
    from dataclasses import replace

    from tierlink.sim.outcomes import Answers

    was = outcomes.models[edge]
    broken = np.random.default_rng(seed).random(was.pred.shape[0]) < share
    pred = np.where(broken, (outcomes.labels + 1) % 10, was.pred).astype(was.pred.dtype)
    return replace(outcomes, models={**outcomes.models, edge: Answers(pred, was.confidence)})


OVERSTATED_BY, DEGRADED_SHARE = 0.05, 0.2


def misestimated(views: Any, outcomes: Any, model: str = "fmnist-medium") -> tuple[Any, Any]:
    """The edges' card overstates their model's accuracy by :data:`OVERSTATED_BY`, and the
    model's answers have silently degraded: a wrong class on :data:`DEGRADED_SHARE` of the
    inputs, as sure of itself as before."""
    from dataclasses import replace

    card = views[model]
    views = {**views, model: replace(card, accuracy=min(1.0, card.accuracy + OVERSTATED_BY))}
    return views, drifted(outcomes, model, DEGRADED_SHARE, seed=1)


def misestimate_check(config: Any, views: Any, outcomes: Any, rate: float, seeds: int
                      ) -> dict[str, Any]:
    """The bandit against ``tierlink`` and the best fixed policy when a card lies."""
    wrong_views, wrong = misestimated(views, outcomes)
    runs = [one_seed(config, wrong_views, wrong, rate, 21 + s, shifts=False)
            for s in range(seeds)]
    out = over_seeds(runs)
    by_seed = out["mean_reward_by_seed"]
    ahead = [b - t for b, t in zip(by_seed["bandit"], by_seed["tierlink"], strict=True)]
    mean = out["mean_reward"]
    # the seed-to-seed spread of the two figures compared (max - min over the seeds)
    spread = round(max(max(by_seed[n]) - min(by_seed[n]) for n in ("bandit", "tierlink")), 5)
    best = mean[out["best_fixed"]]
    return {"edge_model": f"fmnist-medium: card +{OVERSTATED_BY:.2f} accuracy, a wrong class "
                          f"on {DEGRADED_SHARE:.0%} of the inputs", **out,
            "bandit": mean["bandit"], "tierlink": mean["tierlink"], "best_fixed": best,
            "best_fixed_policy": out["best_fixed"], "seed_spread": spread,
            "bandit_ahead_of_tierlink_by_seed": [round(a, 5) for a in ahead],
            "met": mean["bandit"] - mean["tierlink"] > spread
            and best - mean["bandit"] <= 0.005}


def drift_check(config: Any, views: Any, outcomes: Any, rate: float, seeds: int
                ) -> dict[str, Any]:
    runs = [one_seed(config, views, drifted(outcomes), rate, 11 + s, shifts=False)
            for s in range(seeds)]
    return {"edge_model": "fmnist-medium answers a wrong class on 1/3 of the inputs "
                          "(card unchanged)", **over_seeds(runs)}


def over_seeds(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each run's mean reward over the seeds, per minute, the best fixed policy in
    hindsight and the bandit's cumulative regret against it and against ``tierlink``."""
    names = [n for n, _ in RUNS]
    mean = {n: float(np.mean([s["mean_reward"][n] for s in seeds])) for n in names}
    minutes = {n: np.mean([s["per_minute"][n] for s in seeds], axis=0) for n in names}
    best_fixed = max(FIXED, key=lambda n: mean[n])
    return {"mean_reward": {n: round(v, 5) for n, v in mean.items()},
            "mean_reward_by_seed": {n: [s["mean_reward"][n] for s in seeds] for n in names},
            "per_minute": {n: [round(float(x), 5) for x in v] for n, v in minutes.items()},
            "best_fixed": best_fixed,
            "regret_vs_best_fixed": _cumulative(minutes[best_fixed] - minutes["bandit"]),
            "regret_vs_tierlink": _cumulative(minutes["tierlink"] - minutes["bandit"]),
            "runs_seed0": seeds[0]["runs"]}


def one_seed(config: Any, views: Any, outcomes: Any, rate: float, seed: int,
             shifts: bool = True) -> dict[str, Any]:
    from tierlink.sim.run import simulate
    from tierlink.sim.scenario import parse_scenario
    from tierlink.sim.workload import Arrivals, Burst, workload

    devices = [n.node_id for n in config.nodes if n.tier.label == "device"]
    arrivals = Arrivals("poisson", rate, bursts=(Burst(900.0, 1200.0, 3.0),) if shifts else ())
    items = workload(arrivals, DURATION_S, devices, outcomes.size, seed)
    scenario = parse_scenario(SHIFTS if shifts else {}).scenario
    report, records = simulate(config, views, outcomes, items, seed, RUNS, scenario)
    weights = config.routing.policy_config().reward
    ref = reference_cost(config, views, outcomes.input_bytes)
    per_request = {name: rewards(records[name], weights, ref) for name, _ in RUNS}
    return {"requests": len(items),
            "mean_reward": {n: round(float(v.mean()), 5) for n, v in per_request.items()},
            "per_minute": {n: per_window(records[n], v) for n, v in per_request.items()},
            "runs": {n: {k: report["runs"][n][k] for k in ("accuracy", "p50_ms", "p95_ms",
                                                           "sla_attainment", "tier_share")}
                     for n, _ in RUNS}}


CANDIDATE = {"accuracy": 1.0, "latency": 0.2, "cost": 0.5}
EXPLORE = 0.1


def ope_check(config: Any, views: Any, outcomes: Any, rate: float, seed: int
              ) -> dict[str, Any]:
    """The candidate's value estimated from tierlink's shadow log, and its true value."""
    from dataclasses import replace

    from tierlink.policy.base import Weights
    from tierlink.policy.ope import doubly_robust, ips, on_policy, promote
    from tierlink.sim.build import Scenario
    from tierlink.sim.run import run_once
    from tierlink.sim.scenario import parse_scenario
    from tierlink.sim.workload import Arrivals, Burst, workload

    devices = [n.node_id for n in config.nodes if n.tier.label == "device"]
    items = workload(Arrivals("poisson", rate, bursts=(Burst(900.0, 1200.0, 3.0),)),
                     DURATION_S, devices, outcomes.size, seed)
    base: Scenario = parse_scenario(SHIFTS).scenario
    weights = Weights(**CANDIDATE)
    logged = run_once(config, views, outcomes, items, None, seed,
                      replace(base, shadow="tierlink", shadow_weights=weights,
                              explore=EXPLORE)).shadow_log
    as_acting = replace(config, routing=replace(config.routing, weights=weights))
    truth = run_once(as_acting, views, outcomes, items, None, seed,
                     replace(base, shadow="tierlink", shadow_weights=weights,
                             explore=0.0)).shadow_log
    dr, by_ips, acting = doubly_robust(logged), ips(logged), on_policy(logged)
    true_value = on_policy(truth).value
    return {"candidate_weights": CANDIDATE, "explore": EXPLORE, "decisions": len(logged),
            **dr.to_dict(), "true_value": round(true_value, 6),
            "inside_ci": dr.ci_low <= true_value <= dr.ci_high,
            "ips": {**by_ips.to_dict(), "inside_ci": by_ips.ci_low <= true_value
                    <= by_ips.ci_high},
            "acting_value": acting.to_dict(), "promote": promote(dr, acting),
            "agreement": round(sum(e.acting == e.candidate for e in logged) / len(logged), 4)}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config, views, outcomes = setup()
    seeds = [one_seed(config, views, outcomes, args.rate, 11 + s) for s in range(args.seeds)]
    names = [n for n, _ in RUNS]
    result = {
        "scenario": {"duration_s": DURATION_S, "rate_per_s": args.rate, "shifts": SHIFTS,
                     "burst": [900, 1200, 3.0], "seeds": args.seeds},
        "reward_weights": asdict(config.routing.policy_config().reward),
        **over_seeds(seeds),
        "ope": ope_check(config, views, outcomes, args.rate, 11),
        "drift": drift_check(config, views, outcomes, args.rate, args.seeds),
        "misestimate": misestimate_check(config, views, outcomes, args.rate, args.seeds),
    }
    print(f"mean reward per request over {args.seeds} seeds "
          f"({seeds[0]['requests']} requests a run):")
    mean, best_fixed = result["mean_reward"], result["best_fixed"]
    for n in names:
        print(f"  {n:<13} {mean[n]:+.4f}  by seed {result['mean_reward_by_seed'][n]}")
    print(f"best fixed policy in hindsight: {best_fixed}; bandit's regret per request vs it "
          f"{mean[best_fixed] - mean['bandit']:+.4f}, vs tierlink "
          f"{mean['tierlink'] - mean['bandit']:+.4f}")
    o = result["ope"]
    print(f"off-policy: candidate {o['estimate']:+.4f} [{o['ci_low']:+.4f}, "
          f"{o['ci_high']:+.4f}] (IPS {o['ips']['estimate']:+.4f}), true "
          f"{o['true_value']:+.4f}: {'inside' if o['inside_ci'] else 'OUTSIDE'} the interval; "
          f"acting {o['acting_value']['estimate']:+.4f}; promote: {o['promote']}")
    d = result["drift"]
    print("when the edges' model has gone bad (its card unchanged), mean reward per request:")
    for n in names:
        print(f"  {n:<13} {d['mean_reward'][n]:+.4f}  by seed {d['mean_reward_by_seed'][n]}")
    print(f"  bandit vs tierlink {d['mean_reward']['bandit'] - d['mean_reward']['tierlink']:+.4f}"
          f", vs the best fixed ({d['best_fixed']}) "
          f"{d['mean_reward']['bandit'] - d['mean_reward'][d['best_fixed']]:+.4f}")
    m = result["misestimate"]
    print(f"when a card lies ({m['edge_model']}), mean reward per request: bandit "
          f"{m['bandit']:+.4f}, tierlink {m['tierlink']:+.4f}, best fixed "
          f"({m['best_fixed_policy']}) {m['best_fixed']:+.4f}; bandit ahead of tierlink by "
          f"{m['bandit'] - m['tierlink']:+.4f} (seed spread {m['seed_spread']:.4f}), "
          f"{m['best_fixed'] - m['bandit']:+.4f} behind the best fixed (bound 0.005): "
          f"{'met' if m['met'] else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.png:
        plot(result, args.png)


def _cumulative(diff: np.ndarray) -> list[float]:
    """Per-request regret accumulated over the minutes (each minute's mean difference)."""
    return [round(float(x), 4) for x in np.cumsum(diff)]


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom, lies) = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
    t = np.arange(len(result["per_minute"]["bandit"])) + 0.5
    for name, values in result["per_minute"].items():
        top.plot(t, values, label=name)
    for start in (5, 10, 15):
        top.axvline(start, color="grey", lw=0.8, ls="--")
    top.set_ylabel("mean reward per request")
    top.legend(fontsize=8)
    bottom.plot(t, result["regret_vs_best_fixed"], label=f"vs {result['best_fixed']}")
    bottom.plot(t, result["regret_vs_tierlink"], label="vs tierlink")
    bottom.axhline(0, color="grey", lw=0.8)
    bottom.set_ylabel("bandit's cumulative regret")
    bottom.legend(fontsize=8)
    m = result["misestimate"]
    lies.plot(t, m["regret_vs_best_fixed"], label=f"vs {m['best_fixed_policy']}")
    lies.plot(t, m["regret_vs_tierlink"], label="vs tierlink")
    lies.axhline(0, color="grey", lw=0.8)
    lies.set_ylabel("regret when a card lies")
    lies.set_xlabel("simulated minute (shifts at 5, 10, 15 in the top two)")
    lies.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
