"""``tierlink retrain MODEL``: a new version of a model from the fleet's hard examples.

The loop the hard examples were collected for (:mod:`tierlink.retrain`): the examples come
from the control plane (or an ``.npz`` that ``tierlink hard-examples export`` wrote) with
their labels — the request's own where it carried one, else the answer of the task's most
capable model (``--teacher``) — and go to the model's trainer (``tierlink.trainers``: the
zoo's fine-tunes a zoo model from its own weights; a user registers one for theirs) with the
model's training data. The result is judged against the parent on held-out data (its hard
slice — the inputs the parent passes up at the fleet's threshold — and all of it); only a
better version is published, signed, and rolled out from a canary.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console

from tierlink.cli.errors import fail
from tierlink.cli.operator import AdminToken, call
from tierlink.errors import ConfigError, TierlinkError

console = Console(stderr=True)


def retrain_cmd(
    model: str = typer.Argument(..., help="the model to retrain, as the fleet names it"),
    examples: Path | None = typer.Option(None, "--examples", help="hard examples from "
                                         "`tierlink hard-examples export` (default: fetched "
                                         "from --control)"),
    control: str | None = typer.Option(None, "--control", envvar="TIERLINK_CONTROL_URL",
                                       help="the control plane: hard examples from it, the "
                                            "new version published to it"),
    teacher: str | None = typer.Option(None, "--teacher", help="the task's most capable "
                                       "model: labels what came unlabelled, and is learnt "
                                       "from (default: the zoo task's large model)"),
    threshold: float = typer.Option(0.9, "--threshold", min=0.0, max=1.0, help="the "
                                    "fleet's cascade threshold for MODEL: what it passes up "
                                    "is its hard slice"),
    trainer: str = typer.Option("zoo", "--trainer", help="a registered trainer "
                                "(tierlink.trainers)"),
    option: list[str] = typer.Option([], "--option", help="KEY=VALUE for the trainer "
                                     "(repeatable; the zoo's: epochs, max_lr, hard_share, "
                                     "...)"),
    profile: str = typer.Option("full", "--zoo-profile", help="the zoo profile the models "
                                "come from"),
    max_drop: float = typer.Option(0.3, "--max-drop", min=0.0, help="points of held-out "
                                   "accuracy the new version may lose"),
    version: str | None = typer.Option(None, "--version", help="publish as this version "
                                       "(needs --key and --control) when better"),
    key: Path | None = typer.Option(None, "--key", help="the publisher's private key"),
    tier: str | None = typer.Option(None, "--tier", help="roll it out to this tier"),
    canary: str = typer.Option("10%", "--canary", help="the rollout's first stage"),
    out: Path | None = typer.Option(None, "--out", help="where the new model is written"),
    admin_token: str | None = AdminToken,
    as_json: bool = typer.Option(False, "--json", help="print the outcome as JSON"),
) -> None:
    """Retrain MODEL on the fleet's hard examples; publish and canary it if it is better."""
    try:
        result = run_retrain(model, examples=examples, control=control, teacher=teacher,
                             threshold=threshold, trainer=trainer,
                             options=_options(option), profile=profile,
                             max_drop=max_drop, version=version, key=key, tier=tier,
                             canary=canary, out=out, admin_token=admin_token)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    console.print(result["judgement"]["reason"])
    if result.get("published"):
        console.print(f"published {model} {version}; rollout {result['rollout']} started "
                      f"on the {tier} tier at {canary}" if result.get("rollout") else
                      f"published {model} {version}")


