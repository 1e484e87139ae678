"""``tierlink sim``: a fleet file and a workload on simulated time, each run side by side as
the demo reports it (the same policies, dispatcher, scheduler and estimators the nodes run;
models answer from their recorded answers on the test split)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tierlink.core.progress import Phase, Reporter, as_reporter
from tierlink.errors import ConfigError
from tierlink.fleet.config import FleetConfig, load_fleet

console = Console(stderr=True)
TASK = "fmnist"


def run_sim(fleet_file: Path, *, scenario_file: Path | None, requests: int | None,
            rate: float, arrivals: str | None, duration_s: float | None, seed: int | None,
            runs: str, json_path: Path | None, png_path: Path | None,
            scale: str | None = None, progress: bool | Reporter = True,
            replay: Path | None = None,
            replay_run: str | None = None, http_from: Path | None = None,
            http_warm_up: bool = False, photos: bool = True, workers: int = 1,
            ray_address: str | None = None) -> dict[str, Any]:
    """``progress``: where its phases show (models built, thresholds tuned, each run)."""
    from tierlink.sim.outcomes import model_outcomes
    from tierlink.sim.run import Spread, simulate

    reporter = as_reporter(progress)
    config = load_fleet(fleet_file)
    if scale:
        config = _scaled(config, scale)
    chosen = _runs(runs, config)
    config, tuning, views = _models(config, reporter)
    outcomes = model_outcomes(TASK, list(views), config.zoo_profile, progress=reporter)
    sc = _scenario(scenario_file)
    http_by_run: dict[str, Any] = {}
    http_source: dict[str, Any] = {"from": "the scenario" if sc.http_given else "none"}
    if http_from is not None:
        http_source = {"from": f"the request log {http_from}"}
        sc, http_by_run = _measured_http(sc, http_from, config, outcomes.input_bytes,
                                         http_warm_up)
    sc, defaults = _measured_defaults(sc, http=http_from is None and not sc.http_given)
    if defaults is not None:
        http_by_run, http_source = defaults
    seed = config.seed if seed is None else seed
    if replay is not None:
        items = _replayed(replay, replay_run, config, outcomes.size)
    else:
        items = _items(config, sc, outcomes.size, requests, rate, arrivals, duration_s, seed)
    demo_workload = not (replay or scale or arrivals or duration_s or sc.arrivals
                         or sc.duration_s)
    phase = _photo_phase(config, seed, reporter) if photos and demo_workload else None
    also = {phase[0].task: phase[0]} if phase else {}
    all_views = {**views, **(phase[1] if phase else {})}
    spread = Spread(workers, ray_address)
    with _per_run(reporter, len(items), spread) as done:
        report, records = simulate(config, all_views, outcomes, items, seed, chosen,
                                   sc.scenario, on_done=done, http_by_run=http_by_run,
                                   also=also, spread=spread)
    if phase is not None:
        _simulate_photos(report, phase, config, all_views, outcomes, seed, chosen,
                         sc.scenario, http_by_run, reporter)
    report["tuning"] = tuning
    report["models"] = sorted(views)
    report["http"] = {**sc.scenario.http.summary(), "source": http_source,
                      "compute_overhead_ms": sc.scenario.compute_overhead_ms}
    if http_by_run:
        report["http"]["by_run"] = {name: http_by_run[name].summary()
                                    for name, _ in chosen if name in http_by_run}
    if replay is not None:
        report["replay"] = str(replay)
    left_out = [m for m in config.model_names() if m not in all_views]
    if left_out:
        report["left_out"] = {"models": left_out,
                              "why": "the simulator answers tasks it holds recorded answers "
                                     f"for ({TASK}); these serve other tasks"}
    _print(report)
    if json_path:
        json_path.write_text(json.dumps(report, indent=2))
        console.print(f"report written to {json_path}")
    if png_path:
        from tierlink.sim.plots import plot

        plot(records, png_path, batteries={
            name: run["power"]["timeline"] for name, run in report.get("sim", {}).items()
            if run.get("power", {}).get("timeline")})
        console.print(f"plot written to {png_path}")
    return report


def _scaled(config: FleetConfig, text: str) -> FleetConfig:
    """``DEVICESxEDGESxCLOUDS``: the file's fleet replicated to that size."""
    from tierlink.sim.generate import generate

    try:
        devices, edges, clouds = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--scale takes DEVICESxEDGESxCLOUDS, e.g. 10000x200x10, "
                          f"got {text!r}") from None
    return generate(config, devices, edges, clouds)


def _runs(text: str, config: FleetConfig) -> list[tuple[str, str | None]]:
    """The runs ``text`` names: the demo's (``tierlink``, the baselines), ``bandit``, or any
    registered policy (a third party's too), each as (name, the policy its requests name:
    None for the fleet file's own)."""
    from tierlink.policy import REGISTRY

    names = [n.strip() for n in text.split(",") if n.strip()]
    known = REGISTRY.names()
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(f"unknown run(s) {unknown}",
                          hint=f"choose from {', '.join(sorted(known))}")
    own = config.routing.policy
    chosen = [(n, None if n == own else n) for n in names]
    named = [n for n, policy in chosen if policy is not None]
    if named and not config.routing.allow_policy_override:
        raise ConfigError(f"run(s) {named} need requests to name their policy, which the "
                          "fleet file does not allow",
                          hint="set routing.allow_policy_override: true (or run only the "
                               f"fleet's own policy, {own})")
    return chosen


