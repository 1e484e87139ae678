"""Cascade thresholds belong to the models they were tuned on.

``cascade tune`` writes, beside ``routing.thresholds``, the sha256 of every model of the
chain (``routing.cascade.tuned_on``). Before a fleet runs, :func:`stale_thresholds` compares
them with the model files it is about to serve: a fleet whose models changed since (a fresh
clone trains its own zoo, a model was retrained) must not run on thresholds chosen for
other models. ``tierlink up`` refuses with the command that fixes it; the demo re-tunes on
first use (:func:`retune`) and says so. Thresholds written by hand (no ``tuned_on``) are
taken as given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tierlink.core.progress import Reporter, as_reporter
from tierlink.errors import ConfigError
from tierlink.fleet.config import FleetConfig

Models = Mapping[str, tuple[Path, Path]]  # model name -> (onnx, card)


def stale_thresholds(config: FleetConfig, models: Models) -> list[str]:
    """One line per model whose file differs from the one the thresholds were tuned on
    (empty: the thresholds belong to these models, or carry no provenance)."""
    import json

    out = []
    for name, digest in config.routing.cascade_tuned_on.items():
        if name not in models:
            continue  # not served by this fleet (a chain of another task)
        now = str(json.loads(Path(models[name][1]).read_text()).get("sha256", ""))
        if now != digest:
            out.append(f"{name}: tuned on {digest[:12]}, this machine's file is {now[:12]}")
    return out


def require_fresh(config: FleetConfig, models: Models, fleet_file: Path | str) -> None:
    """``ConfigError`` (saying how to fix it) when the thresholds belong to other models."""
    stale = stale_thresholds(config, models)
    if stale:
        raise ConfigError(
            "routing.thresholds were tuned on other models than this fleet runs ("
            + "; ".join(stale) + ")",
            hint=f"run `tierlink cascade tune {fleet_file}`: it tunes them for these "
                 "models and records which models they belong to")


def retune(config: FleetConfig, task: str, goal: Any = None,
           progress: bool | Reporter = True) -> tuple[FleetConfig, Any]:
    """``config`` with its ``task`` cascade tuned anew for the models this machine has
    (thresholds, records and provenance, in the routing configuration the nodes are given);
    and the tuning report. The default goal is the one the
    fleet file records (:func:`fleet_goal`). ``progress``: where models built on the way
    show their progress (a reporter; ``True``: one on stderr)."""
    from tierlink.cascade.records import SEP, record_from_dict, record_to_dict
    from tierlink.cascade.report import tune_chain
    from tierlink.cascade.stages import chain_from_fleet
    from tierlink.models.catalog import Catalog, SourceOptions

    goal = goal or fleet_goal(config)
    chain = chain_from_fleet([(n.tier, n.models) for n in config.nodes], task)
    catalog = Catalog.default(SourceOptions(profile=config.zoo_profile, progress=progress))
    report = tune_chain(catalog.resolve(chain.models), chain, catalog.data(task), goal,
                        config.routing.policy_config().cost)
    # As the fleet file will hold them (cascade tune writes 4 decimals): the nodes run on
    # what the file would say.
    by_path = {tuple(k.split(SEP)): record_from_dict(record_to_dict(r), k)
               for k, r in (report.records or {}).items()}
    routing = config.routing
    thresholds = {**routing.thresholds, **report.thresholds()}
    tuned_on = dict(report.tuned_on or {})
    target = target_of(goal)
    routing = replace(routing, thresholds=MappingProxyType(thresholds),
                      cascade_tuned_on=MappingProxyType(tuned_on),
                      cascade_records=MappingProxyType(by_path),
                      cascade_target=(MappingProxyType(target) if target
                                      else routing.cascade_target))
    return replace(config, routing=routing), report


def fleet_goal(config: FleetConfig) -> Any:
    """The target the fleet's thresholds were tuned for (``routing.cascade.target``), or
    ``cascade tune``'s default: cloud-only - 0.3 point with 95% confidence."""
    from tierlink.cascade.report import DEFAULT_CONFIDENCE, Goal

    target = config.routing.cascade_target
    confidence = target.get("confidence", DEFAULT_CONFIDENCE)
    return Goal("accuracy_drop", target.get("accuracy_drop", 0.3),
                confidence=confidence or None)


def target_of(goal: Any) -> dict[str, float]:
    """What ``routing.cascade.target`` records of ``goal`` (only relative accuracy targets
    are re-tuned automatically)."""
    if goal.kind != "accuracy_drop":
        return {}
    return {"accuracy_drop": goal.value, "confidence": goal.confidence or 0.0}


def fresh_thresholds(config: FleetConfig, models: Models, task: str,
                     say: Callable[[str], None], progress: bool | Reporter = True
                     ) -> tuple[FleetConfig, dict[str, Any]]:
    """The fleet with thresholds that belong to the models this machine built: as written
    when they were tuned on these very files, else tuned anew here (a fresh clone trains
    its own zoo) — said through ``say`` and in the returned report (the demo's and the
    simulator's ``tuning``); the tuning is a phase of ``progress`` (a reporter)."""
    stale = stale_thresholds(config, models)
    if not stale:
        return config, {"retuned": False, "tuned_on": dict(config.routing.cascade_tuned_on)}
    say("the fleet file's cascade thresholds were tuned on other models ("
        + "; ".join(stale) + "): tuning them for this machine's models")
    reporter = as_reporter(progress)
    with reporter.phase("tuning thresholds"):  # blocking: its heartbeat speaks for it
        config, report = retune(config, task, progress=reporter)
    say(f"thresholds {report.thresholds()}: {report.describe()}; on the test split "
        f"{100 * report.test.accuracy:.2f}%, {100 * report.test.shares[0]:.1f}% answered "
        "on the device")
    return config, {"retuned": True, "stale": stale, "report": report.to_dict()}
