"""Where should MobileNetV2 be cut? tierlink's split choice against the oracle, per link.

A real fleet on loopback: control plane, ``cloud-1`` (MobileNetV2, unthrottled) and
``dev-1`` (the same model, allowed to run its heads, CPU throttled by a cgroup quota of
``--cpu-quota`` of one core), one emulated link dev-1 -> cloud-1 whose bandwidth and delay
are changed through the link emulator's control API for each condition (bandwidths 1, 5,
20, 100 Mbit/s x RTT 10 and 50 ms by default). For each condition, on real photos
(scikit-image's samples, 224x224):

* ``device``: the whole model on the device (``device_only`` policy: the same routed
  endpoint, so every strategy pays the same request handling);
* ``cloud``: the raw image uploaded and classified in the cloud (``cloud_only`` policy);
* ``tierlink``: the task posted to the device, routed by the default policy with
  latency-first weights (cost weight 0): local, remote or a split (cut, codec) from the
  nodes' split profiles and the live link estimate;
* ``oracle``: every candidate (block cut x codec) forced with ``tierlink.split`` and timed;
  the fastest measured wins, and is then timed again for ``--confirm`` rounds alternating
  with tierlink's routed requests: the row's ``chosen.ms`` and ``oracle.ms`` are those two
  side-by-side medians (the race's own figures, kept under ``race``, favour the oracle: the
  fastest of ~70 noisy medians is biased low).

The codec table is measured first, and the fleet prices codecs with what it measured
(``routing.split_codec_loss``: the share of MobileNetV2 answers each codec changed), as a
user would after ``tierlink split codecs``.

Strategies and forced plans are interleaved round by round; medians of ``--requests``
rounds per cell. The forced plans are raced: all run in the first two rounds, then a plan
whose median is over ``--race`` x the best so far is dropped, and a plan whose payload alone
would take longer on the link than the device needs for everything is never run. The routed requests carry a ``--deadline-ms`` deadline (latency is scored
against it; a loose deadline lets a codec's tiny accuracy loss outweigh a faster plan). Prints a table, writes JSON (one row per
condition with ``bandwidth_mbit, rtt_ms, device_ms, cloud_ms, chosen, oracle`` plus the
codec table) and a PNG of latency against bandwidth::

    .venv/bin/python benchmarks/split.py [--json PATH] [--png PATH] [--requests 8]
        [--confirm 10] [--cpu-quota 0.1] [--bandwidths 1,5,20,100] [--rtts 10,50] [--no-codec-table]

Every process it starts is stopped at the end (the fleet's context manager).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from tierlink.fleet.config import parse_fleet
from tierlink.fleet.launcher import launch
from tierlink.netem.server import LinkControlClient
from tierlink.transport.oip import HEADER_LENGTH, decode_infer_response, encode_infer_request

MODEL, TASK = "imagenet-mobilenetv2", "imagenet"
LINK = "dev-1->cloud-1"
WARMED: list[bool] = []  # set once every plan's sessions exist on both nodes

FLEET = """
name: split-bench
seed: 1
zoo: {profile: full}
control: {ttl_s: 10}
routing:
  allow_policy_override: true
  weights: {accuracy: 1.0, latency: 5.0, cost: 0.0}
  probe_idle_s: 1.0
nodes:
  - {id: cloud-1, tier: cloud,  models: [imagenet-mobilenetv2], workers: 1}
  - {id: dev-1,   tier: device, models: [imagenet-mobilenetv2],
     heads: [imagenet-mobilenetv2], cpu_quota: %s}
links:
  - {from: dev-1, to: cloud-1, delay_ms: 5, bandwidth_mbit: 100}
