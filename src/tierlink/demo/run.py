"""The demo, start to end (:func:`run_demo`), and its terminal side: progress while it runs,
the side-by-side tables at the end (Fashion-MNIST, then the photo workload and its split
plans)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tierlink.core.progress import Phase, Reporter
from tierlink.demo.phases import (
    RUNS,
    WARM_UP_S,
    DemoSettings,
    PhotoPhase,
    environment,
    fleet_summary,
    hard_example_summary,
    open_heads,
    photo_phase,
    run_photos,
    run_workload,
    threshold_prediction,
    warm_up,
    workload_for,
)
from tierlink.fleet.breakdown import Prediction, breakdown
from tierlink.fleet.config import load_fleet, on_etcd, with_tls, with_tracing
from tierlink.fleet.launcher import launch
from tierlink.fleet.tuning import fresh_thresholds
from tierlink.fleet.workload import PrivacyTally

console = Console(stderr=True)


def run_demo(fleet_file: Path, *, quick: bool, json_path: Path | None,
             requests: int | None = None, rate: float | None = None,
             chat: bool = False, log_path: Path | None = None,
             seed: int | None = None, etcd_replicas: int | None = None,
             traces: bool = False, otlp_endpoint: str | None = None,
             netns: bool = False, tls: bool = False,
             reporter: Reporter | None = None) -> dict[str, Any]:
    """The whole demo; its phases (models built, thresholds tuned, fleet started, each run)
    shown on ``reporter`` (default: stderr, bars on a terminal, lines otherwise)."""
    from tierlink.zoo.datasets import fashion_mnist

    reporter = reporter or Reporter()
    settings = DemoSettings.quick() if quick else DemoSettings()
    settings = replace(settings, requests=requests or settings.requests,
                       rate_per_s=rate or settings.rate_per_s,
                       seed=settings.seed if seed is None else seed)
    config = with_tls(with_tracing(on_etcd(load_fleet(fleet_file), etcd_replicas), traces,
                                   otlp_endpoint), tls)
    models = _fleet_models(config.zoo_profile, config.model_names(), reporter)
    zoo_summary = _model_summary(models)
    config, tuning = fresh_thresholds(config, models, settings.task, reporter.say, reporter)
    with reporter.phase("preparing the workloads"):
        test = fashion_mnist().test
        items = workload_for(config, settings, len(test.labels))
        photos = photo_phase(config, settings, models)
        prediction = threshold_prediction(config, models, settings.task)
    run_dir = Path(tempfile.mkdtemp(prefix="tierlink-demo-"))
    if log_path is not None:
        log_path.write_text("")  # this run's requests only
    try:
        with reporter.phase("starting the fleet"):
            fleet = launch(config, models, run_dir, say=reporter.say, netns=netns)
        with fleet:
            reporter.say(f"each run is warmed up first: {WARM_UP_S:g} s of its traffic, "
                         "not counted")
            runs = {name: _one_run(fleet, name, policy, items, test, settings, photos,
                                   prediction, log_path, reporter)
                    for name, policy in RUNS}
            with reporter.phase("report"):
                report = _report(fleet, runs, config, tuning, settings, zoo_summary)
    except BaseException:
        reporter.say(f"the fleet's logs and state are kept in {run_dir}")
        raise
    _print_report(report)
    if fleet.traces_file is not None:  # the run directory holds them: kept
        reporter.say(f"traces: tierlink trace list -f {fleet.traces_file}")
    else:  # nothing in it is needed any more (logs, state, certificates of a stopped fleet)
        shutil.rmtree(run_dir, ignore_errors=True)
    if chat:
        from tierlink.demo.chat_run import chat_phase

        report["chat"] = chat_phase(quick, reporter=reporter)
    if json_path:
        json_path.write_text(json.dumps(report, indent=2))
        console.print(f"report written to {json_path}")
    return report


def _report(fleet: Any, runs: dict[str, Any], config: Any, tuning: dict[str, Any],
            settings: DemoSettings, zoo_summary: dict[str, Any]) -> dict[str, Any]:
    """The demo's report (the JSON): the runs, and what the fleet says of itself."""
    return {"runs": runs, "fleet": fleet_summary(fleet),
            "thresholds": dict(config.routing.thresholds), "tuning": tuning,
            "hard_examples": hard_example_summary(fleet.control_url,
                                                 headers=fleet.admin_headers,
                                                 verify=fleet.verify()),
            "environment": environment(fleet, settings, zoo_summary)}


