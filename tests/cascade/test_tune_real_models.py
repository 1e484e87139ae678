"""Tuning on real (quick CI) zoo models: targets met on the calibration split, and the
temperature fitted there lowers ECE on the test split it never saw."""

import pytest

from tierlink.cascade.report import Goal, tune_chain
from tierlink.cascade.stages import Chain
from tierlink.core.types import Tier
from tierlink.models.calibration import ece
from tierlink.models.card import load_card
from tierlink.models.catalog import Catalog, SourceOptions
from tierlink.models.data import Splits
from tierlink.models.evaluate import onnx_logits

CHAIN = Chain(("fmnist-small", "fmnist-medium", "fmnist-large"),
              (Tier.DEVICE, Tier.EDGE, Tier.CLOUD))


@pytest.fixture(scope="module")
def catalog():
    return Catalog.default(SourceOptions(profile="test", progress=False))


@pytest.fixture(scope="module")
def zoo(catalog):
    """The chain's models as the catalog resolves them (the zoo's, built once)."""
    return catalog.resolve(CHAIN.models)


@pytest.fixture(scope="module")
def splits(catalog):
    s = catalog.data("fmnist")
    return Splits(s.calib.head(2000), s.test.head(2000), s.train.head(10))


@pytest.mark.parametrize("goal", [Goal("accuracy_drop", 1.0), Goal("escalation_budget", 0.3),
                                  Goal("cost_share", 0.3)])
def test_tuned_thresholds_meet_their_target_on_the_calibration_split(zoo, splits, goal):
    report = tune_chain(zoo, CHAIN, splits, goal)
    assert report.feasible
    calib, top = report.calib, report.alone["calib"]["fmnist-large"]
    if goal.kind == "accuracy_drop":
        assert calib.accuracy >= top.accuracy - 0.01
        assert calib.cost < top.cost  # and it is cheaper than asking the cloud every time
    elif goal.kind == "escalation_budget":
        assert calib.escalated <= 0.3 + 1e-9  # shares are counts / n: 1 - 0.7 in floats
    else:
        assert calib.cost <= 0.3 * top.cost
    assert set(report.thresholds()) == {"fmnist-small", "fmnist-medium"}
    assert report.test.thresholds == calib.thresholds  # the test split only checks them
    assert sum(report.test.shares) == pytest.approx(1.0)


def test_temperature_fitted_on_calibration_lowers_ece_on_held_out_test(zoo, splits):
    for name in CHAIN.models:
        card = load_card(zoo[name].card)
        logits = onnx_logits(zoo[name].file, splits.test.input)
        before = ece(logits, splits.test.labels)
        after = ece(logits, splits.test.labels, card.temperature)
        assert after < before, (name, before, after)