def run_retrain(model: str, *, examples: Path | None, control: str | None,
                teacher: str | None, threshold: float, trainer: str, profile: str,
                options: dict[str, str] | None = None,
                max_drop: float, version: str | None, key: Path | None, tier: str | None,
                canary: str, out: Path | None, admin_token: str | None,
                progress: bool = True) -> dict[str, Any]:
    """What ``tierlink retrain`` does; returns its outcome (counts, judgement, publication)."""
    from tierlink.cli.models import fleet_models
    from tierlink.core.progress import Reporter
    from tierlink.models.card import load_card
    from tierlink.retrain import TRAINERS, TrainJob, judge, label_examples
    from tierlink.zoo.datasets import load_splits

    if version is not None and (key is None or control is None):
        raise ConfigError("--version publishes: it needs --key and --control")
    reporter = Reporter() if progress else Reporter.quiet()
    train_with = TRAINERS.get(trainer)
    card = load_card(fleet_models(profile, (model,), reporter)[model][1])
    teacher = teacher or f"{card.task}-large"
    files = fleet_models(profile, (model, teacher), reporter)
    raw = _examples(examples, control, model, admin_token)
    splits = load_splits(card.task)
    teacher_labels = _predict(files[teacher][0], raw["inputs"])
    hard, own, taught = label_examples(raw["inputs"], raw["labels"], teacher_labels)
    work = out or _home() / "retrain" / f"{model}-{time.strftime('%Y%m%d-%H%M%S')}"
    work.mkdir(parents=True, exist_ok=True)
    job = TrainJob(model, files[model][0], files[model][1], splits.train, hard,
                   work / "model.onnx", files[teacher][0], reporter, dict(options or {}))
    trained = train_with(job)
    parent_p = _probs(files[model][0], splits.test.input, card.temperature)
    new_card = _card(card, trained, splits)
    verdict = judge(splits.test.labels, parent_p,
                    _probs(trained, splits.test.input, new_card.temperature), threshold,
                    max_drop)
    card_path = work / "card.json"
    from tierlink.models.card import save_card

    save_card(new_card, card_path)
    result: dict[str, Any] = {"model": model, "examples": len(raw["inputs"]),
                              "labelled_by_request": own, "labelled_by_teacher": taught,
                              "teacher": teacher, "trainer": trainer, "file": str(trained),
                              "judgement": verdict.to_dict(), "published": False,
                              "rollout": None}
    if verdict.better and version is not None and key is not None and control is not None:
        _publish(model, trained, card_path, version, verdict.reason, key, control,
                 admin_token, reporter)
        result["published"] = True
        if tier is not None:
            record = call(control, admin_token, "POST", "/v1/rollouts",
                          {"name": model, "version": version, "tier": tier,
                           "stages": _stages(canary)})
            result["rollout"] = record["id"]
    return result


def _options(given: list[str]) -> dict[str, str]:
    out = {}
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--option {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _home() -> Path:
    from tierlink.models.home import tierlink_home

    return tierlink_home()


def _examples(path: Path | None, control: str | None, model: str,
              token: str | None) -> dict[str, np.ndarray]:
    """The hard examples of ``model``: inputs and labels (-1: none sent)."""
    import io

    if path is not None:
        data = path.read_bytes()
    elif control is not None:
        import asyncio

        from tierlink.cli.hard_examples import _export

        data = asyncio.run(_export(control, model, None, token))
    else:
        raise ConfigError("no hard examples: give --examples FILE or --control URL")
    with np.load(io.BytesIO(data)) as npz:
        keep = np.asarray([m == model for m in npz["models"]]) if "models" in npz \
            else np.ones(len(npz["labels"]), bool)
        if not keep.any():
            raise ConfigError(f"no hard examples of {model!r} in them",
                              hint="the fleet collects them where hard_examples is on")
        return {"inputs": npz["inputs"][keep].astype(np.float32),
                "labels": npz["labels"][keep]}


def _probs(path: Path, x: np.ndarray, temperature: float) -> np.ndarray:
    from tierlink.models.evaluate import onnx_logits
    from tierlink.models.kinds import softmax

    return softmax(onnx_logits(path, x), temperature)


def _predict(path: Path, x: np.ndarray) -> np.ndarray:
    return _probs(path, x, 1.0).argmax(axis=1)


def _card(parent: Any, model: Path, splits: Any) -> Any:
    """The parent's card for the new file: accuracy re-measured, temperature re-fitted."""
    from tierlink.models.calibration import calibrated_card
    from tierlink.models.evaluate import onnx_logits

    calib = onnx_logits(model, splits.calib.input)
    test = onnx_logits(model, splits.test.input)
    card = replace(parent, test_accuracy=float((test.argmax(1) == splits.test.labels).mean()),
                   calib_accuracy=float((calib.argmax(1) == splits.calib.labels).mean()))
    return calibrated_card(card, calib, splits.calib.labels, test, splits.test.labels)


def _publish(model: str, onnx: Path, card: Path, version: str, notes: str, key: Path,
             control: str, token: str | None, reporter: Any) -> None:
    from tierlink.cli.model import run_publish

    run_publish(model, onnx, card, version, f"retrained on hard examples: {notes}", key,
                control, eval_limit=1000, progress=reporter, admin_token=token)


def _stages(canary: str) -> list[float]:
    from tierlink.rollout.machine import default_stages

    text = canary.strip().rstrip("%")
    try:
        share = float(text) / (100.0 if canary.strip().endswith("%") else 1.0)
    except ValueError:
        raise ConfigError(f"--canary {canary!r} is not a share", hint="e.g. 10%") from None
    return list(default_stages(share))
