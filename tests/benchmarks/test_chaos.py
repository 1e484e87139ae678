"""The pure parts of ``benchmarks/chaos.py``: growth per process incarnation, SLA by
priority, which error codes count as explained. No fleet is started."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str, path: Path) -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # chaos imports the fault suite's load threads
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


chaos = _load("chaos_benchmark", BENCHMARKS / "chaos.py")


def test_growth_compares_the_last_minute_with_the_first_after_warm_up() -> None:
    # (seconds, rss KiB, open files): 30 s of warm-up at 50 MiB, then 100 -> 120 MiB
    samples = [(float(t), 50_000 if t < 30 else 100_000 + 100 * (t - 30), 20)
               for t in range(0, 241, 5)]
    g = chaos.growth(samples, warmup_s=30.0)
    assert g["judged"] and g["open_files_growth"] == 1.0
    first = sum(100_000 + 100 * (t - 30) for t in range(30, 91, 5)) / 13
    last = sum(100_000 + 100 * (t - 30) for t in range(180, 241, 5)) / 13
    assert g["rss_growth"] == pytest.approx(last / first, rel=1e-4)


def test_a_short_incarnation_is_listed_not_judged() -> None:
    g = chaos.growth([(float(t), 1000, 10) for t in range(0, 100, 5)], warmup_s=30.0)
    assert not g["judged"] and g["life_s"] == 95.0


def test_every_code_of_the_error_tree_is_explained() -> None:
    codes = chaos._codes()
    assert {"deadline_exceeded", "admission_refused", "privacy_violation",
            "upstream_unavailable"} <= set(codes)
