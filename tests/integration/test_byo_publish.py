"""``tierlink model import --control``: a user's model imported and published, signed, to a
real control plane's repository in one command; its validation is the import's own
measurement (the evaluation part of the model's data), not a zoo split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import byo_support as byo
from tierlink.netports import pick_port

pytestmark = pytest.mark.integration


def tierlink(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "tierlink.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"tierlink {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_import_publishes_a_signed_version_validated_on_its_own_data(tmp_path: Path) -> None:
    env = dict(os.environ, TIERLINK_HOME=str(tmp_path / "home"), COLUMNS="200")
    key = tmp_path / "publisher.key"
    public = tierlink("model", "keygen", "--out", str(key), env=env).strip().splitlines()[-1]
    port = pick_port()
    control = subprocess.Popen(
        [sys.executable, "-m", "tierlink.cli.main", "control", "--port", str(port),
         "--db", str(tmp_path / "registry.db"), "--open", "--trusted-key", public],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/v1/nodes", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and control.poll() is None, "no control plane"
            time.sleep(0.2)
        x, y = byo.classification_data(200)
        card = json.loads(tierlink(
            "model", "import", "toy-edge", str(byo.classifier(tmp_path / "toy.onnx")),
            "--task", "toy", "--tier", "edge", "--data",
            str(byo.save_npz(tmp_path / "toy.npz", x=x, y=y)), "--version", "2",
            "--control", url, "--key", str(key), "--notes", "first import", "--json",
            env=env))
        assert card["published"]["created"] is True
        # the card as the store wrote it (schema 2), the publication added beside it
        stored = json.loads((tmp_path / "home" / "models" / "toy-edge" / "2" / "card.json")
                            .read_text())
        assert card["schema"] == 2 and {k: v for k, v in card.items() if k != "published"} \
            == stored
        shown = json.loads(tierlink("model", "show", "toy-edge", "2", "--control", url,
                                    "--json", env=env))
        validation = shown["signed"]["manifest"]["validation"]
        assert validation["split"] == "eval" and validation["n"] == card["data"]["eval_samples"]
        assert validation["accuracy"] == pytest.approx(card["test_accuracy"])
        assert validation["dataset"].startswith("toy:")
    finally:
        control.terminate()
        control.wait(timeout=10)