@contextmanager
def _per_run(reporter: Reporter, total: int, spread: Any,
             suffix: str = "") -> Iterator[Callable[[str, Any], None]]:
    """``simulate``'s ``on_done``: a phase per run (``<run><suffix>``, its requests
    counted), from its first answer to the next run's (runs in this process come one
    after another). Runs spread over other processes report only when back: a phase with
    a heartbeat stands for them while they run."""
    current: list[Phase] = []

    def done(name: str, _record: Any) -> None:
        label = name + suffix
        if not current or current[-1].name != label:
            _end(current)
            current.append(reporter.start(label, total))
        current[-1].advance()

    where = spread.ray_address or (f"{spread.workers} processes" if spread.workers > 1
                                   else None)
    waiting = reporter.start(f"simulating on {where}") if where else None
    try:
        yield done
    except BaseException:
        _end(current, failed=True)
        if waiting is not None:
            waiting.finish(failed=True)
        raise
    _end(current)
    if waiting is not None:
        waiting.finish()


def _end(phases: list[Phase], failed: bool = False) -> None:
    while phases:
        phases.pop().finish(failed=failed)


def _models(config: FleetConfig, reporter: Reporter
            ) -> tuple[FleetConfig, dict[str, Any], dict[str, Any]]:
    """The zoo models of the simulated task (built, variants made, as the demo does) with
    thresholds that belong to them, and each model's view as a node builds it."""
    from tierlink.cli.models import fleet_models
    from tierlink.fleet.tuning import fresh_thresholds
    from tierlink.models.runtime import ModelInfo

    wanted = tuple(m for m in config.model_names() if m.startswith(f"{TASK}-"))
    if not wanted:
        raise ConfigError(f"fleet {config.name!r} serves no {TASK} model to simulate")
    models = fleet_models(config.zoo_profile, wanted, progress=reporter)
    config, tuning = fresh_thresholds(config, models, TASK, reporter.say, reporter)
    views = {name: ModelInfo.from_card(models[name][1]).view() for name in wanted}
    return config, tuning, views


def _scenario(path: Path | None) -> Any:
    from tierlink.sim.scenario import ScenarioFile, load_scenario

    return load_scenario(path) if path is not None else ScenarioFile()


def _items(config: FleetConfig, sc: Any, n_samples: int, requests: int | None, rate: float,
           arrivals: str | None, duration_s: float | None, seed: int) -> list[Any]:
    from tierlink.fleet.workload import make_workload
    from tierlink.sim.workload import Arrivals, workload

    devices = [n.node_id for n in config.nodes if n.tier.label == "device"]
    if not devices:
        raise ConfigError(f"fleet {config.name!r} has no device to send requests from")
    shape = sc.arrivals
    if arrivals is not None:
        shape = Arrivals(kind=arrivals, rate_per_s=rate,
                         period_s=duration_s or sc.duration_s or 86_400.0)
    duration = duration_s or sc.duration_s
    if shape is None and duration is None:  # the demo's workload: a steady rate
        return make_workload(requests or 600, rate, devices, n_samples, seed)
    shape = shape or Arrivals(kind="constant", rate_per_s=rate)
    duration = duration or (requests or 600) / shape.rate_per_s
    return workload(shape, duration, devices, n_samples, seed, limit=requests)


def _photo_phase(config: FleetConfig, seed: int,
                 reporter: Reporter) -> tuple[Any, dict[str, Any], Any] | None:
    """The demo's photo workload for this fleet (None: it has no photo model with a
    device head): the model's answers on the photos, its view (split profile included),
    and the requests."""
    from dataclasses import replace

    from tierlink.demo.phases import DemoSettings, photo_model, photo_phase
    from tierlink.models.runtime import ModelInfo
    from tierlink.sim.outcomes import photo_outcomes
    from tierlink.zoo.photo_models import PHOTO_TASK, photo_models

    model = photo_model(config)
    if model is None:
        return None
    models = photo_models([model], say=reporter.say, progress=reporter)
    with reporter.phase("preparing the photo workload"):
        phase = photo_phase(config, replace(DemoSettings.quick(), seed=seed), models)
    if phase is None:
        return None
    outcomes = photo_outcomes(PHOTO_TASK, model, phase.reference, phase.confidence,
                              int(phase.images[0].nbytes))
    return outcomes, {model: ModelInfo.from_card(models[model][1]).view()}, phase.items


