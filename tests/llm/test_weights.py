"""Where converted language models live: the framework's layout, ``<name>/<version>/``,
and a model converted before versions moved there on first use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tierlink.llm import weights
from tierlink.models.card import load_card

FILES = ("config.json", "model.safetensors", "tokenizer.json", "source.json")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERLINK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def old_install(home: Path, name: str, card: dict | None) -> Path:
    old = home / "llm" / name
    old.mkdir(parents=True)
    for f in FILES:
        (old / f).write_text(f)
    if card is not None:
        (old / "card.json").write_text(json.dumps(card))
    return old


@pytest.mark.parametrize("measured", [True, False])
def test_a_model_converted_before_versions_moves_into_the_layout(home: Path,
                                                                 measured: bool) -> None:
    card = {"name": "lm", "kind": "causal_lm", "architecture": "llama", "parameters": 7,
            "bytes": 17, "context_length": 64, "layers": 2, "hidden_size": 8,
            "kv_bytes_per_token": 64, "prefill_tokens_per_s": 1.0,
            "decode_tokens_per_s": 2.0, "measured_for": "k"}
    old_install(home, "lm", card if measured else None)
    directory = weights.model_dir("lm")
    assert directory == home / "llm" / "lm" / "1"
    assert weights.installed("lm")
    assert sorted(p.name for p in directory.iterdir()) == sorted([*FILES, "card.json"])
    moved = load_card(directory / "card.json")
    assert (moved.name, moved.format, moved.version) == ("lm", "llm", "1")
    assert (moved.language is not None) == measured
    assert weights.model_dir("lm") == directory  # once


def test_a_model_never_installed_has_its_place_but_is_not_installed(home: Path) -> None:
    assert weights.model_dir("absent") == home / "llm" / "absent" / "1"
    assert not weights.installed("absent")