"""


def post(http: httpx.Client, url: str, name: str, x: np.ndarray,
         params: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """One binary OIP request; (wall ms, response parameters)."""
    body, headers = encode_infer_request({"input": x}, params, None, binary_inputs=True,
                                         binary_outputs=True)
    start = time.perf_counter()
    resp = http.post(f"{url}/v2/models/{name}/infer", content=body, headers=headers)
    ms = (time.perf_counter() - start) * 1000.0
    if resp.status_code != 200:
        raise RuntimeError(f"{name} {params}: HTTP {resp.status_code} {resp.text[:300]}")
    header = resp.headers.get(HEADER_LENGTH)
    data = decode_infer_response(resp.content, None if header is None else int(header))
    return ms, dict(data.parameters or {})


def condition(http: httpx.Client, dev: str, photos: np.ndarray, plans: dict[str, int],
              args: argparse.Namespace, mbit: float) -> dict[str, Any]:
    """Every strategy every round, and every (cut, codec) plan raced: all plans run in the
    first rounds, then a plan whose median is over ``--race`` x the best median so far is
    dropped (it cannot be the oracle); plans whose payload alone would take longer on this
    link than the device needs for the whole model are never run. Medians per plan."""
    slow = {"tierlink.privacy": "any", "tierlink.deadline_ms": 120_000.0}
    strategies: dict[str, tuple[str, dict[str, Any]]] = {
        "device": (TASK, {**slow, "tierlink.policy": "device_only"}),
        "cloud": (TASK, {**slow, "tierlink.policy": "cloud_only"}),
        "tierlink": (TASK, {"tierlink.privacy": "any",
                            "tierlink.deadline_ms": args.deadline_ms}),
    }
    forced = {key: (TASK, {**slow, "tierlink.split": f"cloud-1/{key}"}) for key in plans}
    if not WARMED:  # first use of a cut builds its head and tail sessions: not timed
        for name, params in [*strategies.values(), *forced.values()]:
            post(http, dev, name, photos[0][None], {**params, "tierlink.deadline_ms": 120_000.0})
        WARMED.append(True)
    time.sleep(2.5)  # idle probes teach the device's estimator this link
    ms: dict[str, list[float]] = {k: [] for k in [*strategies, *forced]}
    est: dict[str, list[tuple[float, float]]] = {k: [] for k in forced}
    chosen: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    alive = set(forced)
    for i in range(args.requests):
        x = photos[i % len(photos)][None]
        for key, (name, params) in strategies.items():
            took, answer = _attempt(http, dev, name, x, params, key, failures)
            ms[key].append(took)
            if key == "tierlink":
                chosen.append(_chosen(answer, took))
        bound = statistics.median(ms["device"]) * 1.0
        for key in sorted(alive):
            if plans[key] * 8.0 / (mbit * 1000.0) > bound:
                alive.discard(key)  # the payload alone takes longer than the device
                continue
            name, params = forced[key]
            took, answer = _attempt(http, dev, name, x, params, key, failures)
            ms[key].append(took)
            est[key].append(_after_head(answer))
        if i >= 1:
            best = min(statistics.median(v) for v in ms.values() if v)
            alive = {k for k in alive if statistics.median(ms[k]) <= args.race * best}
    row = summarize(ms, est, chosen, failures)
    oracle = _oracle_key(ms)
    took = confirm(http, dev, photos, strategies["tierlink"], {**strategies, **forced}[oracle],
                   args.confirm, failures)
    return {**row, "race": {"tierlink_ms": row["chosen"]["ms"], "oracle_ms": row["oracle"]["ms"]},
            "confirm": {k: _quartiles(v) for k, v in took.items()},
            "chosen": {**row["chosen"], "ms": statistics.median(took["tierlink"])},
            "oracle": {**row["oracle"], "ms": statistics.median(took["oracle"])}}


def confirm(http: httpx.Client, dev: str, photos: np.ndarray, routed: tuple[str, dict[str, Any]],
            oracle: tuple[str, dict[str, Any]], rounds: int,
            failures: dict[str, str]) -> dict[str, list[float]]:
    """tierlink's and the oracle plan's times (ms) over ``rounds`` fresh rounds, the two
    alternating. The race's winner is the fastest of many noisy medians, so its race figure
    is biased low (the winner's curse); timed again beside tierlink it is not."""
    took: dict[str, list[float]] = {"tierlink": [], "oracle": []}
    for i in range(rounds):
        x = photos[(i + 3) % len(photos)][None]
        for key, (name, params) in (("tierlink", routed), ("oracle", oracle)):
            took[key].append(_attempt(http, dev, name, x, params, f"confirm-{key}", failures)[0])
    return took


def _quartiles(values: list[float]) -> dict[str, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return {"p25_ms": q1, "median_ms": q2, "p75_ms": q3}


def _oracle_key(ms: dict[str, list[float]]) -> str:
    med = {k: statistics.median(v) for k, v in ms.items() if v and k != "tierlink"}
    return min(med, key=med.__getitem__)


def _attempt(http: httpx.Client, dev: str, name: str, x: np.ndarray, params: dict[str, Any],
             key: str, failures: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """One request; a refused or timed-out one counts as infinitely slow."""
    try:
        return post(http, dev, name, x, params)
    except RuntimeError as exc:
        failures[key] = str(exc)[:300]
        return float("inf"), {}


def _after_head(answer: dict[str, Any]) -> tuple[float, float]:
    """(the policy's estimate, the measured time) of a split's part after the head:
    encode + send + tail."""
    t = json.loads(answer.get("tierlink.timings_ms", "{}"))
    return float(t.get("est_ms", 0.0)), float(t.get("encode_ms", 0.0) + t.get("tail_rtt_ms", 0.0))


def _chosen(answer: dict[str, Any], took: float) -> dict[str, Any]:
    plan = answer.get("tierlink.split_plan") or (
        "local" if answer.get("tierlink.served_by") == "dev-1" else
        "remote" if answer else "failed")
    est, after = _after_head(answer) if answer.get("tierlink.split_plan") else (None, None)
    return {"plan": plan, "ms": took, "after_head_est_ms": est, "after_head_ms": after}


def summarize(ms: dict[str, list[float]], est: dict[str, list[tuple[float, float]]],
              chosen: list[dict[str, Any]], failures: dict[str, str]) -> dict[str, Any]:
    """Medians per strategy and plan; the oracle is the fastest measured of device, cloud
    and every plan that ran (tierlink's own requests are not candidates)."""
    med = {k: statistics.median(v) for k, v in ms.items() if v}
    oracle_key = _oracle_key(ms)
    plan = statistics.mode(c["plan"] for c in chosen)
    return {"device_ms": med["device"], "cloud_ms": med["cloud"],
            "chosen": {**_plan(plan), "ms": med["tierlink"], "requests": chosen},
            "oracle": {**_plan({"device": "local", "cloud": "remote"}.get(oracle_key,
                                                                          oracle_key)),
                       "ms": med[oracle_key]},
            "forced": {k: {"ms": med[k], "rounds": len(ms[k]),
                           "after_head_est_ms": _median(e for e, _ in est[k]),
                           "after_head_ms": _median(a for _, a in est[k])}
                       for k in est if k in med},
            "failures": failures}


def _median(values: Any) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def _plan(text: str) -> dict[str, str]:
    cut, _, codec = text.partition("/")
    return {"cut": cut, "codec": codec}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tierlink.models.card import load_card
    from tierlink.models.split_profile import load_profile
    from tierlink.zoo.mobilenet import card_path, ensure_mobilenet
    from tierlink.zoo.photo_models import ensure_split_profile
    from tierlink.zoo.photos import imagenet_photos

    onnx_path = ensure_mobilenet()
    card = load_card(card_path(onnx_path))
    photos, _ = imagenet_photos(views=False)
    ppath = ensure_split_profile(MODEL, onnx_path, say=lambda m: print(m, file=sys.stderr))
    profile = load_profile(ppath, card.sha256)
    if profile is None:
        raise RuntimeError(f"no split profile at {ppath}")
    # every plan the policy may pick: each profiled cut x each codec it measured there
    plans = {f"{p.cut}/{c.codec}": c.wire_bytes for p in profile.points for c in p.codecs}
    codecs = {} if args.no_codec_table else _codec_table()
    raw = yaml.safe_load(FLEET % args.cpu_quota)
    raw["routing"]["split_codec_loss"] = measured_losses(codecs)
    config = parse_fleet(raw, source="<split-bench>")
    rows = []
    with launch(config, {MODEL: (onnx_path, card_path(onnx_path))},
                Path(tempfile.mkdtemp(prefix="tierlink-split-bench-"))) as fleet, \
            httpx.Client(timeout=300.0) as http:
        links = LinkControlClient(fleet.links_url)
        dev = fleet.node_urls["dev-1"]
        post(http, dev, MODEL, photos[:1], {})  # warm up sessions
        for rtt in args.rtts:
            for mbit in args.bandwidths:
                links.update(LINK, delay_ms=rtt / 2.0, bandwidth_mbit=mbit)
                row = {"bandwidth_mbit": mbit, "rtt_ms": rtt,
                       **condition(http, dev, photos, plans, args, mbit)}
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
    return {"rows": rows, "settings": {"cpu_quota": args.cpu_quota, "requests": args.requests,
                                       "split_codec_loss": raw["routing"]["split_codec_loss"],
                                       "deadline_ms": args.deadline_ms, "race": args.race,
                                       "plans": len(plans), "profile": profile.to_dict()},
            "codecs": codecs, "checks": {**checks(rows),
                                         "codec_target_met_by": codecs.get("met_by")}}


def measured_losses(codecs: dict[str, Any]) -> dict[str, float]:
    """What a user would put in ``routing.split_codec_loss`` after measuring the codecs:
    per codec the policy knows, the points of MobileNetV2 top-1 answers it changed (an
    upper bound on the accuracy it can cost). Empty without a codec table (the defaults)."""
    from tierlink.estimate.split import DEFAULT_CODECS

    known = {c.spec for c in DEFAULT_CODECS}
    return {row["codec"]: round(100.0 * (1.0 - row["mobilenet_top1_agreement"]), 3)
            for row in codecs.get("codecs", []) if row["codec"] in known}


def _codec_table() -> dict[str, Any]:
    """Every codec's ratio, encode / decode time and accuracy impact on Fashion-MNIST and
    MobileNetV2 (``benchmarks/split_codec_table.py``), measured before the fleet starts."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from split_codec_table import codec_table

    print("measuring the feature codecs (about a minute) ...", file=sys.stderr)
    return codec_table()


def checks(rows: list[dict[str, Any]]) -> dict[str, Any]:
    within = [r["chosen"]["ms"] <= 1.10 * r["oracle"]["ms"] for r in rows]
    split_rows = [r for r in rows if r["oracle"]["cut"] not in ("local", "remote")]
    gains = [min(r["device_ms"], r["cloud_ms"]) / r["chosen"]["ms"] for r in split_rows]
    return {"chosen_within_10pct_of_oracle": f"{sum(within)}/{len(rows)}",
            "split_is_oracle_in": len(split_rows),
            "speedup_vs_best_single_where_split_wins": [round(g, 2) for g in gains]}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="MobileNetV2: where to cut (median ms per image)")
    for col in ("Mbit/s", "RTT ms", "device", "cloud", "tierlink (cut/codec)", "oracle"):
        table.add_column(col)
    for r in result["rows"]:
        c, o = r["chosen"], r["oracle"]
        table.add_row(f"{r['bandwidth_mbit']:g}", f"{r['rtt_ms']:g}", f"{r['device_ms']:.0f}",
                      f"{r['cloud_ms']:.0f}", f"{c['ms']:.0f} ({c['cut']} {c['codec']})",
                      f"{o['ms']:.0f} ({o['cut']} {o['codec']})")
    Console().print(table)
    Console().print(result["checks"])


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rtts = sorted({r["rtt_ms"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(rtts), figsize=(5 * len(rtts), 4), squeeze=False)
    for ax, rtt in zip(axes[0], rtts, strict=True):
        rows = [r for r in result["rows"] if r["rtt_ms"] == rtt]
        bw = [r["bandwidth_mbit"] for r in rows]
        for key, label in (("device_ms", "all on device"), ("cloud_ms", "all in cloud")):
            ax.plot(bw, [r[key] for r in rows], "o--", label=label)
        ax.plot(bw, [r["chosen"]["ms"] for r in rows], "s-", label="tierlink")
        ax.plot(bw, [r["oracle"]["ms"] for r in rows], "x:", label="oracle")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bandwidth, Mbit/s")
        ax.set_ylabel("latency per image, ms")
        ax.set_title(f"RTT {rtt:g} ms")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--requests", type=int, default=8, help="rounds per condition")
    parser.add_argument("--no-codec-table", action="store_true",
                        help="skip measuring the codec table (the JSON's \"codecs\")")
    parser.add_argument("--confirm", type=int, default=10,
                        help="rounds of tierlink against the race's winner, side by side")
    parser.add_argument("--race", type=float, default=1.2,
                        help="drop a forced plan once its median is over this x the best")
    parser.add_argument("--cpu-quota", type=float, default=0.1,
                        help="the device's CPU, as a fraction of one core (cgroup quota)")
    parser.add_argument("--deadline-ms", type=float, default=1000.0,
                        help="the routed requests' deadline (latency counts against it)")
    parser.add_argument("--bandwidths", type=lambda s: [float(x) for x in s.split(",")],
                        default=[1.0, 5.0, 20.0, 100.0])
    parser.add_argument("--rtts", type=lambda s: [float(x) for x in s.split(",")],
                        default=[10.0, 50.0])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    if args.json:  # strict JSON: a cell whose requests failed is null (see "failures")
        args.json.write_text(json.dumps(_finite(result), indent=2) + "\n")
    if args.png:
        plot(result, args.png)


if __name__ == "__main__":
    main()