def _simulate_photos(report: dict[str, Any], phase: tuple[Any, dict[str, Any], Any],
                     config: FleetConfig, views: dict[str, Any], fmnist: Any, seed: int,
                     chosen: list[tuple[str, str | None]], scenario: Any,
                     http_by_run: dict[str, Any], reporter: Reporter) -> None:
    """The photo workload through every run (a phase each), reported as the demo reports
    it."""
    from tierlink.fleet.workload import PrivacyTally, summarize_split
    from tierlink.sim.run import Spread, simulate

    outcomes, _views, items = phase
    with _per_run(reporter, len(items), Spread(), " photos") as done:
        photos, records = simulate(config, views, outcomes, list(items), seed, chosen,
                                   scenario, on_done=done, http_by_run=http_by_run,
                                   also={TASK: fmnist})
    for name, _policy in chosen:
        run = photos["runs"][name]
        report["runs"][name]["imagenet"] = {
            "model": next(iter(outcomes.models)),
            **summarize_split(records[name], PrivacyTally(int(run["privacy_violations"]),
                                                          int(run["privacy_refusals"])))}


def _replayed(path: Path, run: str | None, config: FleetConfig, n_samples: int) -> list[Any]:
    """The requests of a live run's log, at their times, from their devices."""
    from tierlink.fleet.requestlog import read_log

    items = [e.item for e in read_log(path, run)]
    devices = {n.node_id for n in config.nodes if n.tier.label == "device"}
    strangers = sorted({i.origin for i in items} - devices)
    if strangers:
        raise ConfigError(f"the log's requests come from {strangers}, which are not devices "
                          f"of fleet {config.name!r}", hint="replay it on the fleet it ran on")
    if any(not 0 <= i.sample < n_samples for i in items):
        raise ConfigError(f"the log names inputs beyond the test split's {n_samples}")
    return items


def _measured_http(sc: Any, path: Path, config: FleetConfig, input_bytes: int,
                   warm_up: bool = False) -> tuple[Any, dict[str, Any]]:
    """The scenario with the HTTP costs measured from every run of a live request log, and
    those of each logged run on its own (a run of the same name uses its run's).
    ``warm_up``: from each run's warm-up (sent right before it) instead of the run."""
    from dataclasses import replace

    from tierlink.fleet.requestlog import measured, read_runs, warm_ups
    from tierlink.sim.http import costs_by_run

    logged = read_runs(path)
    runs = warm_ups(logged) if warm_up else measured(logged)
    if not runs:
        raise ConfigError(f"the request log {path} holds no "
                          f"{'warm-up' if warm_up else 'measured run'}",
                          hint="log a demo run with `tierlink demo --log` (it logs each "
                               "run's warm-up too)")
    pooled, own = costs_by_run(runs, config, input_bytes)
    return replace(sc, scenario=replace(sc.scenario, http=pooled)), own


def _measured_defaults(sc: Any, http: bool
                       ) -> tuple[Any, tuple[dict[str, Any], dict[str, Any]] | None]:
    """The scenario with what live runs of the demo's fleet paid (sim/http.py) where it
    gives nothing of its own: the per-run compute overhead, and (``http``) the HTTP costs
    — then also each demo run's own by name and where they come from."""
    from dataclasses import replace

    from tierlink.sim.http import measured_defaults

    if sc.overhead_given and not http:
        return sc, None
    defaults = measured_defaults()
    scenario = sc.scenario
    if not sc.overhead_given:
        scenario = replace(scenario, compute_overhead_ms=defaults.compute_overhead_ms)
    if not http:
        return replace(sc, scenario=scenario), None
    return (replace(sc, scenario=replace(scenario, http=defaults.pooled)),
            (dict(defaults.by_run), {"from": "the measured defaults", **defaults.provenance}))


def _print(report: dict[str, Any]) -> None:
    runs = report["runs"]
    table = Table(title=f"simulated: {report['requests']} requests on fleet {report['fleet']}")
    table.add_column("")
    for name in runs:
        table.add_column(name, justify="right")
    rows = [("accuracy", "accuracy", "{:.2%}"), ("p50 ms", "p50_ms", "{:.1f}"),
            ("p95 ms", "p95_ms", "{:.1f}"), ("p99 ms", "p99_ms", "{:.1f}"),
            ("SLA attainment", "sla_attainment", "{:.1%}"),
            ("cost per 1k (USD)", "cost_per_1k", "{:.6f}"), ("refused", "refused", "{:d}"),
            ("lost", "lost", "{:d}"), ("privacy violations", "privacy_violations", "{:d}"),
            ("refused for privacy", "privacy_refusals", "{:d}")]
    for label, key, fmt in rows:
        table.add_row(label, *(fmt.format(r[key]) for r in runs.values()))
    table.add_row("device/edge/cloud", *(
        "/".join(f"{100 * r['tier_share'][t]:.0f}%" for t in ("device", "edge", "cloud"))
        for r in runs.values()))
    table.add_row("wall s (req/s)", *(f"{s['wall_s']:.1f} ({s['requests_per_wall_s']:.0f})"
                                      for s in report["sim"].values()))
    Console().print(table)
