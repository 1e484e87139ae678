"""Builds the ``test`` profile once into a temporary TIERLINK_HOME and checks what came out."""

import hashlib
import io
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from tierlink.core.progress import Reporter
from tierlink.errors import ModelNotFound, ZooError
from tierlink.models.evaluate import CASCADE_THRESHOLDS, accuracy, onnx_logits
from tierlink.models.onnx import ort_session
from tierlink.zoo import Zoo, ensure_zoo, load_zoo, model_names, zoo_dir
from tierlink.zoo.datasets import CLASS_NAMES, DEFAULT_ROOT, fashion_mnist

pytestmark = pytest.mark.skipif(not DEFAULT_ROOT.is_dir(),
                                reason="apt-get install -y dataset-fashion-mnist")

NAMES = ("fmnist-small", "fmnist-medium", "fmnist-large")


@dataclass
class Built:
    zoo: Zoo
    home: Path
    seconds: float
    progress: str  # what the build said on a stream that is not a terminal


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch.set_num_threads(1)
    home = tmp_path_factory.mktemp("tierlink-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIERLINK_HOME", str(home))
        start = time.perf_counter()
        stream = io.StringIO()
        # force: trained here, not taken from the shipped models
        zoo = ensure_zoo(profile="test", progress=Reporter(stream, beat_s=None), force=True)
        yield Built(zoo, home, time.perf_counter() - start, stream.getvalue())


@pytest.fixture(scope="module")
def splits():
    return fashion_mnist()


def test_the_zoo_lands_in_tierlink_home(built):
    assert zoo_dir("test") == built.home / "zoo" / "test" == built.zoo.root
    assert tuple(built.zoo.cards) == NAMES == model_names("fmnist")
    for name in NAMES:
        assert built.zoo.path(name).is_file() and built.zoo.card_path(name).is_file()


def test_the_build_says_a_phase_per_model_in_lines(built):
    lines = built.progress.splitlines()
    for name in NAMES:
        mine = [line.removeprefix(f"{name}: ") for line in lines if line.startswith(name)]
        assert mine[0] == "started" and "exporting" in mine and "evaluating" in mine
        assert mine[-1].startswith("done in ") and "; test " in mine[-1]
    assert "\x1b" not in built.progress  # no terminal codes: it is not a terminal


def test_onnx_models_load_and_take_any_batch(built):
    for name in NAMES:
        session = ort_session(built.zoo.path(name))
        (inp,), (out,) = session.get_inputs(), session.get_outputs()
        assert (inp.name, inp.type, inp.shape[1:]) == ("input", "tensor(float)", [1, 28, 28])
        assert (out.name, out.type, out.shape[1:]) == ("logits", "tensor(float)", [10])
        for batch in (1, 7):
            x = np.random.default_rng(0).random((batch, 1, 28, 28), dtype=np.float32)
            assert session.run(None, {"input": x})[0].shape == (batch, 10)


def test_batchnorm_is_folded_into_the_convolutions(built):
    for name in NAMES:
        graph = onnx.load(str(built.zoo.path(name))).graph
        ops = [node.op_type for node in graph.node]
        assert "Conv" in ops and "BatchNormalization" not in ops, (name, ops)


def test_cards_describe_their_files(built):
    tiers = {"fmnist-small": "device", "fmnist-medium": "edge", "fmnist-large": "cloud"}
    for name, card in built.zoo.cards.items():
        data = built.zoo.path(name).read_bytes()
        assert card.sha256 == hashlib.sha256(data).hexdigest()
        assert card.size_bytes == len(data)
        assert (card.task, card.name, card.version, card.tier) == ("fmnist", name, "1",
                                                                   tiers[name])
        assert card.input.shape == (-1, 1, 28, 28) and card.output.shape == (-1, 10)
        assert card.labels == CLASS_NAMES
        cal = card.calibration
        assert cal is not None and card.temperature == cal.temperature > 0
        # The quick CI models are over-confident: scaling must help on the calibration split.
        assert cal.ece_after < cal.ece_before and cal.nll_after <= cal.nll_before
        assert 0.3 < card.test_accuracy <= 1.0 and 0.3 < card.calib_accuracy <= 1.0
        lat = card.latency_ms
        assert 0 < lat["batch1_p50"] <= lat["batch1_p95"] and lat["batch32_per_sample"] > 0
        t = card.training
        assert (t.profile, t.epochs, t.seed, t.train_samples) == ("test", 1, 0, 2048)
        assert t.torch_version == torch.__version__ and t.seconds > 0 and t.recipe


def test_params_fit_their_tiers_and_large_beats_small(built):
    params = {name: card.params for name, card in built.zoo.cards.items()}
    cards = built.zoo.cards
    assert cards["fmnist-large"].test_accuracy > cards["fmnist-small"].test_accuracy
    assert params["fmnist-small"] <= 40_000
    assert 250_000 <= params["fmnist-medium"] <= 350_000
    assert 500_000 <= params["fmnist-large"] <= 800_000


