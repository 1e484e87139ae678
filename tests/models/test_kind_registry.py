"""The output-kind registry (``models/kind_registry.py``): the built-in kinds, declared
under the ``tierlink.output_kinds`` entry points like a user's; a user's kind registered
directly or through an entry point; duplicates refused; unknown names answered with the
known ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

from tierlink.core import registry as core_registry
from tierlink.errors import ConfigError
from tierlink.models import kind_registry as registry_mod
from tierlink.models.kind_registry import ENTRY_POINT_GROUP, KindRegistry, kind_of
from tierlink.models.kinds import Answer, Outputs, role
from tierlink.models.task import TaskSpec
from tierlink.models.tensors import TensorDecl

BUILTIN = ["classification", "detection", "embedding", "multilabel", "regression"]


class Ranking:
    """A user's kind: scores (B, K) answered as an order; confidence = the top margin."""

    name = "ranking"
    metric = "top1"
    temperature_fit = False
    answers = (("order", "INT64"),)

    def roles(self, task: TaskSpec) -> tuple[str, ...]:
        return ("scores",)

    def logits(self, raw: Outputs, task: TaskSpec) -> np.ndarray | None:
        return None

    def answer(self, raw: Outputs, task: TaskSpec, temperature: float = 1.0) -> Answer:
        s = role(raw, task, "scores")
        top = np.sort(s, axis=1)
        return Answer({"order": np.argsort(-s, axis=1)}, np.clip(top[:, -1] - top[:, -2], 0, 1))

    def correct(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> np.ndarray | None:
        return answer.outputs["order"][:, 0] == y

    def score(self, answer: Answer, y: np.ndarray, task: TaskSpec) -> float | None:
        return float(self.correct(answer, y, task).mean())


@dataclass
class FakeEntryPoint:
    """What ``importlib.metadata.entry_points(group=...)`` yields: a name, what it names
    (``value``) and ``load()``."""

    name: str
    obj: Any
    group: str = ENTRY_POINT_GROUP

    @property
    def value(self) -> str:
        return f"tests:{getattr(self.obj, '__name__', type(self.obj).__name__)}"

    def load(self) -> Any:
        return self.obj


@dataclass
class EntryPoints:
    """The entry points the registry will see (``found``) and the groups it asked for."""

    found: list[FakeEntryPoint] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)

    def __call__(self, group: str) -> list[FakeEntryPoint]:
        self.asked.append(group)
        return [ep for ep in self.found if ep.group == group]


def builtin_entry_points() -> list[Any]:
    """tierlink's own kinds' entry points (not those of installed example packages)."""
    return [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)
            if ep.value.startswith("tierlink.")]


@pytest.fixture
def entry_points(monkeypatch: pytest.MonkeyPatch) -> EntryPoints:
    fake = EntryPoints(found=builtin_entry_points())
    monkeypatch.setattr(core_registry.metadata, "entry_points", fake)
    return fake


def test_the_builtin_kinds_are_registered():
    assert sorted(ep.name for ep in builtin_entry_points()) == BUILTIN
    assert set(BUILTIN) <= set(registry_mod.registry().names())
    for name in BUILTIN:
        assert kind_of(name).name == name


def test_a_users_kind_registered_directly_answers():
    reg = KindRegistry(discover=False)
    reg.register(Ranking())
    kind = reg.get("ranking")
    task = TaskSpec("r", "ranking", (TensorDecl("x", "FP32", (-1, 3)),))
    ans = kind.answer({"s": np.array([[0.1, 0.9, 0.3]], np.float32)}, task)
    assert ans.outputs["order"].tolist() == [[1, 2, 0]]
    np.testing.assert_allclose(ans.confidence, [0.6], rtol=1e-6)


def test_a_duplicate_name_is_refused():
    reg = KindRegistry((Ranking(),), discover=False)
    with pytest.raises(ConfigError, match="output kind 'ranking' is already registered"):
        reg.register(Ranking())
    with pytest.raises(ConfigError, match="'classification' is already registered"):
        KindRegistry().register(kind_of("classification").__class__())


def test_an_unknown_kind_names_the_known_ones_and_the_entry_point_group(entry_points):
    reg = KindRegistry()
    with pytest.raises(ConfigError) as err:
        reg.get("keypoints")
    assert err.value.message == "unknown output kind 'keypoints'"
    assert ", ".join(BUILTIN) in err.value.hint and ENTRY_POINT_GROUP in err.value.hint


@pytest.mark.parametrize("exported", [Ranking, Ranking()], ids=["factory", "object"])
def test_a_users_kind_comes_in_through_an_entry_point(entry_points, exported):
    entry_points.found.append(FakeEntryPoint("ranking", exported))
    entry_points.found.append(FakeEntryPoint("other", "ignored", group="tierlink.policies"))
    reg = KindRegistry()
    assert reg.names() == sorted([*BUILTIN, "ranking"])
    assert isinstance(reg.get("ranking"), Ranking)
    assert entry_points.asked == [ENTRY_POINT_GROUP]  # loaded once, lazily, by its group


def test_an_entry_point_may_not_replace_a_builtin_kind(entry_points):
    class Impostor(Ranking):
        name = "classification"

    entry_points.found.append(FakeEntryPoint("classification", Impostor))
    with pytest.raises(ConfigError, match="'classification' is already registered"):
        KindRegistry().names()


def test_entry_points_are_not_read_at_construction(entry_points):
    KindRegistry()
    assert entry_points.asked == []


def test_a_users_kind_is_usable_by_the_process_wide_registry(monkeypatch, entry_points):
    entry_points.found.append(FakeEntryPoint("ranking", Ranking))
    monkeypatch.setattr(registry_mod, "_REGISTRY", None)  # built afresh, then restored
    assert isinstance(kind_of("ranking"), Ranking)
    assert kind_of("regression").name == "regression"
    task = TaskSpec("r", "ranking", (TensorDecl("x", "FP32", (-1, 2)),),
                    MappingProxyType({"scores": "s"}))
    ans = kind_of(task.kind).answer({"s": np.array([[2.0, 1.0]], np.float32)}, task)
    assert kind_of(task.kind).score(ans, np.array([0]), task) == 1.0
