"""The zoo starts from the models tierlink ships: taken when their cards are what this code
would build and their files match, trained (and said so) when they do not."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import pytest

from tierlink.core.progress import Reporter
from tierlink.models.card import file_sha256
from tierlink.zoo import cache as zoo_cache
from tierlink.zoo import ensure_zoo, model_names
from tierlink.zoo import shipped as zoo_shipped

SHIPPED = zoo_shipped.SHIPPED  # the real ones, whatever a test patches


@pytest.fixture
def fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERLINK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _no_training(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    trained: list[tuple[str, ...]] = []

    def builder(task: str, _profile: Any, root: Path, _reporter: Any,
                names: tuple[str, ...]) -> None:
        trained.append(tuple(names))
        for name in names:  # what a build leaves: the shipped files, as if trained here
            source = SHIPPED / "full" / name
            shutil.copytree(source, root / name, dirs_exist_ok=True)

    monkeypatch.setattr(zoo_cache, "_builder", lambda: builder)
    return trained


def test_a_fresh_zoo_takes_the_shipped_models_without_training(
        fresh_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained = _no_training(monkeypatch)
    zoo = ensure_zoo(profile="full", progress=False)
    assert trained == []
    assert set(model_names("fmnist")) | {"fmnist-small-fp16"} == set(zoo.cards)
    for name in zoo.cards:
        shipped = zoo_shipped.shipped_root("full") / name / zoo.card(name).version
        assert file_sha256(zoo.path(name)) == file_sha256(shipped / "model.onnx")
        assert zoo.root == fresh_home / "zoo" / "full"


def test_a_shipped_model_that_does_not_fit_is_built_and_said(
        fresh_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = tmp_path / "shipped"
    shutil.copytree(zoo_shipped.SHIPPED, ours)
    (ours / "full" / "fmnist-medium" / "1" / "model.onnx").write_bytes(b"not the model")
    monkeypatch.setattr(zoo_shipped, "SHIPPED", ours)
    trained = _no_training(monkeypatch)
    said = io.StringIO()
    zoo = ensure_zoo(profile="full", progress=Reporter(said, beat_s=None))
    assert trained == [("fmnist-medium",)]
    assert "the shipped fmnist-medium does not fit this code" in said.getvalue()
    assert "sha256" in said.getvalue()
    assert set(zoo.cards) >= set(model_names("fmnist"))


def test_rebuild_and_an_explicit_root_never_take_shipped_models(
        fresh_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained = _no_training(monkeypatch)
    ensure_zoo(profile="full", progress=False, root=tmp_path / "elsewhere")
    ensure_zoo(profile="full", progress=False, force=True)
    assert trained == [model_names("fmnist"), model_names("fmnist")]
