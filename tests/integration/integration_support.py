"""Plain helpers shared by the integration tests (the fixtures live in ``conftest.py``).

Everything here talks to real processes on loopback through their public interfaces: OIP v2
over HTTP, ``/metrics`` (Prometheus text) and ``/tierlink/v1/status`` (JSON).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import yaml

from tierlink.fleet.config import FleetConfig, parse_fleet
from tierlink.fleet.launcher import RunningFleet, launch
from tierlink.transport.oip import (
    HEADER_LENGTH,
    decode_infer_response,
    encode_infer_request,
)

T = TypeVar("T")
Models = dict[str, tuple[Path, Path]]
TASK = "fmnist"
TIER_RANK = {"device": 0, "edge": 1, "cloud": 2}
LOG_TAIL_CHARS = 3000


# -- fleets ---------------------------------------------------------------------------------


def fleet_config(yaml_text: str, name: str) -> FleetConfig:
    """A fleet YAML string (as a user would write it) validated into a ``FleetConfig``."""
    return parse_fleet(yaml.safe_load(yaml_text), source=f"<{name}>")


@contextmanager
def running_fleet(yaml_text: str, run_dir: Path, models: Models) -> Iterator[RunningFleet]:
    """Launch the fleet, yield it, and stop it however the test ends.

    At teardown every process the fleet started must be gone (reaped, not just signalled) and
    every CPU-quota cgroup it made removed; a leftover is a test failure naming it. If the launch fails, the processes' logs go into
    the error so the reason is visible in the test report.
    """
    config = fleet_config(yaml_text, run_dir.name)
    try:
        fleet = launch(config, models, run_dir)
    except Exception as exc:
        raise AssertionError(f"the fleet did not start: {exc}\n{log_tails(run_dir)}") from exc
    groups = [t.group for t in fleet.throttles if t.group is not None]
    try:
        yield fleet
    finally:
        fleet.stop()
        assert_all_gone(fleet, groups)


def assert_all_gone(fleet: RunningFleet, groups: list[Path]) -> None:
    left = {name: proc.pid for name, proc in fleet.procs.items() if proc.poll() is None}
    assert not left, f"fleet processes still running after stop(): {left}"
    kept = [str(g) for g in groups if g.exists()]
    assert not kept, f"cgroups left behind after stop(): {kept}"


def log_tails(run_dir: Path) -> str:
    """The end of every process log of a run, for failure messages."""
    parts = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        text = log.read_text(errors="replace")
        parts.append(f"--- {log.name} ---\n{text[-LOG_TAIL_CHARS:]}")
    return "\n".join(parts) or f"(no logs in {run_dir})"


def tier_of(fleet: RunningFleet, node_id: str) -> str:
    return fleet.config.node(node_id).tier.label


# -- OIP requests ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """One OIP response: HTTP status, decoded outputs (or the error body), parameters."""

    status: int
    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any]
    error: dict[str, Any]

    @property
    def path(self) -> list[str]:
        return list(json.loads(self.parameters["tierlink.path"]))

    @property
    def served_by(self) -> str:
        return str(self.parameters["tierlink.served_by"])

    @property
    def fallbacks(self) -> list[dict[str, Any]]:
        return list(json.loads(self.parameters.get("tierlink.fallbacks", "[]")))


def infer(client: httpx.Client, base_url: str, model: str, x: np.ndarray,
          params: Mapping[str, Any] | None = None, input_name: str = "input") -> Answer:
    """POST one binary-tensor OIP request for ``model`` (a task or a model name)."""
    body, headers = encode_infer_request({input_name: x}, dict(params or {}), None,
                                         binary_inputs=True, binary_outputs=True)
    resp = client.post(f"{base_url}/v2/models/{model}/infer", content=body, headers=headers)
    if not resp.is_success:
        return Answer(resp.status_code, {}, {}, resp.json())
    header = resp.headers.get(HEADER_LENGTH)
    data = decode_infer_response(resp.content, None if header is None else int(header))
    return Answer(resp.status_code, dict(data.outputs), dict(data.parameters or {}), {})


def route(client: httpx.Client, base_url: str, x: np.ndarray, *, privacy: str,
          deadline_ms: float = 2000.0, origin: str | None = None) -> Answer:
    """Send ``x`` to the task ``fmnist`` on a node, to be routed by the fleet's policy."""
    params: dict[str, Any] = {"tierlink.privacy": privacy, "tierlink.deadline_ms": deadline_ms}
    if origin:
        params["tierlink.origin"] = origin
    return infer(client, base_url, TASK, x, params)


