"""Publishing a real zoo model: validation measured with ONNX Runtime, the card rewritten."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from repo_support import NOW, validation
from tierlink.errors import ConfigError
from tierlink.models.card import load_card
from tierlink.repo.publish import measure_validation, prepare_version
from tierlink.repo.signing import sign_manifest
from tierlink.repo.verify import hash_file, verify_artifact

LIMIT = 600


@pytest.fixture(scope="module")
def zoo_model() -> tuple[Path, Path]:
    """fmnist-small of the built ``full`` zoo; the quick ``test`` zoo where it is not built
    (a fresh clone's CI builds that one for other tests anyway)."""
    from tierlink.errors import ZooError
    from tierlink.zoo.cache import ensure_zoo, load_zoo

    try:
        zoo = load_zoo(profile="full")
    except ZooError:
        zoo = ensure_zoo(profile="test", progress=False)
    return zoo.path("fmnist-small"), zoo.card_path("fmnist-small")


def test_measure_validation_on_the_test_split(zoo_model: tuple[Path, Path]) -> None:
    onnx, card = zoo_model
    seen: list[tuple[int, int]] = []
    v = measure_validation(onnx, card, LIMIT, progress=lambda d, t: seen.append((d, t)),
                           clock=lambda: NOW)
    assert (v.dataset, v.split, v.n, v.measured_at) == ("fmnist", "test", LIMIT, NOW)
    card_accuracy = json.loads(card.read_text())["test_accuracy"]
    # The card's figure is on the whole split; 600 images are within a few points of it.
    assert abs(v.accuracy - card_accuracy) < 0.06, (v.accuracy, card_accuracy)
    assert v.accuracy > 0.45
    assert seen[-1] == (LIMIT, LIMIT)


def test_prepare_version_rewrites_the_card_and_signs_clean(
        zoo_model: tuple[Path, Path], tmp_path: Path, key: Ed25519PrivateKey,
        public: str) -> None:
    onnx, card = zoo_model
    original = card.read_bytes()
    manifest, onnx_path, card_path = prepare_version(
        "fmnist-medium", onnx, card, "7", "small graph as a bad canary", tmp_path,
        validation(), clock=lambda: NOW)
    assert card.read_bytes() == original  # the zoo's card is never modified
    new_card = json.loads(card_path.read_text())
    assert (new_card["version"], new_card["name"]) == ("7", "fmnist-medium")
    assert new_card["sha256"] == manifest.onnx_sha256 == hash_file(onnx)[0]
    # the same card otherwise, written as the current schema
    assert new_card["schema"] == 2
    assert load_card(card_path) == replace(load_card(card), name="fmnist-medium", version="7",
                                           sha256=manifest.onnx_sha256)
    assert (manifest.name, manifest.task, manifest.version) == ("fmnist-medium", "fmnist", "7")
    assert onnx_path == onnx and manifest.card_sha256 == hash_file(card_path)[0]
    signed = sign_manifest(manifest, key)
    assert verify_artifact(signed, onnx_path, card_path, [public]) == signed.key_id


@pytest.mark.parametrize(("name", "version", "problem"), [
    ("../x", "2", "model name"), ("fmnist-small", "2/../../3", "--version"),
    ("fmnist-small", "", "--version")])
def test_prepare_version_refuses_unsafe_names(zoo_model: tuple[Path, Path], tmp_path: Path,
                                              name: str, version: str, problem: str) -> None:
    onnx, card = zoo_model
    with pytest.raises(ConfigError, match=problem):
        prepare_version(name, onnx, card, version, "", tmp_path, validation())


def test_a_card_without_a_task_is_refused(tmp_path: Path) -> None:
    card = tmp_path / "card.json"
    card.write_text("[]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        measure_validation(tmp_path / "model.onnx", card, 10)
    card.write_text('{"name": "m", "version": "1"}')
    with pytest.raises(ConfigError, match="lacks field.*'task'"):
        measure_validation(tmp_path / "model.onnx", card, 10)


def test_a_python_model_is_validated_by_its_own_runtime_on_its_tasks_data(model_store,
                                                                          tmp_path: Path):
    """No ONNX: the card names the Python runtime, the catalog gives the task's data (the
    imported data's test part), and the figure is the import's own."""
    import byo_support as byo
    from tierlink.modelstore.importer import ImportRequest, import_model

    x, y = byo.classification_data()
    card = import_model(ImportRequest("py", byo.python_classifier(tmp_path / "src"), "toy",
                                      "edge", byo.save_npz(tmp_path / "d.npz", x=x, y=y)),
                        model_store)
    package, card_path = model_store.paths("py")
    v = measure_validation(package, card_path, clock=lambda: NOW)
    assert card.data is not None  # imported: measured on its own data
    assert (v.dataset, v.n) == ("toy", card.data.eval_samples)
    assert v.accuracy == pytest.approx(card.test_accuracy)
