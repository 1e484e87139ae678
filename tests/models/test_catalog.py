"""The catalog (``models/catalog.py``): names resolved over sources in rank order, each
source asked once for its names, unknown names answered with what the sources offer,
labelled data from the first source that has some; the built-in sources come in through
the ``tierlink.model_sources`` entry points."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from tierlink.errors import ModelNotFound
from tierlink.models.catalog import Catalog, Resolved, SourceOptions, source_registry
from tierlink.models.data import Labelled, Splits


class FakeSource:
    """A source of fixed names (the fake of its family), recording what it was asked."""

    def __init__(self, name: str, rank: int, models: Sequence[str],
                 tasks: Sequence[str] = ()) -> None:
        self.name, self.rank, self.models, self.tasks = name, rank, list(models), tasks
        self.asked: list[list[str]] = []

    def offers(self, name: str) -> bool:
        return name in self.models

    def names(self) -> list[str]:
        return list(self.models)

    def resolve(self, names: Sequence[str]) -> dict[str, Resolved]:
        self.asked.append(list(names))
        return {n: Resolved(n, Path(f"/{self.name}/{n}.onnx"), Path(f"/{self.name}/{n}.json"),
                            self.name) for n in names}

    def data(self, task: str) -> Splits | None:
        if task not in self.tasks:
            return None
        part = Labelled.of(np.zeros((2, 3), np.float32), np.array([0, 1]))
        return Splits(part, part)


def test_names_resolve_in_rank_order_and_each_source_is_asked_once() -> None:
    store = FakeSource("store", 10, ["mine", "shared"])
    zoo = FakeSource("zoo", 20, ["shared", "zoo-a", "zoo-b"])
    found = Catalog([zoo, store]).resolve(["zoo-a", "mine", "shared", "zoo-b", "zoo-a"])
    assert list(found) == ["zoo-a", "mine", "shared", "zoo-b"]  # asked order, no repeats
    assert found["shared"].source == "store"  # the lower rank wins a shared name
    assert store.asked == [["mine", "shared"]] and zoo.asked == [["zoo-a", "zoo-b"]]
    assert Catalog([store]).paths(["mine"]) == {
        "mine": (Path("/store/mine.onnx"), Path("/store/mine.json"))}


def test_an_unknown_name_is_refused_naming_what_the_sources_offer() -> None:
    catalog = Catalog([FakeSource("store", 10, ["mine"]), FakeSource("zoo", 20, ["zoo-a"])])
    with pytest.raises(ModelNotFound, match="no model 'nope' in the catalog") as err:
        catalog.resolve(["mine", "nope"])
    assert "store: mine" in err.value.hint and "zoo: zoo-a" in err.value.hint
    assert "tierlink model import" in err.value.hint


def test_data_comes_from_the_first_source_that_has_the_task() -> None:
    catalog = Catalog([FakeSource("store", 10, [], ["spam"]),
                       FakeSource("zoo", 20, [], ["fmnist", "spam"])])
    assert len(catalog.data("fmnist").test) == 2
    with pytest.raises(ModelNotFound, match="no source has labelled data of task 'x'"):
        catalog.data("x")


def test_the_built_in_sources_are_entry_points(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TIERLINK_HOME", str(tmp_path))
    assert source_registry().names() == ["repo", "store", "zoo"]
    catalog = Catalog.default(SourceOptions(profile="test", progress=False))
    assert [s.name for s in catalog.sources] == ["store", "zoo", "repo"]  # by rank
    zoo = catalog.sources[1]
    assert zoo.offers("fmnist-small") and zoo.offers("fmnist-small-fp16")
    assert zoo.offers("mnist-large") and zoo.offers("fmnist-exits")
    assert zoo.offers("imagenet-mobilenetv2")
    assert not zoo.offers("fmnist-huge") and not zoo.offers("spam-small")
    assert not catalog.sources[0].offers("fmnist-small")  # an empty store