def test_cascade_curves_are_sane(built):
    for card in built.zoo.cards.values():
        curve = card.cascade
        assert tuple(p.threshold for p in curve) == CASCADE_THRESHOLDS
        shares = [p.answered_share for p in curve]
        assert shares == sorted(shares, reverse=True) and shares[0] > 0.2
        assert all(0.0 <= p.answered_accuracy <= 1.0 for p in curve)
        # Confident answers are more often right than all answers (monotone-ish).
        assert curve[-1].answered_accuracy >= curve[0].answered_accuracy - 0.02


def test_card_accuracy_is_reproducible_from_the_onnx_file(built, splits):
    card = built.zoo.card("fmnist-small")
    test = splits.test.head(card.training.test_samples)
    logits = onnx_logits(built.zoo.path("fmnist-small"), test.input, threads=1)
    assert logits.shape == (len(test), 10) and logits.dtype == np.float32
    assert accuracy(logits, test.labels) == card.test_accuracy


def test_a_second_call_uses_the_cache(built, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("ensure_zoo retrained a cached zoo")

    monkeypatch.setattr("tierlink.zoo.build.build_zoo", no_build)
    mtimes = {n: built.zoo.path(n).stat().st_mtime_ns for n in NAMES}
    start = time.perf_counter()
    again = ensure_zoo(profile="test", progress=False)
    assert time.perf_counter() - start < min(5.0, built.seconds / 2)
    assert again.cards == built.zoo.cards
    assert {n: again.path(n).stat().st_mtime_ns for n in NAMES} == mtimes


def test_a_tampered_model_is_rebuilt(built, tmp_path, monkeypatch):
    copy = tmp_path / "zoo"
    shutil.copytree(built.zoo.root, copy)
    assert load_zoo(profile="test", root=copy).cards == built.zoo.cards
    with open(copy / "fmnist-medium" / "1" / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ZooError, match="sha256"):
        load_zoo(profile="test", root=copy)
    calls = []

    def fake_build(task, profile, out_dir, reporter, names):
        calls.append((task, profile.name, out_dir, names))
        shutil.copytree(built.zoo.dir("fmnist-medium"), out_dir / "fmnist-medium" / "1",
                        dirs_exist_ok=True)

    monkeypatch.setattr("tierlink.zoo.build.build_zoo", fake_build)
    zoo = ensure_zoo(profile="test", progress=False, root=copy)
    # Only the tampered model is rebuilt; the valid ones are kept.
    assert calls == [("fmnist", "test", copy, ("fmnist-medium",))]
    assert zoo.cards == built.zoo.cards


def test_unknown_names_are_clear_errors(built):
    with pytest.raises(ZooError, match="profile"):
        ensure_zoo(profile="huge", progress=False)
    with pytest.raises(ZooError, match="task"):
        ensure_zoo(task="imagenet", profile="test", progress=False)
    with pytest.raises(ModelNotFound):
        built.zoo.card("fmnist-xl")
    with pytest.raises(ZooError, match="not built"):
        load_zoo(profile="full", root=built.home / "empty")


def test_training_is_reproducible(splits):
    from tierlink.zoo.build import train_net
    from tierlink.zoo.profiles import TrainRecipe

    torch.set_num_threads(1)
    recipe = TrainRecipe(epochs=1, batch_size=64, flips=True)
    data = splits.train.head(256)
    quiet = Reporter.quiet()
    first = train_net("t", "small", recipe, data, 7, quiet.start("t")).net.state_dict()
    second = train_net("t", "small", recipe, data, 7, quiet.start("t")).net.state_dict()
    other = train_net("t", "small", recipe, data, 8, quiet.start("t")).net.state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_export_refuses_a_graph_that_disagrees_with_torch(tmp_path, splits):
    from tierlink.zoo import build
    from tierlink.zoo.nets import build_net

    torch.manual_seed(0)
    net = build_net("small").eval()
    images = splits.calib.input[:8]
    build.export_onnx(net, tmp_path / "ok.onnx", check_on=images)
    torch.manual_seed(1)
    with pytest.raises(ZooError, match="disagrees"):
        build._verify(build_net("small").eval(), tmp_path / "ok.onnx", images)


def test_one_cycle_warms_up_then_anneals():
    from tierlink.zoo.build import one_cycle

    lrs, moms = zip(*(one_cycle(s, 100, 0.1) for s in range(100)))
    peak = lrs.index(max(lrs))
    assert lrs[0] == pytest.approx(0.1 / 25) and max(lrs) == pytest.approx(0.1)
    assert 25 <= peak <= 31 and lrs[-1] == pytest.approx(0.1 / 25e4)
    assert moms[0] == pytest.approx(0.95) and moms[peak] == pytest.approx(0.85)
    assert list(lrs[peak:]) == sorted(lrs[peak:], reverse=True)


def test_nesterov_sgd_matches_the_textbook_update():
    from tierlink.zoo.build import NesterovSGD

    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = NesterovSGD([p], weight_decay=0.1)
    p.grad = torch.tensor([0.5, 0.5])
    opt.step(lr=0.1, momentum=0.9)
    g = torch.tensor([0.5, 0.5]) + 0.1 * torch.tensor([1.0, -2.0])  # buf = g on step one
    assert torch.allclose(p.detach(), torch.tensor([1.0, -2.0]) - 0.1 * (g + 0.9 * g))
    assert p.grad is None


def test_folding_the_dense_batchnorm_keeps_the_function():
    from tierlink.zoo.nets import build_net, fold_linear_batchnorm

    torch.manual_seed(0)
    net = build_net("large")
    with torch.no_grad():  # non-trivial running statistics, as after training
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 2)
                m.bias.uniform_(-1, 1)
    net.eval()
    folded = fold_linear_batchnorm(net)
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in folded.modules())
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.allclose(folded(x), net(x), atol=1e-5, rtol=1e-5)


