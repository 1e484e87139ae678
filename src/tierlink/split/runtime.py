"""Heads and tails of one model, made on demand and kept: what a node runs for split plans.

A device that may start a split plan holds the model file and runs ``head(cut)``; the
upstream node that serves the model runs ``tail(cut)`` on the decoded features. Segments
are cut with :func:`tierlink.split.partition.split_model` the first time a cut is used
(milliseconds for these models), written under ``workdir``, and their ONNX Runtime sessions
kept for the life of the node. Thread-safe: scheduler workers call it concurrently.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.errors import SplitError


class SplitSessions:
    """Head and tail sessions of the model at ``model_path``, by cut tensor name."""

    def __init__(self, name: str, model_path: Path, workdir: Path) -> None:
        self.name = name
        self.model_path = Path(model_path)
        self.workdir = Path(workdir)
        self._sessions: dict[tuple[str, str], Any] = {}
        self._cuts: frozenset[str] | None = None
        self._lock = threading.Lock()

    def cuts(self) -> frozenset[str]:
        """The tensors this model may be cut at."""
        if self._cuts is None:
            from tierlink.split.partition import cut_points

            self._cuts = frozenset(c.tensor for c in cut_points(self.model_path) if c.index > 0)
        return self._cuts

    def ready(self, cut: str) -> bool:
        """Whether the sessions for ``cut`` exist (``prepare`` has nothing to do)."""
        return ("head", cut) in self._sessions

    def prepare(self, cut: str) -> None:
        """Cut the model at ``cut``, open both sessions and run each once now (blocking;
        0.1-0.3 s for MobileNetV2 on a free core, ten times that under a 0.1-core quota):
        done before the scheduler runs a segment, so the time it learns is the segment's,
        not this one-off cost."""
        self._session("head", cut)

    def head(self, cut: str, x: np.ndarray) -> np.ndarray:
        """Run input -> ``cut`` on ``x`` (N, ...) and return the cut tensor."""
        session = self._session("head", cut)
        return session.run(None, {session.get_inputs()[0].name: x})[0]

    def tail(self, cut: str, features: np.ndarray) -> dict[str, np.ndarray]:
        """Run ``cut`` -> the model's outputs on ``features``; outputs by name."""
        session = self._session("tail", cut)
        names = [o.name for o in session.get_outputs()]
        expected = session.get_inputs()[0]
        _check_features(self.name, cut, expected.shape, features)
        return dict(zip(names, session.run(None, {expected.name: features}), strict=True))

    def _session(self, part: str, cut: str) -> Any:
        key = (part, cut)
        session = self._sessions.get(key)
        if session is not None:
            return session
        if cut not in self.cuts():
            raise SplitError(f"{self.name} cannot be cut at {cut!r}",
                             hint="list the cut points with `tierlink split list MODEL`")
        with self._lock:
            if key not in self._sessions:
                self._sessions.update(self._make(cut))
        return self._sessions[key]

    def _make(self, cut: str) -> dict[tuple[str, str], Any]:
        from tierlink.split.partition import split_model
        from tierlink.zoo.evaluate import ort_session

        self.workdir.mkdir(parents=True, exist_ok=True)
        tag = hashlib.sha1(f"{self.model_path}:{cut}".encode()).hexdigest()[:12]
        head, tail = split_model(self.model_path, cut, self.workdir / f"{tag}.head.onnx",
                                 self.workdir / f"{tag}.tail.onnx")
        sessions = {("head", cut): ort_session(head, threads=1),
                    ("tail", cut): ort_session(tail, threads=1)}
        for session in sessions.values():
            _run_once(session)
        return sessions


def _run_once(session: Any) -> None:
    """One run on zeros (batch 1), so the first real call does not pay for the session's
    lazy initialisation: a node learns a segment's service time from its calls, and a
    first one several times slower would make the cut look slow until it ran again."""
    feed = {i.name: np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in i.shape],
                             dtype=np.float32)
            for i in session.get_inputs()}
    session.run(None, feed)


def _check_features(model: str, cut: str, shape: Any, features: np.ndarray) -> None:
    """A clear error for features of the wrong rank or size, before ONNX Runtime sees them."""
    want = [d if isinstance(d, int) and d > 0 else -1 for d in shape]
    if features.dtype != np.float32 or features.ndim != len(want) or any(
            w != -1 and w != g for w, g in zip(want, features.shape, strict=True)):
        raise SplitError(f"features for {model} at {cut!r} must be FP32 of shape {want} "
                         f"(-1 = any), got {features.dtype} {list(features.shape)}")
