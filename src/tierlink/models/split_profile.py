"""A model's split profile: how long each head and tail of its cuts took on one machine.

The file ``<model>.splits.json`` beside the card (made by ``tierlink split profile``,
:func:`tierlink.split.profile.profile_model`); a node reads it with the card and reports it
with its heartbeat (``ModelView.splits``), so any policy can price a split plan. Version 1
profiles (no codecs) still load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierlink.core.types import SplitPoint
from tierlink.durable import write_json
from tierlink.errors import ModelError

PROFILE_VERSION = 2
READS_VERSIONS = (1, 2)


@dataclass(frozen=True, slots=True)
class SplitProfile:
    """Every cut of one model file as timed on one machine (``host``)."""

    model: str
    sha256: str
    host: str
    full_ms: float
    input_bytes: int
    points: tuple[SplitPoint, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"version": PROFILE_VERSION, "model": self.model, "sha256": self.sha256,
                "host": self.host, "full_ms": self.full_ms, "input_bytes": self.input_bytes,
                "points": [p.to_dict() for p in self.points]}


def profile_path(card_path: Path) -> Path:
    """Where the split profile of the model whose card is ``card_path`` lives."""
    return card_path.with_name(card_path.stem + ".splits.json")


def load_profile(path: Path, sha256: str | None = None) -> SplitProfile | None:
    """The profile at ``path``; None when absent or made for another file (``sha256``)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read split profile {path}: {exc}") from exc
    if data.get("version") not in READS_VERSIONS or (sha256 and data.get("sha256") != sha256):
        return None
    try:
        points = tuple(SplitPoint.from_dict(p) for p in data["points"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"split profile {path} is malformed: {exc}") from exc
    return SplitProfile(str(data["model"]), str(data["sha256"]), str(data["host"]),
                        float(data["full_ms"]), int(data["input_bytes"]), points)


def save_profile(profile: SplitProfile, path: Path) -> None:
    """Write ``profile`` as JSON atomically."""
    write_json(path, profile.to_dict(), "split profile")
