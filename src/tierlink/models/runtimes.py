"""Runtimes through one registry: a model's card names its format, the registry maps the
format to the runtime that serves it.

Formats and their built-in runtimes (declared under the ``tierlink.runtimes`` entry-point
group in tierlink's ``pyproject.toml``; a user's package adds its own there):

========== ==================================================================
onnx       one ONNX graph in ONNX Runtime, on the node's execution providers
multi-exit a multi-exit model's ONNX segments, answering at the first sure exit
python     a user's Python class with ``load()`` and ``predict(inputs) -> outputs``
llm        a decoder language model on tierlink's torch decoder (chat; not a tensor runtime)
gguf       a GGUF language model as it ships, on llama.cpp (``./scripts/setup.sh --llama``)
========== ==================================================================

A runtime factory takes a :class:`LoadSpec` and returns the runtime. Who hosts it is the
node's engine: in its own process, or a Ray Serve replica (``tierlink.node.ray_serve``),
at node start and at every version install or rollback alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierlink.core.registry import Registry
from tierlink.errors import ModelError
from tierlink.models.card import ModelCard, load_card
from tierlink.models.onnx import DEFAULT_PROVIDERS

ENTRY_POINT_GROUP = "tierlink.runtimes"


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What a runtime needs to load one model version: its card (its files sit beside it),
    its main file where the format has one (``model.onnx``), and how to run it here."""

    card: Path
    model_file: Path | None = None
    providers: tuple[str, ...] = DEFAULT_PROVIDERS
    threads: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)  # format-specific serving options

    @property
    def directory(self) -> Path:
        return self.card.parent

    def read_card(self) -> ModelCard:
        """The card; ``ModelError`` naming the file when it cannot be read."""
        return load_card(self.card)


RuntimeFactory = Callable[[LoadSpec], Any]


_REGISTRY: Registry[RuntimeFactory] | None = None


def registry() -> Registry[RuntimeFactory]:
    """The process-wide runtime registry (entry points read on first use)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry(ENTRY_POINT_GROUP, "model format")
    return _REGISTRY


def load(spec: LoadSpec, fmt: str | None = None) -> Any:
    """The runtime of the model ``spec`` describes, chosen by its card's format (or
    ``fmt``, where the caller knows it: a fleet file's ``llms:``)."""
    fmt = fmt or spec.read_card().format
    try:
        factory = registry().get(fmt)
    except Exception as exc:
        raise ModelError(f"{spec.card} names format {fmt!r}, which no runtime serves here",
                         hint=f"installed runtimes: {', '.join(registry().names())}; a "
                              f"package adds one under the {ENTRY_POINT_GROUP!r} entry "
                              "points") from exc
    return factory(spec)
