"""The local model store: where imported models live, by name, beside their cards, with the
tasks they declared and the labelled data they were measured on.

Layout under ``$TIERLINK_HOME/models`` (the framework's one model layout,
:mod:`tierlink.models.layout`, plus what the store keeps of tasks and data)::

    <name>/<version>/model.onnx|model.zip, card.json   one directory per version, installed
    <name>/CURRENT                                     atomically; the version a name means
    tasks/<task>.json                      the task's declaration (first import wins; later
                                           models of the task must match it)
    data/<sha256>.npz                      the labelled data a card was measured on

A version is built in a staging directory and renamed into place; a failed import leaves
nothing behind, and re-importing a version replaces it only once the new one is whole. A
store written before versions (``<name>/card.json``) is moved into this layout on first
use, with a message.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from tierlink.durable import replace_synced
from tierlink.errors import ImportRefused, ModelError, ModelNotFound
from tierlink.models.card import ModelCard, load_card
from tierlink.models.data import Labelled, Splits, split
from tierlink.models.layout import CARD_FILE, Layout, check_part
from tierlink.models.task import TaskSpec, task_from_dict


class ModelStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._layout = Layout(self.root)
        self._migrated = False

    @classmethod
    def default(cls) -> ModelStore:
        from tierlink.models.home import tierlink_home

        return cls(tierlink_home() / "models")

    @property
    def layout(self) -> Layout:
        """The store's versions; a store in the old layout is migrated first (once)."""
        if not self._migrated:
            self._migrated = True
            self._layout.migrate()
        return self._layout

    def has(self, name: str) -> bool:
        return self.layout.current(name) is not None

    def paths(self, name: str, version: str | None = None) -> tuple[Path, Path]:
        """(model file, card) of an installed model (its current version by default): the
        file its card names (``model.onnx`` for an ONNX graph, ``model.zip`` for a Python
        model)."""
        directory = self._dir(name, version)
        return directory / load_card(directory / CARD_FILE).file, directory / CARD_FILE

    def graph(self, name: str, tool: str) -> Path:
        """The ONNX graph of an installed model, for a tool that works on graphs
        (quantisation, split computing, feature codecs); refused, saying why, for a model
        of another format (a Python model)."""
        fmt = self.card(name).format
        if fmt != "onnx":
            raise ImportRefused(f"{tool} works on ONNX graphs; {name} is a {fmt} model",
                                hint="serve and cascade it as it is, or export it to ONNX "
                                     f"and import that to use {tool}")
        return self.paths(name)[0]

    def card(self, name: str, version: str | None = None) -> ModelCard:
        return load_card(self._dir(name, version) / CARD_FILE)

    def versions(self, name: str) -> list[str]:
        return self.layout.versions(name)

    def names(self, task: str | None = None) -> list[str]:
        names = self.layout.names()
        return [n for n in names if task is None or self.card(n).task == task]

    def task(self, name: str) -> TaskSpec | None:
        path = self.root / "tasks" / f"{name}.json"
        if not path.is_file():
            return None
        return task_from_dict(name, json.loads(path.read_text()), where="model store tasks")

    def data(self, sha256: str) -> Path:
        return self.root / "data" / f"{sha256}.npz"

    @contextmanager
    def installing(self, name: str, version: str) -> Iterator[Path]:
        """A staging directory that becomes ``<name>/<version>/`` (the version ``name``
        means from then on) when the block ends without error; removed, with nothing
        installed, when it raises."""
        _check_name(name)
        with self.layout.installing(name, version) as staging:
            yield staging

    def save_task(self, task: TaskSpec) -> None:
        path = self.root / "tasks" / f"{task.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_synced(path, (json.dumps(task.to_dict(), indent=2) + "\n").encode())

    def save_data(self, data: Labelled) -> Path:
        path = self.data(data.sha256)
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{uuid.uuid4().hex[:8]}.tmp.npz")
            arrays: dict[str, Any] = {"y": data.labels,
                                      **{f"x:{k}": v for k, v in data.inputs.items()}}
            np.savez(tmp, **arrays)
            os.replace(tmp, path)
        return path

    def load_data(self, sha256: str) -> Labelled:
        path = self.data(sha256)
        if not path.is_file():
            raise ImportRefused(f"the data with sha256 {sha256[:12]} is no longer in the "
                                f"store ({path})", hint="import the model again with --data")
        with np.load(path, allow_pickle=False) as z:
            x = {k[2:]: z[k] for k in z.files if k.startswith("x:")}
            return Labelled(MappingProxyType(x), z["y"], sha256)

    def splits(self, name: str) -> Splits:
        """The data ``name`` was imported with, split into calibration and evaluation parts
        as its card was measured."""
        card = self.card(name)
        if card.data is None:
            raise ImportRefused(f"{name} was not measured on data of the store")
        return split(self.load_data(card.data.sha256), card.data.calib_share,
                     card.data.seed)

    def eval_part(self, name: str) -> Labelled:
        """The evaluation part of the data ``name`` was imported with (never calibrated on)."""
        return self.splits(name).test

    def single_input_classifier(self, name: str, tool: str) -> Labelled:
        """The evaluation part of an imported classifier with one input, for tools that
        measure top-1 answers (split codecs, profiles); refused with the reason otherwise."""
        card = self.card(name)
        if card.kind != "classification":
            raise ImportRefused(f"{tool} measures top-1 answers; {name} is a "
                                f"{card.kind} model", hint="it works on imported classifiers")
        if len(card.inputs) != 1:
            raise ImportRefused(f"{tool} feeds one input tensor; {name} takes "
                                f"{len(card.inputs)}")
        return self.eval_part(name)

    def remove(self, name: str) -> None:
        self._dir(name, None)
        self.layout.remove(name)

    def _dir(self, name: str, version: str | None) -> Path:
        if self.layout.current(name) is None:
            raise ModelNotFound(f"no model {name!r} in the model store {self.root}",
                                hint="import it with `tierlink model import NAME MODEL`; "
                                     "`tierlink model imported` lists the store")
        try:
            return self.layout.dir(name, version)
        except ModelError:
            raise ModelNotFound(f"no version {version} of {name!r} in the model store; it "
                                f"has {self.layout.versions(name)}") from None


def _check_name(name: str) -> None:
    """The layout's rule, refused as an import's error."""
    try:
        check_part("name", name)
    except ModelError as exc:
        raise ImportRefused(exc.message, hint=exc.hint) from None
