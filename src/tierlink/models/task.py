"""What a task is: the input a request carries and the kind of answer it gets back.

A :class:`TaskSpec` is declared once per task — by the first ``tierlink model import`` of a
model for it (written into the model store), or under ``tasks:`` in a fleet YAML — and every
model of the task must match it: same inputs (name, datatype, shape with ``-1`` for any
size), outputs that its output kind can read. Pure data, no I/O.

Fleet YAML form::

    tasks:
      spam:
        kind: classification          # classification | multilabel | detection |
                                      # regression | embedding (or a registered kind)
        input: {name: tokens, datatype: INT64, shape: [-1, 256]}
        outputs: {scores: logits}     # role -> output tensor name (the kind's roles)
        labels: [ham, spam]
        options: {probabilities: false}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tierlink.errors import ConfigError
from tierlink.models.tensors import TensorDecl, tensor_decl


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task: its inputs, its output kind, which output tensor plays which role for that
    kind (e.g. ``scores`` for a classifier, ``boxes``/``scores`` for a detector), class
    labels where they apply, and kind options (e.g. ``probabilities: true`` when the
    classifier already outputs probabilities, ``tolerance`` for regression)."""

    name: str  # the task's name (in a fleet file: its key under `tasks:` unless given)
    # the output kind: classification (the default), multilabel, detection, regression,
    # embedding, or one a plugin registers
    kind: str
    # the tensors a request carries, each {name, datatype, shape} (-1: any size)
    inputs: tuple[TensorDecl, ...]
    # role -> output tensor name, for the roles the kind reads (e.g. scores: logits)
    outputs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    labels: tuple[str, ...] = ()  # class names, in the order of the model's outputs
    # the kind's options, e.g. probabilities: true, or tolerance for regression
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind,
                "inputs": [i.to_dict() for i in self.inputs], "outputs": dict(self.outputs),
                "labels": list(self.labels), "options": dict(self.options)}

    def option(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)

    def output(self, role: str) -> str | None:
        return self.outputs.get(role)


def task_from_dict(name: str, raw: Any, where: str = "tasks") -> TaskSpec:
    """Parse one task declaration (the fleet YAML's or a model store's JSON form)."""
    here = f"{where}.{name}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{here} must be a mapping")
    known = {"name", "kind", "input", "inputs", "outputs", "labels", "options"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{here}: unknown key(s) {unknown}", hint=f"known: {sorted(known)}")
    decls = raw.get("inputs", [raw["input"]] if "input" in raw else None)
    if not decls or not isinstance(decls, list):
        raise ConfigError(f"{here} declares no input",
                          hint="input: {name: x, datatype: FP32, shape: [-1, 3, 32, 32]}")
    outputs = raw.get("outputs") or {}
    if not isinstance(outputs, Mapping):
        raise ConfigError(f"{here}.outputs must map roles to output names, e.g. "
                          "{scores: logits}")
    labels = raw.get("labels") or []
    if not isinstance(labels, list):
        raise ConfigError(f"{here}.labels must be a list of class names, e.g. [cat, dog]")
    options = raw.get("options") or {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"{here}.options must be a mapping")
    return TaskSpec(name=str(raw.get("name", name)), kind=str(raw.get("kind", "classification")),
                    inputs=tuple(tensor_decl(d, f"{here}.inputs[{i}]")
                                 for i, d in enumerate(decls)),
                    outputs=MappingProxyType({str(k): str(v) for k, v in outputs.items()}),
                    labels=tuple(str(x) for x in labels),
                    options=MappingProxyType(dict(options)))


def same_inputs(a: TaskSpec, b: TaskSpec) -> bool:
    return len(a.inputs) == len(b.inputs) and all(
        x.matches(y) for x, y in zip(a.inputs, b.inputs, strict=True))