def test_distillation_mixes_the_labels_with_the_teachers_soft_answer():
    import torch

    from tierlink.zoo.build import _augment, _distilled
    from tierlink.zoo.profiles import TrainRecipe

    torch.manual_seed(0)
    out, labels = torch.randn(8, 10), torch.randint(0, 10, (8,))
    teacher = torch.randn(8, 10)
    plain = torch.nn.functional.cross_entropy(out, labels)
    assert torch.isclose(_distilled(teacher, TrainRecipe(1, distill=0.0))(out, labels), plain)
    # A student that already answers as the teacher does pays only the label term.
    same = _distilled(out.clone(), TrainRecipe(1, distill=0.5))(out, labels)
    assert torch.isclose(same, 0.5 * plain, atol=1e-6)
    # the mirror mask says which images were flipped, so their teacher logits can follow
    x = torch.arange(8 * 28 * 28, dtype=torch.float32).view(8, 1, 28, 28)
    flipped, mirror = _augment(x, True, torch.Generator().manual_seed(1))
    assert torch.equal(flipped[mirror], x[mirror].flip(3))
    assert torch.equal(flipped[~mirror], x[~mirror])


def test_a_zoo_in_the_old_flat_layout_is_moved_on_first_use(built, tmp_path, caplog):
    """A zoo written before versions (``<name>.onnx`` + ``<name>.json`` [+
    ``<name>.splits.json``] side by side) is moved into ``<name>/<version>/`` on first use,
    said in the log, and nothing is rebuilt: the same cards, valid."""
    import logging

    flat = tmp_path / "zoo"
    flat.mkdir()
    for name in built.zoo.cards:
        shutil.copy(built.zoo.path(name), flat / f"{name}.onnx")
        shutil.copy(built.zoo.card_path(name), flat / f"{name}.json")
    (flat / "fmnist-small.splits.json").write_text("{}")
    (flat / "fmnist-exits").mkdir()  # a model kept as a directory: the multi-exit net's
    (flat / "fmnist-exits" / "fmnist-exits.json").write_text('{"version": "1"}')
    (flat / "fmnist-exits" / "fmnist-exits-s1.onnx").write_bytes(b"segment")
    with caplog.at_level(logging.WARNING, logger="tierlink.zoo.cache"):
        zoo = load_zoo(profile="test", root=flat)
    assert zoo.cards == built.zoo.cards
    assert zoo.path("fmnist-small") == flat / "fmnist-small" / "1" / "model.onnx"
    assert (flat / "fmnist-small" / "1" / "card.splits.json").is_file()
    assert sorted(p.name for p in flat.iterdir() if p.is_file()) == []
    assert "zoo: moved fmnist-small into" in caplog.text
    exits = flat / "fmnist-exits" / "1"
    assert (exits / "card.json").is_file() and (exits / "fmnist-exits-s1.onnx").is_file()
    assert (flat / "fmnist-exits" / "CURRENT").read_text() == "1"


def test_rebuilding_reproduces_the_shipped_models(built):
    """``tierlink zoo build --rebuild`` of the test profile gives the models tierlink ships:
    the same recipe, the test accuracy within half a point (bit-identity is only expected
    on the machine that built them)."""
    from tierlink.models.card import load_card
    from tierlink.models.layout import CARD_FILE, Layout
    from tierlink.zoo.shipped import shipped_root

    shipped = Layout(shipped_root("test"))
    assert sorted(shipped.names()) == sorted(NAMES)
    for name in NAMES:
        card, ours = load_card(shipped.dir(name) / CARD_FILE), built.zoo.card(name)
        assert card.training is not None and ours.training is not None
        assert card.training.recipe == ours.training.recipe, name
        assert abs(card.test_accuracy - ours.test_accuracy) <= 0.005, name

