"""The local model store (``modelstore/store.py``): one directory per version, atomic
installs (a failed one leaves nothing, a re-install swaps whole directories), the current
version, lookups, tasks and data kept by digest, and a store in the old layout (one
directory per model) moved into the new one on first use."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from tierlink.errors import ImportRefused, ModelNotFound
from tierlink.models.data import Labelled
from tierlink.models.layout import CARD_FILE, MODEL_FILE
from tierlink.models.task import TaskSpec
from tierlink.models.tensors import TensorDecl
from tierlink.modelstore.store import ModelStore

TASK = TaskSpec("spam", "classification", (TensorDecl("tokens", "INT64", (-1, 8)),))


def install(store: ModelStore, name: str, task: str = "spam", onnx: bytes = b"onnx",
            version: str = "1") -> None:
    with store.installing(name, version) as staging:
        (staging / MODEL_FILE).write_bytes(onnx)
        (staging / CARD_FILE).write_text(
            f'{{"name": "{name}", "task": "{task}", "version": "{version}"}}')


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob(".*"))


def test_default_is_under_tierlink_home(model_store, tmp_path):
    assert model_store.root == tmp_path / "home" / "models"
    assert model_store.names() == [] and not model_store.root.exists()  # nothing made yet


def test_an_install_becomes_the_model_directory(model_store):
    install(model_store, "spam-small")
    assert model_store.has("spam-small")
    onnx, card = model_store.paths("spam-small")
    assert onnx.read_bytes() == b"onnx" and model_store.card("spam-small").task == "spam"
    assert onnx == model_store.root / "spam-small" / "1" / MODEL_FILE
    assert card == model_store.root / "spam-small" / "1" / CARD_FILE
    assert leftovers(model_store.root) == []


def test_a_failed_install_leaves_nothing(model_store):
    with pytest.raises(RuntimeError, match="measuring failed"), \
            model_store.installing("spam-small", "1") as staging:
        (staging / MODEL_FILE).write_bytes(b"half")
        assert staging.name.startswith(".staging-1-")
        raise RuntimeError("measuring failed")
    assert not model_store.has("spam-small") and not (model_store.root / "spam-small").exists()
    assert leftovers(model_store.root) == []


def test_a_reinstall_replaces_the_whole_directory(model_store):
    install(model_store, "spam-small", onnx=b"v1")
    (model_store.root / "spam-small" / "1" / "stale.txt").write_text("from v1")
    install(model_store, "spam-small", onnx=b"v2")
    assert model_store.paths("spam-small")[0].read_bytes() == b"v2"
    assert not (model_store.root / "spam-small" / "1" / "stale.txt").exists()
    assert leftovers(model_store.root) == []  # the old directory went too


def test_a_failed_reinstall_keeps_the_previous_version(model_store):
    install(model_store, "spam-small", onnx=b"v1")
    with pytest.raises(RuntimeError), model_store.installing("spam-small", "1") as staging:
        (staging / MODEL_FILE).write_bytes(b"v2")
        raise RuntimeError("boom")
    assert model_store.paths("spam-small")[0].read_bytes() == b"v1"
    assert leftovers(model_store.root) == []


def test_names_by_task_skip_staging_and_bookkeeping_folders(model_store):
    install(model_store, "a", task="spam")
    install(model_store, "b", task="ham")
    model_store.save_task(TASK)
    (model_store.root / "c" / ".staging-1-1234").mkdir(parents=True)
    (model_store.root / "c" / ".staging-1-1234" / CARD_FILE).write_text("{}")
    assert model_store.names() == ["a", "b"]
    assert model_store.names("spam") == ["a"] and model_store.names("nope") == []


def test_an_unknown_model_says_how_to_import_one(model_store):
    assert not model_store.has("nope")
    with pytest.raises(ModelNotFound) as err:
        model_store.paths("nope")
    assert "no model 'nope' in the model store" in err.value.message
    assert "tierlink model import" in err.value.hint
    with pytest.raises(ModelNotFound):
        model_store.remove("nope")


def test_remove(model_store):
    install(model_store, "a")
    model_store.remove("a")
    assert not model_store.has("a") and not (model_store.root / "a").exists()


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "a\\b", "two words", "tab\tx",
                                  "tasks", "data", "../escape"])
def test_unusable_model_names_are_refused_before_anything_is_written(model_store, name):
    with pytest.raises(ImportRefused, match="is not usable"), \
            model_store.installing(name, "1"):
        pytest.fail("the block must not run")
    assert not model_store.root.exists()


def test_tasks_round_trip(model_store):
    assert model_store.task("spam") is None
    model_store.save_task(TASK)
    assert model_store.task("spam") == TASK
    assert (model_store.root / "tasks" / "spam.json").is_file()


def test_data_is_kept_once_by_digest(model_store):
    data = Labelled({"a": np.arange(6.0).reshape(3, 2), "b": np.ones((3, 1), np.int64)},
                    np.array([0, 1, 0]), "f" * 64)
    path = model_store.save_data(data)
    assert path == model_store.data("f" * 64) and path.is_file()
    mtime = path.stat().st_mtime_ns
    assert model_store.save_data(data) == path and path.stat().st_mtime_ns == mtime
    back = model_store.load_data("f" * 64)
    assert sorted(back.inputs) == ["a", "b"] and back.sha256 == "f" * 64
    np.testing.assert_array_equal(back.inputs["a"], data.inputs["a"])
    np.testing.assert_array_equal(back.labels, data.labels)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_data_no_longer_in_the_store_is_refused(model_store):
    with pytest.raises(ImportRefused, match="is no longer in the store"):
        model_store.load_data("0" * 64)


def test_versions_live_side_by_side_and_the_last_installed_is_current(model_store):
    install(model_store, "spam-small", onnx=b"v1", version="1")
    install(model_store, "spam-small", onnx=b"v2", version="2")
    assert model_store.versions("spam-small") == ["1", "2"]
    assert (model_store.root / "spam-small" / "CURRENT").read_text() == "2"
    assert model_store.paths("spam-small")[0].read_bytes() == b"v2"
    assert model_store.paths("spam-small", "1")[0].read_bytes() == b"v1"
    assert model_store.card("spam-small", "1").version == "1"
    assert model_store.card("spam-small").version == "2"
    with pytest.raises(ModelNotFound, match="no version 3 of 'spam-small'"):
        model_store.paths("spam-small", "3")


def test_splits_need_a_model_measured_on_data(model_store):
    install(model_store, "spam-small")
    with pytest.raises(ImportRefused, match="spam-small was not measured on data"):
        model_store.splits("spam-small")


def test_a_store_in_the_old_layout_is_moved_on_first_use(tmp_path, caplog):
    """A store written before versions (``<name>/model.onnx``, ``<name>/card.json``) keeps
    every model: each moves into ``<name>/<its card's version>/``, and the move is said."""
    root = tmp_path / "models"
    for name, version in (("old-a", "3"), ("old-b", None)):
        (root / name).mkdir(parents=True)
        (root / name / MODEL_FILE).write_bytes(name.encode())
        card = {"name": name, "task": "spam", **({"version": version} if version else {})}
        (root / name / CARD_FILE).write_text(json.dumps(card))
    (root / "tasks").mkdir()
    (root / "tasks" / "spam.json").write_text(json.dumps(TASK.to_dict()))
    with caplog.at_level(logging.WARNING, logger="tierlink.models.layout"):
        store = ModelStore(root)
        assert store.names() == ["old-a", "old-b"]
    assert "moved old-a into" in caplog.text and "moved old-b into" in caplog.text
    assert store.paths("old-a")[0] == root / "old-a" / "3" / MODEL_FILE
    assert store.paths("old-a")[0].read_bytes() == b"old-a"
    assert store.paths("old-b")[0] == root / "old-b" / "1" / MODEL_FILE
    assert store.task("spam") == TASK and leftovers(root) == []
    caplog.clear()
    assert ModelStore(root).names() == ["old-a", "old-b"] and caplog.text == ""  # once
