"""``tierlink hard-examples list|export`` against an in-process control plane."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tierlink.cli import hard_examples
from tierlink.control.app import create_app
from tierlink.control.client import ControlClient
from tierlink.control.store import SqliteRegistryStore

URL = "http://control"
runner = CliRunner()


def example(rid: str, label: int) -> dict[str, object]:
    x = np.full((1, 28, 28), 0.5, "<f4")
    return {"request_id": rid, "node_id": "dev-1", "model": "fmnist-small", "task": "fmnist",
            "privacy": "any", "prediction": 2, "confidence": 0.4, "label": label,
            "created_at": 1.0, "input": {"datatype": "FP32", "shape": [1, 28, 28],
                                         "data": base64.b64encode(x.tobytes()).decode()}}


@pytest.fixture
def control(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    registry = SqliteRegistryStore(":memory:")
    app = create_app(registry)
    monkeypatch.setattr(hard_examples, "_client", lambda url, token=None: ControlClient(
        url, transport=httpx.ASGITransport(app)))
    client = TestClient(app)
    client.post("/v1/hard-examples", json={"examples": [example("a", 3), example("b", -1)]})
    yield client
    app.state.hard_examples.store.close()
    registry.close()


def cli() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(hard_examples.app, name="hard-examples")
    return root


def test_list_as_json_and_as_a_table(control: TestClient) -> None:
    result = runner.invoke(cli(), ["hard-examples", "list", URL, "--json", "--limit", "1"])
    assert result.exit_code == 0, result.output
    assert [e["request_id"] for e in json.loads(result.stdout)] == ["a"]
    table = runner.invoke(cli(), ["hard-examples", "list", URL, "--model", "fmnist-small"])
    assert table.exit_code == 0 and "fmnist-small" in table.stdout and "dev-1" in table.stdout


def test_export_writes_an_npz(control: TestClient, tmp_path: Path) -> None:
    out = tmp_path / "hard.npz"
    result = runner.invoke(cli(), ["hard-examples", "export", URL, "--out", str(out)])
    assert result.exit_code == 0, result.output
    with np.load(out) as npz:
        assert npz["inputs"].shape == (2, 1, 28, 28) and npz["labels"].tolist() == [3, -1]


def test_an_unreachable_control_plane_is_a_clear_error() -> None:
    result = runner.invoke(cli(), ["hard-examples", "list", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "cannot reach the control plane" in result.output
