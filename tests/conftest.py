"""Fixtures shared across the test tree.

This file's folder (``tests/``) is on ``sys.path`` while tests run (pytest's default import
mode puts a rootless conftest's folder there), so tests import shared helpers at this
level by module name: ``byo_support`` (small real ONNX models and their data).

* ``model_store``: an empty local model store under ``tmp_path``, with ``TIERLINK_HOME``
  pointing there, so nothing touches the real store (``ModelStore.default()`` is it).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def model_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # -> ModelStore
    from tierlink.modelstore.store import ModelStore

    monkeypatch.setenv("TIERLINK_HOME", str(tmp_path / "home"))
    store = ModelStore.default()
    assert store.root == tmp_path / "home" / "models"
    return store