def _fleet_models(profile: str, wanted: Iterable[str],
                  reporter: Reporter) -> dict[str, tuple[Path, Path]]:
    """Model name -> (model file, card) for every name in ``wanted``, made first where a
    source makes it (``profile``: the fleet file's ``zoo.profile``), shown on ``reporter``."""
    from tierlink.models.catalog import Catalog, SourceOptions

    options = SourceOptions(profile=profile, progress=reporter, say=reporter.say)
    return Catalog.default(options).paths(wanted)


def _model_summary(models: dict[str, tuple[Path, Path]]) -> dict[str, dict[str, Any]]:
    """What the report says of each model: size, accuracy, latency, tier, precision,
    temperature (from its card)."""
    from tierlink.models.card import load_card

    out: dict[str, dict[str, Any]] = {}
    for name, (_, card_path) in models.items():
        card = load_card(Path(card_path))
        if card.multi_exit is not None:  # a multi-exit model: its own report
            continue
        out[name] = {"params": card.params, "test_accuracy": card.test_accuracy,
                     "latency_ms_batch1_p50": card.latency_ms["batch1_p50"],
                     "tier": card.tier, "precision": card.precision,
                     "temperature": card.temperature}
    return out


def _one_run(fleet: Any, name: str, policy: str | None, items: list, test: Any,
             settings: DemoSettings, photos: PhotoPhase | None,
             prediction: Prediction | None, log_path: Path | None = None,
             reporter: Reporter | None = None) -> dict[str, Any]:
    from tierlink.fleet.requestlog import append_log, warm_up_run
    from tierlink.fleet.workload import summarize, summarize_split

    reporter = reporter or Reporter()

    def fmnist(on_done: Any) -> tuple[list, PrivacyTally]:
        return run_workload(fleet, items, test.input, test.labels, settings.task, policy,
                            on_done)

    with reporter.phase(name, len(items)) as phase:
        phase.stage(f"warming up ({WARM_UP_S:g} s of its traffic, not counted)")
        warm = warm_up(fleet, items, test.input, test.labels, settings.task, policy)
        phase.stage("sending requests")
        records, privacy = _counted(phase, fmnist, _fmnist_live)
        run = summarize(records, privacy) | breakdown(records, fleet.config, prediction)
        phase.finish(_headline(run))  # the run's figures as soon as it ends
    if log_path is not None:
        append_log(log_path, warm_up_run(name), warm)
        append_log(log_path, name, records)
    if photos is not None:

        def photo(on_done: Any) -> tuple[list, PrivacyTally]:
            return run_photos(fleet, photos, policy, on_done)

        with reporter.phase(f"{name} photos", len(photos.items)) as phase:
            records, privacy = _counted(phase, photo, _photo_live)
        # Routed runs split once the head holder has opened a cut (in the background, as
        # soon as photos arrive): which ones it has open now.
        heads = open_heads(fleet, photos) if policy is None else {}
        origins = list(dict.fromkeys(i.origin for i in photos.items))
        run["imagenet"] = {"model": photos.model, "origins": origins,
                           "head_holders": [o for o in origins
                                            if photos.model in fleet.config.node(o).heads],
                           **summarize_split(records, privacy), "open_heads": heads}
    return run


def _headline(run: dict[str, Any]) -> str:
    """A run's figures in one line, as the report's table gives them."""
    tiers = run["tier_share"]
    shares = " / ".join(f"{100 * tiers.get(t, 0.0):.0f}%" for t in ("device", "edge", "cloud"))
    return (f"accuracy {100 * run['accuracy']:.2f}%, p50/p95 {run['p50_ms']:.1f}/"
            f"{run['p95_ms']:.1f} ms, SLA {100 * run['sla_attainment']:.1f}%, "
            f"cost/1k {run['cost_per_1k']:.6f}, device/edge/cloud {shares}, "
            f"lost {run['lost']}, refused {run['refused']}, "
            f"privacy violations {run['privacy_violations']}")


