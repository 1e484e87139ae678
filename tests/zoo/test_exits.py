"""The multi-exit model: built once with the ``test`` profile into a temporary directory."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from tierlink.errors import ConfigError, ModelError, TensorError, ZooError
from tierlink.models.card import card_from_dict
from tierlink.models.evaluate import CASCADE_THRESHOLDS, softmax
from tierlink.models.exit_runner import (
    NEVER,
    ExitRunner,
    ExitScores,
    Handoff,
    choose_thresholds,
    evaluate_exits,
    evaluate_scores,
    exit_logits,
)
from tierlink.models.onnx import ort_session
from tierlink.zoo.datasets import DEFAULT_ROOT, fashion_mnist
from tierlink.zoo.exits import ensure_exits, exits_dir, load_exits

needs_data = pytest.mark.skipif(not DEFAULT_ROOT.is_dir(),
                                reason="apt-get install -y dataset-fashion-mnist")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.set_num_threads(1)
    if not DEFAULT_ROOT.is_dir():
        pytest.skip("apt-get install -y dataset-fashion-mnist")
    return ensure_exits("test", root=tmp_path_factory.mktemp("zoo"))


@pytest.fixture(scope="module")
def test_split():
    return fashion_mnist().test


@pytest.fixture(scope="module")
def images(test_split):
    return test_split.input[:64]


def _sessions(model):
    return [ort_session(p) for p in model.segment_paths]


# --- the exported graphs --------------------------------------------------------------------


@needs_data
def test_segments_chained_equal_the_whole_graph(model, images):
    whole = ort_session(model.whole_path).run(None, {"input": images})
    chained = exit_logits(_sessions(model), images)
    assert len(whole) == len(chained) == 3
    for w, c in zip(whole, chained, strict=True):
        assert w.shape == c.shape == (64, 10)
        np.testing.assert_allclose(c, w, atol=1e-5, rtol=0)


@needs_data
def test_segments_have_named_io_dynamic_batch_and_folded_batchnorm(model):
    io = {0: ("input", ["features1", "exit1"]), 1: ("features1", ["features2", "exit2"]),
          2: ("features2", ["logits"])}
    x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
    for k, path in enumerate(model.segment_paths):
        session = ort_session(path)
        assert session.get_inputs()[0].name == io[k][0]
        assert [o.name for o in session.get_outputs()] == io[k][1]
        outs = session.run(None, {io[k][0]: x})
        assert all(o.shape[0] == 3 for o in outs)
        x = outs[0]
        ops = {node.op_type for node in onnx.load(str(path)).graph.node}
        assert "Conv" in ops and "BatchNormalization" not in ops


# --- the card -------------------------------------------------------------------------------


@needs_data
def test_card_describes_exits_segments_and_boundaries(model):
    card, training = model.net, model.card.training
    assert (model.card.name, model.card.task, model.card.format, card.base_variant) == (
        "fmnist-exits", "fmnist", "multi-exit", "large")
    assert model.card.inputs[0].shape == (-1, 1, 28, 28)
    assert model.card.test_accuracy == card.operating_point.test.accuracy
    assert [e.name for e in card.exits] == ["exit1", "exit2", "logits"]
    assert [(b.name, b.shape, b.fp32_bytes) for b in card.boundaries] == [
        ("features1", (32, 14, 14), 32 * 14 * 14 * 4), ("features2", (64, 7, 7), 64 * 49 * 4)]
    assert training.profile == "test" and training.train_samples == 2048
    for exit_ in card.exits:
        assert 0.1 < exit_.test_accuracy <= 1 and 0.1 < exit_.calib_accuracy <= 1
        assert exit_.temperature == exit_.calibration.temperature > 0
        assert exit_.calibration.samples == training.calib_samples == 1000
        assert [p.threshold for p in exit_.cascade] == list(CASCADE_THRESHOLDS)
    for segment in card.segments:
        assert segment.macs > 0 and segment.size_bytes > 0
        assert set(segment.latency_ms) == {"batch1_p50", "batch1_p95", "batch32_per_sample"}
    # Stage 1 plus its small exit is far cheaper than the stages after it.
    assert card.segments[0].macs < card.segments[1].macs / 5
    point = card.operating_point
    assert sum(point.calib.shares) == pytest.approx(1.0)
    assert point.calib.accuracy >= card.exits[-1].calib_accuracy - point.max_drop - 1e-9
    assert point.calib.full_ms == pytest.approx(sum(card.stage_ms()))


@needs_data
def test_card_round_trips_through_json_and_rejects_a_missing_field(model):
    data = json.loads(model.card_path.read_text())
    assert card_from_dict(data) == model.card
    del data["multi_exit"]["exits"][1]["calibration"]
    with pytest.raises(ModelError, match="calibration"):
        card_from_dict(data)


@needs_data
def test_calibration_lowers_the_final_exits_ece_on_the_calibration_split(model):
    final = model.net.exits[-1].calibration
    assert final.ece_after < final.ece_before
    for exit_ in model.net.exits:  # the fit minimises NLL: never worse than T = 1
        assert exit_.calibration.nll_after <= exit_.calibration.nll_before + 1e-6


# --- the cache ------------------------------------------------------------------------------


@needs_data
def test_ensure_is_idempotent_and_a_changed_file_is_stale(model, tmp_path):
    root = model.root.parents[1]  # <zoo>/fmnist-exits/<version>
    before = {p: p.stat().st_mtime_ns for p in model.root.iterdir()}
    again = ensure_exits("test", root=root)
    assert again == model and exits_dir("test", root) == model.root
    assert {p: p.stat().st_mtime_ns for p in model.root.iterdir()} == before
    copy_root = tmp_path / "zoo"
    shutil.copytree(root, copy_root)
    with open(exits_dir("test", copy_root) / "fmnist-exits-s2.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ZooError, match="sha256"):
        load_exits("test", copy_root)


@needs_data
def test_a_malformed_card_is_a_zoo_error_so_ensure_rebuilds(model, tmp_path):
    copy_root = tmp_path / "zoo"
    shutil.copytree(model.root.parents[1], copy_root)  # the zoo holding it
    (exits_dir("test", copy_root) / "card.json").write_text('{"name": 1}')
    with pytest.raises(ZooError, match="malformed"):
        load_exits("test", copy_root)


def test_loading_a_zoo_without_the_model_says_so(tmp_path):
    with pytest.raises(ZooError, match="not built"):
        load_exits("test", tmp_path)


def test_importing_the_module_does_not_import_torch():
    code = ("import sys, tierlink.zoo.exits, tierlink.models.exits; "
            "sys.exit('torch' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], check=False, env=env).returncode == 0


# --- the runner -----------------------------------------------------------------------------


@needs_data
def test_runner_stops_at_the_first_exit_when_its_threshold_is_zero(model, images):
    result = ExitRunner(model, (0.0, 0.0)).run(images[:1])
    assert result.exit_index == 0 and len(result.ms_per_stage) == 1
    assert result.probs.shape == (10,) and result.probs.sum() == pytest.approx(1.0)
    logits = ort_session(model.whole_path).run(None, {"input": images[:1]})[0]
    np.testing.assert_allclose(result.probs, softmax(logits, model.net.temperatures[0])[0],
                               atol=1e-5)


@needs_data
def test_runner_runs_every_stage_when_thresholds_are_never_met(model, images):
    whole = ort_session(model.whole_path)
    for threshold in (1.0 + 1e-9, NEVER):
        runner = ExitRunner(model, (threshold, threshold))
        for x in images[:5]:
            result = runner.run(x[None])
            assert result.exit_index == 2 and len(result.ms_per_stage) == 3
            final = whole.run(None, {"input": x[None]})[2]
            assert result.label == int(final.argmax())
            assert result.confidence == pytest.approx(result.probs.max())


@needs_data
def test_runner_hands_off_features_at_a_split_and_resumes_upstream(model, images):
    x = images[:1]
    device = ExitRunner(model, (NEVER, NEVER))
    handoff = device.run_segments(x, stop=0)
    assert isinstance(handoff, Handoff) and handoff.boundary == "features1"
    assert handoff.features.shape == (1, 32, 14, 14) and len(handoff.ms_per_stage) == 1
    resumed = device.run_segments(handoff.features, start=1)
    assert resumed.exit_index == 2
    np.testing.assert_allclose(resumed.probs, device.run(x).probs, atol=1e-6)


@needs_data
def test_runner_rejects_bad_inputs_and_thresholds(model, images):
    with pytest.raises(TensorError):
        ExitRunner(model, (0.5, 0.5)).run(images[:2])
    with pytest.raises(ConfigError):
        ExitRunner(model, (0.5,))
    with pytest.raises(ConfigError):
        ExitRunner(model, (0.5, float("nan")))
    with pytest.raises(ConfigError):
        ExitRunner(model, (0.5, 0.5)).run_segments(images[:1], start=2, stop=1)


@needs_data
def test_evaluate_exits_matches_the_card_at_the_extremes(model, test_split):
    test = test_split.head(model.card.training.test_samples)
    final = evaluate_exits(model, (NEVER, NEVER), test)
    assert final.shares == (0.0, 0.0, 1.0) and final.saved == pytest.approx(0.0)
    assert final.accuracy == pytest.approx(model.net.exits[-1].test_accuracy)
    first = evaluate_exits(model, (0.0, 0.0), test)
    assert first.shares == (1.0, 0.0, 0.0)
    assert first.accuracy == pytest.approx(model.net.exits[0].test_accuracy)
    assert first.mean_ms == pytest.approx(model.net.stage_ms()[0])


# --- threshold evaluation (pure) ------------------------------------------------------------


def _scores():
    # 4 inputs, 3 exits; exit 0 is right on inputs 0-1, exit 1 on 0-2, the final on all.
    confidence = np.array([[0.99, 0.6, 0.7, 0.2], [0.9, 0.95, 0.5, 0.4], [1.0, 1.0, 1.0, 1.0]])
    correct = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=bool)
    return ExitScores(confidence, correct)


def test_evaluate_scores_routes_each_input_to_its_first_confident_exit():
    ev = evaluate_scores(_scores(), (0.65, 0.9), stage_ms=(1.0, 2.0, 4.0))
    # Input 0 and 2 exit at 0 (0.99, 0.7), input 1 at exit 1 (0.95), input 3 at the end.
    assert ev.shares == (0.5, 0.25, 0.25)
    assert ev.accuracy == 0.75  # input 2 answered wrongly at exit 0
    assert ev.mean_ms == pytest.approx((1 + 3 + 1 + 7) / 4) and ev.full_ms == 7.0
    assert ev.saved == pytest.approx(1 - 3 / 7)


def test_choose_thresholds_is_the_cheapest_setting_within_the_drop():
    scores = _scores()
    exact = choose_thresholds(scores, (1.0, 2.0, 4.0), max_drop=0.0)
    # Exit 0 must skip input 2 (0.7, wrong), exit 1 input 3 (0.4, wrong); the lowest such
    # thresholds on the grid send inputs 0 and 2 out early: (1 + 3 + 3 + 7) / 4 ms.
    assert exact.accuracy == 1.0 and exact.thresholds == (0.75, 0.5)
    assert exact.mean_ms == pytest.approx(3.5) and exact.shares == (0.25, 0.5, 0.25)
    loose = choose_thresholds(scores, (1.0, 2.0, 4.0), max_drop=0.25)
    assert loose.accuracy == 0.75 and loose.mean_ms == pytest.approx(2.5)
    with pytest.raises(ConfigError):
        evaluate_scores(scores, (0.5,), (1.0, 2.0, 4.0))