def assert_consistent(fleet: RunningFleet, entry: str, answer: Answer) -> None:
    """What a routed answer says about itself must agree with itself and with the fleet:
    the path starts where the request entered and ends at ``served_by``, goes up the tiers
    one declared link at a time, and ``tier`` / ``model`` are those of the serving node."""
    assert answer.status == 200, answer.error
    path, served_by = answer.path, answer.served_by
    assert path[0] == entry and path[-1] == served_by, (path, served_by)
    ranks = [TIER_RANK[tier_of(fleet, n)] for n in path]
    assert ranks == sorted(set(ranks)), f"path {path} does not go strictly up the tiers"
    declared = {(link.src, link.dst) for link in fleet.config.links}
    assert all(hop in declared for hop in itertools.pairwise(path)), f"undeclared hop in {path}"
    assert answer.parameters["tierlink.tier"] == tier_of(fleet, served_by)
    assert answer.parameters["tierlink.model"] in fleet.config.node(served_by).models
    probs = answer.outputs["probabilities"]  # (1, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert int(answer.outputs["label"].reshape(-1)[0]) == int(probs.argmax(axis=1)[0])


# -- /metrics and /status -------------------------------------------------------------------


def metric_samples(client: httpx.Client, base_url: str,
                   name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric ``name`` (the sample name, e.g. ``..._total``) on a node."""
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get(f"{base_url}/metrics").text
    return [(dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


def metric_sum(client: httpx.Client, base_url: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(value for got, value in metric_samples(client, base_url, name)
               if all(got.get(k) == v for k, v in labels.items()))


def node_status(client: httpx.Client, base_url: str) -> dict[str, Any]:
    resp = client.get(f"{base_url}/tierlink/v1/status")
    resp.raise_for_status()
    return dict(resp.json())


# -- waiting --------------------------------------------------------------------------------


def wait_for(probe: Callable[[], T | None], timeout_s: float, what: str,
             interval_s: float = 0.1) -> T:
    """Call ``probe`` until it returns something truthy (returned); fail after ``timeout_s``
    with ``what`` and the last value in the message."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


# -- picking inputs -------------------------------------------------------------------------


def least_confident(onnx_path: Path, images: np.ndarray, n: int, pool: int = 1000) -> np.ndarray:
    """Indices of the ``n`` images (among the first ``pool``) the model is least sure of:
    those a cascade escalates, so the routing tests exercise every tier."""
    return np.argsort(top_probability(onnx_path, images[:pool]))[:n]


def least_confident_of_all(onnx_paths: list[Path], images: np.ndarray, n: int,
                           pool: int = 1000) -> np.ndarray:
    """Indices of the ``n`` images (among the first ``pool``) that the surest of the models
    is least sure of: a cascade through all of them escalates these to its last stage."""
    surest = np.max([top_probability(p, images[:pool]) for p in onnx_paths], axis=0)
    return np.argsort(surest)[:n]


def top_probability(onnx_path: Path, images: np.ndarray) -> np.ndarray:
    """(N,) the model's top softmax probability per image (temperature 1)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: images})[0]  # (N, 10)
    z = logits - logits.max(axis=1, keepdims=True)
    return (np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)).max(axis=1)


# -- models ---------------------------------------------------------------------------------


def profiled_mobilenet(root: Path, sample: np.ndarray, cuts: frozenset[str],
                       rounds: int) -> Models:
    """MobileNetV2 linked into ``root`` (the shared zoo cache is not written) with a split
    profile of ``cuts`` only, timed on ``sample``; raises ``ZooError`` if it cannot be made."""
    import shutil

    from tierlink.models.card import load_card
    from tierlink.models.split_profile import profile_path, save_profile
    from tierlink.split.profile import profile_model
    from tierlink.zoo.mobilenet import MODEL_NAME, card_path, ensure_mobilenet

    source = ensure_mobilenet()
    onnx_path, card = root / source.name, root / card_path(source).name
    onnx_path.symlink_to(source)
    shutil.copyfile(card_path(source), card)
    profile = profile_model(MODEL_NAME, onnx_path, sample[:1], load_card(card).sha256,
                            rounds=rounds, only=cuts.__contains__)
    save_profile(profile, profile_path(card))
    return {MODEL_NAME: (onnx_path, card)}



def tierlink(*args: str, token: str = "", check: bool = True) -> str:
    """Run ``tierlink ARGS`` as its own process, as an operator types it; its stdout."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TIERLINK_ADMIN_TOKEN=token, COLUMNS="200")
    done = subprocess.run([sys.executable, "-m", "tierlink.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"tierlink {' '.join(args)} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr}")
    return done.stdout