def _fmnist_live(done: list) -> str:
    from tierlink.fleet.workload import summarize

    s: dict[str, Any] = summarize(done)
    return (f"acc {100 * s['accuracy']:.1f}%  p95 {s['p95_ms']:.0f} ms  "
            f"SLA {100 * s['sla_attainment']:.0f}%  lost {s['lost']}")


def _photo_live(done: list) -> str:
    from tierlink.fleet.workload import summarize_split

    s: dict[str, Any] = summarize_split(done)
    p95 = "-" if s["p95_ms"] is None else f"{s['p95_ms']:.0f}"
    return (f"split {s['served']['split']}  remote {s['served']['remote']}  "
            f"p95 {p95} ms  refused {s['refused']}")


def _counted(phase: Phase, run: Any, live: Any) -> tuple[list, PrivacyTally]:
    """``run(on_done)`` with each answered request counted on ``phase``, its status
    ``live(records so far)`` (every 10th: it summarizes them all); its (records, privacy
    counts)."""
    done: list[Any] = []

    def on_done(record: Any) -> None:
        done.append(record)
        refresh = len(done) % 10 == 0 or len(done) == phase.total
        phase.update(completed=len(done), status=live(done) if refresh else None)

    result: tuple[list, PrivacyTally] = run(on_done)
    return result


def _print_report(report: dict[str, Any]) -> None:
    runs = report["runs"]
    table = Table(title="same workload, three ways (Fashion-MNIST test split)")
    table.add_column("")
    for name in runs:
        table.add_column(name, justify="right")
    rows = [("requests", "requests", "{:d}"), ("answered", "answered", "{:d}"),
            ("refused", "refused", "{:d}"), ("lost", "lost", "{:d}"),
            ("accuracy", "accuracy", "{:.2%}"), ("p50 ms", "p50_ms", "{:.1f}"),
            ("p95 ms", "p95_ms", "{:.1f}"), ("p99 ms", "p99_ms", "{:.1f}"),
            ("SLA attainment", "sla_attainment", "{:.1%}"),
            ("cost per 1k (USD)", "cost_per_1k", "{:.6f}"),
            ("privacy violations", "privacy_violations", "{:d}"),
            ("refused for privacy", "privacy_refusals", "{:d}")]
    for label, key, fmt in rows:
        table.add_row(label, *(fmt.format(r[key]) for r in runs.values()))
    table.add_row("served on device/edge/cloud", *(
        "/".join(f"{100 * r['tier_share'][t]:.0f}%" for t in ("device", "edge", "cloud"))
        for r in runs.values()))
    Console().print(table)
    _print_breakdown(runs)
    env = report["environment"]
    hard = report["hard_examples"]
    wrong = hard["wrong_share_of_labelled"]
    console.print(f"cascade thresholds {report['thresholds']}; hard examples kept by the "
                  f"control plane: {hard['stored']} {hard['by_privacy']}"
                  + (f", {100 * wrong:.0f}% of them misclassified where labelled"
                     if wrong is not None else ""))
    console.print(f"device CPU throttle: {env['device_cpu_throttle']}; "
                  f"{env['requests_per_run']} requests per run at {env['rate_per_s']}/s")
    photos = {name: r["imagenet"] for name, r in runs.items() if "imagenet" in r}
    if photos:
        _print_photos(photos)


def _print_breakdown(runs: dict[str, dict[str, Any]]) -> None:
    """Accuracy / SLA attainment / cost per privacy level and SLA class, each run side by
    side; then the live escalation rate beside the thresholds' prediction."""
    table = Table(title="by privacy level and SLA class: accuracy / SLA attainment "
                        "(costs, p95 and tier shares in the JSON)")
    table.add_column("")
    for name in runs:
        table.add_column(name, justify="right")
    first = next(iter(runs.values()))
    groups = [("by_privacy", k, f"privacy {k}") for k in first["by_privacy"]]
    groups += [("by_sla", k, f"{k} ({_deadline(first, k)})") for k in first["by_sla"]]
    groups += [("any_by_cloud_room", k, f"any, {k.replace('_', ' ')}")
               for k in first["any_by_cloud_room"]]
    for section, key, label in groups:
        table.add_row(label, *(_cell(r[section].get(key)) for r in runs.values()))
    Console().print(table)
    esc = first["escalation"]
    if esc.get("escalated_share_tuned") is not None and esc["escalated_share"] is not None:
        console.print(
            f"escalation (requests that may leave the device, {esc['may_escalate']}): "
            f"{100 * esc['escalated_share']:.1f}% answered upstream; the threshold "
            f"{esc['threshold']:.4f} predicts {100 * esc['escalated_share_tuned']:.1f}% "
            f"(calibration split), {100 * esc['escalated_share_expected']:.1f}% on these "
            f"inputs; {esc['escalation_degraded']} kept the device's answer for lack of time")


