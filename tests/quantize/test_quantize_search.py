"""Settings validation, the pure sensitivity / mixed-precision search, verdicts, INT4
packing: no ONNX model needed."""

from __future__ import annotations

import numpy as np
import pytest

from tierlink.errors import ModelError, ModelNotFound, QuantizationError
from tierlink.quantize.methods import pack_int4
from tierlink.quantize.sensitivity import by_sensitivity, layer_sensitivity, mixed_search
from tierlink.quantize.settings import QuantSettings, precision_for
from tierlink.quantize.variants import split_variant_name, variant_name, verdict

LAYERS = (("conv1", "Conv"), ("conv2", "Conv"), ("fc1", "Gemm"), ("fc2", "Gemm"))
DROPS = {"conv1": 0.004, "conv2": 0.001, "fc1": 0.003, "fc2": 0.0}  # alone, in 0..1
BASELINE = 0.90


def fake_evaluate(calls: list[tuple[str, ...]]):
    """Quantized layers cost their drop, additively; excluded (FP32) layers cost nothing."""
    def evaluate(excluded: tuple[str, ...]) -> float:
        calls.append(excluded)
        return BASELINE - sum(d for name, d in DROPS.items() if name not in excluded)
    return evaluate


def test_sensitivity_quantizes_one_layer_at_a_time() -> None:
    calls: list[tuple[str, ...]] = []
    sens = layer_sensitivity(LAYERS, fake_evaluate(calls), BASELINE)
    assert [s.layer for s in sens] == ["conv1", "conv2", "fc1", "fc2"]
    assert [s.drop_pt for s in sens] == pytest.approx([0.4, 0.1, 0.3, 0.0])
    assert calls[0] == ("conv2", "fc1", "fc2")  # everything but conv1 stays FP32
    assert by_sensitivity(sens) == ("conv1", "fc1", "conv2", "fc2")


@pytest.mark.parametrize(("budget", "kept"), [
    (1.0, ()),                   # all INT8 costs 0.8 pt
    (0.5, ("conv1",)),           # 0.4 pt once conv1 is FP32
    (0.1, ("conv1", "fc1")),     # 0.1 pt
    (0.0, ("conv1", "fc1", "conv2")),
])
def test_mixed_search_keeps_the_fewest_sensitive_layers_that_meet_the_budget(
        budget: float, kept: tuple[str, ...]) -> None:
    evaluate = fake_evaluate([])
    plan = mixed_search(layer_sensitivity(LAYERS, evaluate, BASELINE), evaluate, BASELINE,
                        budget)
    assert plan.met and plan.kept_fp32 == kept
    assert plan.drop_pt <= budget + 1e-9
    assert plan.trials[-1] == (kept, plan.accuracy)


def test_mixed_search_reports_an_unmet_budget() -> None:
    def noisy(excluded: tuple[str, ...]) -> float:
        return BASELINE - 0.02  # even all-FP32 misses: a noisy evaluator
    plan = mixed_search(layer_sensitivity(LAYERS, noisy, BASELINE), noisy, BASELINE, 0.5)
    assert not plan.met and len(plan.trials) == len(LAYERS) + 1


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"precision": "int3"}, "precision"), ({"calibration": "kl"}, "calibration"),
    ({"calib_size": 0}, "calib_size"), ({"activation_type": "fp8"}, "activation_type"),
    ({"block_size": 24}, "block_size"), ({"budget_pt": -1.0}, "budget_pt"),
])
def test_bad_settings_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(QuantizationError, match=field) as err:
        QuantSettings(**kwargs)
    assert isinstance(err.value, ModelError) and err.value.hint


def test_precision_names_and_variant_names() -> None:
    assert precision_for("int8") == "int8-static" and precision_for("mixed") == "mixed"
    assert precision_for("int4-weight") == "int4-weight"
    with pytest.raises(QuantizationError, match="int9"):
        precision_for("int9")
    bases = ("fmnist-small", "fmnist-large")
    assert variant_name("fmnist-small", "int8-dynamic") == "fmnist-small-int8dyn"
    assert split_variant_name("fmnist-small-mixed", bases) == ("fmnist-small", "mixed")
    assert split_variant_name("fmnist-large-int4w", bases) == ("fmnist-large", "int4-weight")
    with pytest.raises(ModelNotFound):
        split_variant_name("fmnist-small-int2", bases)
    with pytest.raises(ModelNotFound):
        split_variant_name("fmnist-huge-int8", bases)


@pytest.mark.parametrize(("delta", "speedup", "size", "expected"), [
    (-0.3, 1.5, 0.3, "pays"),
    (-0.6, 1.5, 0.3, "does not pay"),      # over budget
    (0.0, 1.0, 0.5, "smaller only"),
    (0.0, 1.0, 0.95, "does not pay"),      # neither smaller nor faster
    (0.0, 0.5, 0.3, "does not pay"),       # slower
])
def test_verdict_rule(delta: float, speedup: float, size: float, expected: str) -> None:
    assert verdict(delta, speedup, size, budget_pt=0.5) == expected


def test_pack_int4_round_trips_within_half_a_step() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(10, 70)).astype(np.float32)  # K=70: padded to 3 blocks of 32
    packed, scales, zeros = pack_int4(w, 32)
    assert packed.shape == (10, 3, 16) and scales.shape == (30,) and zeros.shape == (20,)
    q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(10, 3, 32).astype(np.float32)
    zp = np.stack([zeros & 0x0F, zeros >> 4], axis=-1).reshape(10, 4)[:, :3]
    deq = ((q - zp[..., None]) * scales.reshape(10, 3)[..., None]).reshape(10, 96)[:, :70]
    step = scales.reshape(10, 3).repeat(32, axis=1)[:, :70]
    assert np.all(np.abs(deq - w) <= step / 2 + 1e-6)
