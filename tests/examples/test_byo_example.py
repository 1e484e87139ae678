"""The bring-your-own-model example keeps working: its models export to ONNX with the task's
signature, and import against the task that examples/byo/fleet.yaml declares. (The real
corpus and the full training run in benchmarks/byo.py; here a few synthetic mails.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from tierlink.fleet.config import load_fleet
from tierlink.modelstore.importer import ImportRequest, import_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "byo"


@pytest.fixture(scope="module")
def spam_models():
    spec = importlib.util.spec_from_file_location("spam_models", EXAMPLE / "spam_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mails(n: int) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(0)
    spam = ["Subject: WIN cash now\n\nclick here to claim your free prize $$$",
            "Subject: cheap meds\n\nbuy now limited offer unsubscribe"]
    ham = ["Subject: meeting notes\n\nattached are the notes from the design review",
           "Subject: re: patch\n\nthe build passes on my machine, merging tomorrow"]
    labels = rng.integers(0, 2, n)
    return [(spam if y else ham)[i % 2] + f" {i}" for i, y in enumerate(labels)], labels


def test_encode_hashes_subject_and_body_words(spam_models) -> None:
    tokens = spam_models.encode("From: a@b\nSubject: Hello World\n\nHello <b>again</b>")
    assert tokens.shape == (spam_models.LENGTH,) and tokens.dtype == np.int64
    words = tokens[tokens > 0]
    assert len(words) == 4 and words[0] == words[2]  # hello, world, hello, again
    assert spam_models.encode("Subject: x\n\n")[1:].sum() == 0


@pytest.mark.parametrize("name", ["spam-tiny", "spam-base"])
def test_a_family_model_exports_and_imports_against_the_declared_task(
        spam_models, model_store, tmp_path: Path, name: str) -> None:
    torch.set_num_threads(1)
    texts, y = mails(200)
    x = np.stack([spam_models.encode(t) for t in texts])
    build, _ = spam_models.FAMILY[name]
    torch.manual_seed(0)  # the initial weights too: not whatever earlier tests left
    model = build()
    spam_models.train(model, x, y, epochs=25, seed=0)
    spam_models.export(model, tmp_path / f"{name}.onnx")
    np.savez(tmp_path / "heldout.npz", x=x, y=y)
    declared = load_fleet(EXAMPLE / "fleet.yaml").tasks["spam"]
    card = import_model(ImportRequest(name, tmp_path / f"{name}.onnx", "spam", "device",
                                      tmp_path / "heldout.npz", declared=declared),
                        model_store)
    assert card.labels == ("ham", "spam") and card.inputs[0].datatype == "INT64"
    assert card.task_spec == declared and card.kind == "classification"
    assert card.test_accuracy > 0.8, card.test_accuracy  # easy to tell apart