def _deadline(run: dict[str, Any], sla: str) -> str:
    return f"{run['by_sla'][sla]['deadline_ms']:.0f} ms"


def _cell(group: dict[str, Any] | None) -> str:
    if not group or not group["requests"]:
        return "-"
    return f"{100 * group['accuracy']:.1f}% / {100 * group['sla_attainment']:.0f}%"


def _print_photos(runs: dict[str, dict[str, Any]]) -> None:
    """The photo workload's table: how each run served it, split plans included."""
    first = next(iter(runs.values()))
    table = Table(title=f"{first['model']} on photos (the imagenet task)")
    table.add_column("")
    for name in runs:
        table.add_column(name, justify="right")

    def row(label: str, value: Any) -> None:
        table.add_row(label, *(value(r) for r in runs.values()))

    def pair(a: float | None, b: float | None) -> str:
        return f"{_ms(a)}/{_ms(b)}"

    med = "split_medians"
    row("requests/answered", lambda r: f"{r['requests']}/{r['answered']}")
    row("split/local/remote",
        lambda r: "/".join(str(r["served"][k]) for k in ("split", "local", "remote")))
    row("split plan", lambda r: _plans(r["split_plans"]))
    row("p50/p95 ms", lambda r: pair(r["p50_ms"], r["p95_ms"]))
    for kind in ("split", "remote"):
        row(f" {kind} p50/p95", lambda r, k=kind: (
            pair(r["by_kind"][k]["p50_ms"], r["by_kind"][k]["p95_ms"])
            if k in r["by_kind"] else "-"))
    row(" split head ms", lambda r: _ms(r[med]["head_ms"]))
    row(" after head est/ms", lambda r: pair(r[med]["est_ms"], r[med]["after_head_ms"]))
    row(" split KB sent", lambda r: (
        "-" if r[med]["split_bytes"] is None else f"{r[med]['split_bytes'] / 1e3:.1f}"))
    row("SLA attainment", lambda r: f"{r['sla_attainment']:.1%}")
    row("top-1 agreement", lambda r: (
        "-" if r["agreement_top1"] is None else f"{r['agreement_top1']:.1%}"))
    row("privacy violations", lambda r: str(r["privacy_violations"]))
    row("refused for privacy", lambda r: str(r["privacy_refusals"]))
    row("refused", lambda r: str(r["refused"]))
    Console().print(table)
    _photo_notes(runs)


def _photo_notes(runs: dict[str, dict[str, Any]]) -> None:
    first = next(iter(runs.values()))
    holders = first["head_holders"]
    others = [o for o in first["origins"] if o not in holders]
    console.print(f"photos from {', '.join(first['origins'])}, {first['requests']} per run: "
                  f"{', '.join(holders)} may split (holding the model's head)"
                  + (f"; {', '.join(others)}: the raw photo is uploaded" if others else "")
                  + ". Agreement: with the unsplit model's top-1. After head: encode + send "
                  "+ tail, the policy's estimate / measured (medians).")
    refused = [f"{name} {r['refused']} ({_errors(r['errors'])})" for name, r in runs.items()
               if r["refused"]]
    if refused:
        console.print("refused photo requests: " + "; ".join(refused))


def _plans(plans: dict[str, int]) -> str:
    """The most used plan; how many others were used below it."""
    if not plans:
        return "-"
    top = max(plans, key=plans.__getitem__)
    return top + (f"\n+{len(plans) - 1} other" if len(plans) > 1 else "")


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{code} x{n}" for code, n in errors.items())


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
