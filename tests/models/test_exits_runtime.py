"""The multi-exit model as a node serves it: early exit per sample, split at its exit
boundaries (head may answer before the cut), and the split points the policy prices."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tierlink.core.types import LinkView
from tierlink.errors import ModelError, SplitError, TensorError
from tierlink.estimate.split import IDENTITY, SegmentProfile, best
from tierlink.models.exits import (
    ExitsModel,
    exit_split_points,
    find_exit_card,
    is_exit_card,
    load_exits_model,
)
from tierlink.zoo.datasets import DEFAULT_ROOT

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ExitsModel:
    from tierlink.zoo.exits import ensure_exits

    torch.set_num_threads(1)
    if not DEFAULT_ROOT.is_dir():
        pytest.skip("apt-get install -y dataset-fashion-mnist")
    built = ensure_exits("test", root=tmp_path_factory.mktemp("zoo"))
    return ExitsModel(built.card_path)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    from tierlink.zoo.datasets import fashion_mnist

    return fashion_mnist().test.input[:40]


def test_split_points_price_only_the_inputs_that_pass_the_exits() -> None:
    points = exit_split_points((1.0, 2.0, 3.0), (0.8, 0.1, 0.1),
                               [("features1", 1000), ("features2", 500)])
    first, second = points
    assert (first.cut, first.feature_bytes) == ("features1", 1000)
    assert first.continue_share == pytest.approx(0.2)
    assert first.head_ms == pytest.approx(1.0)
    assert first.tail_ms == pytest.approx((2.0 * 0.2 + 3.0 * 0.1) / 0.2)
    assert second.continue_share == pytest.approx(0.1)
    assert second.head_ms == pytest.approx(1.0 + 2.0 * 0.2)
    assert second.tail_ms == pytest.approx(3.0)


def test_weak_uplink_exits_on_the_device_strong_uplink_offloads_the_hard_inputs() -> None:
    """The joint (exit, split) choice: a slow device and a fast link send the 20% its first
    exit cannot answer; a slow link keeps everything here (early exits included)."""
    points = exit_split_points((5.0, 20.0, 20.0), (0.8, 0.1, 0.1),
                               [("features1", 25_088), ("features2", 12_544)])
    segments = [SegmentProfile(p.cut, p.head_ms, p.tail_ms / 10.0, p.feature_bytes,
                               continue_share=p.continue_share) for p in points]
    local_ms = 5.0 + 20.0 * 0.2 + 20.0 * 0.1  # the whole model here, exiting early
    segments.append(SegmentProfile("<local>", local_ms, 0.0, 0))
    fast = LinkView("dev", "cloud", rtt_ms=2.0, bandwidth_mbit=1000.0)
    slow = LinkView("dev", "cloud", rtt_ms=80.0, bandwidth_mbit=1.0)
    assert best(segments, (IDENTITY,), fast).cut == "features1"
    assert best(segments, (IDENTITY,), slow).cut == "<local>"


def test_infer_stops_at_the_first_confident_exit(model: ExitsModel, images: np.ndarray) -> None:
    from tierlink.models.exit_runner import ExitModel, ExitRunner

    out = model.infer({"input": images})
    assert out["logits"].shape == (len(images), 10) and out["exit"].shape == (len(images),)
    runner = ExitRunner(ExitModel(model.path.parent, model.card), model.thresholds)
    for i in range(len(images)):
        ref = runner.run(images[i:i + 1])
        assert out["exit"][i] == ref.exit_index
        assert np.allclose(np.exp(out["logits"][i]), ref.probs, atol=1e-6)
    assert is_exit_card(model.path.parent / "card.json")


def test_head_then_tail_gives_the_whole_models_answer(model: ExitsModel,
                                                      images: np.ndarray) -> None:
    """A batch split at the first boundary: the exits there answer what they can, the rest
    is finished upstream, and together they are the whole model's early-exit answers."""
    whole = model.infer({"input": images})
    cut = model.card.multi_exit.boundaries[0].name
    head = model.head(cut, images)
    answered = [a is not None for a in head.answers]
    assert answered == (whole["exit"] == 0).tolist()
    assert head.features is not None and len(head.features) == answered.count(False)
    tail = model.tail(cut, head.features)
    assert (tail["exit"] > 0).all()
    merged = head.merge(np.exp(tail["logits"]))
    assert np.allclose(merged, np.exp(whole["logits"]), atol=1e-5)
    single = model.head(cut, images[int(np.argmax(whole["exit"] == 0))][None])
    assert single.features is None and single.exits == (0,)


def test_bad_cuts_and_inputs_are_clear_errors(model: ExitsModel, images: np.ndarray) -> None:
    with pytest.raises(SplitError, match="exit boundaries"):
        model.head("features9", images[:1])
    with pytest.raises(TensorError):
        model.head(model.card.multi_exit.boundaries[0].name, images[:, :, :10])
    with pytest.raises(TensorError):
        model.infer({"input": images[:, :, :10]})


def test_a_directory_finds_its_one_exit_card_whatever_its_name(model: ExitsModel,
                                                              images: np.ndarray,
                                                              tmp_path: Path) -> None:
    """Given a directory, the runtime takes the one multi-exit card there (other JSON files
    are not cards of this kind); the runtime factory loads from a LoadSpec-like card path."""
    source = model.path.parent
    copy = tmp_path / "renamed"
    shutil.copytree(source, copy)
    (copy / "card.json").rename(copy / "my-exits.json")
    (copy / "notes.json").write_text('{"name": "not a multi-exit card"}')
    assert find_exit_card(copy) == copy / "my-exits.json"
    from_dir = ExitsModel(copy)
    assert from_dir.path == copy / model.card.file
    assert np.array_equal(from_dir.infer({"input": images[:8]})["exit"],
                          model.infer({"input": images[:8]})["exit"])
    loaded = load_exits_model(SimpleNamespace(card=copy / "my-exits.json", model_file=None,
                                              providers=("CPUExecutionProvider",), threads=1))
    assert isinstance(loaded, ExitsModel) and loaded.card == model.card
    shutil.copy(copy / "my-exits.json", copy / "other-exits.json")
    with pytest.raises(ModelError, match="exactly one"):
        ExitsModel(copy)
    with pytest.raises(ModelError, match="found none"):
        ExitsModel(tmp_path)
