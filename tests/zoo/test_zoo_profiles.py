"""Tasks, recipes and the recipe fingerprint that keeps cached models valid (torch-free)."""

import pytest

from tierlink.errors import ZooError
from tierlink.zoo.profiles import (
    DATA_STATS,
    PROFILES,
    TASKS,
    VARIANT_TIERS,
    data_stats,
    get_profile,
    model_names,
    recipe_fingerprint,
)

# The fingerprints the code computed before tasks other than fmnist existed: the cards of
# every fmnist zoo built since carry them, so they must never change by accident. (The full
# small model's changed on purpose when its recipe went from 3 epochs to 10 with flips, the
# full medium's when it went from 3 epochs to 8 with flips: the edge model must be clearly
# better than the device's; the full small's again when it was distilled from the large; and
# both profiles' medium when the edge net was widened; every one when calibration moved to
# the official test images, FMNIST_SPLITS_ID; the full small's when it went to 16 epochs.)
FMNIST_FINGERPRINTS = {
    "test": {"small": "3082d28384eb49ff", "medium": "a4d494905239f656",
             "large": "b35076c68d3233e5"},
    "full": {"small": "35e7a69203613127", "medium": "8707118d376ee63e",
             "large": "82aaee3e085fbe62"},
}


@pytest.mark.parametrize("profile", sorted(FMNIST_FINGERPRINTS))
def test_fmnist_fingerprints_are_unchanged(profile):
    build = get_profile(profile)
    for variant, expected in FMNIST_FINGERPRINTS[profile].items():
        assert recipe_fingerprint(build, variant) == expected
        assert recipe_fingerprint(build, variant, "fmnist") == expected


def test_other_tasks_have_their_own_fingerprints():
    for profile in PROFILES.values():
        prints = {(task, v): recipe_fingerprint(profile, v, task)
                  for task in TASKS for v in VARIANT_TIERS}
        assert len(set(prints.values())) == len(prints)


def test_mnist_fingerprint_covers_its_pixel_statistics(monkeypatch):
    profile = get_profile("test")
    before = recipe_fingerprint(profile, "small", "mnist")
    specs = dict(DATA_STATS)
    specs["mnist"] = type(specs["mnist"])("MNIST", pixel_mean=0.13, pixel_std=0.31)
    monkeypatch.setattr("tierlink.zoo.profiles.DATA_STATS", specs)
    assert recipe_fingerprint(profile, "small", "mnist") != before
    assert recipe_fingerprint(profile, "small") == FMNIST_FINGERPRINTS["test"]["small"]


def test_every_profile_has_a_recipe_per_task_and_variant():
    for profile in PROFILES.values():
        for task in TASKS:
            for variant in VARIANT_TIERS:
                assert profile.recipe(task, variant).epochs >= 1


def test_mnist_never_trains_on_mirrored_digits():
    for profile in PROFILES.values():
        assert not any(profile.recipe("mnist", v).flips for v in VARIANT_TIERS)


def test_tasks_name_their_models_and_data():
    assert TASKS == ("fmnist", "mnist")
    assert model_names("mnist") == ("mnist-small", "mnist-medium", "mnist-large")
    assert data_stats("mnist").title == "MNIST" and data_stats("fmnist").title == "Fashion-MNIST"
    assert (data_stats("mnist").pixel_mean, data_stats("mnist").pixel_std) == (0.1307, 0.3081)


def test_unknown_tasks_and_recipes_are_clear_errors():
    with pytest.raises(ZooError, match="no task 'imagenet'") as info:
        model_names("imagenet")
    assert "mnist" in (info.value.hint or "")
    with pytest.raises(ZooError, match="no recipe for cifar-small"):
        get_profile("test").recipe("cifar", "small")


def test_a_distilled_model_is_built_after_its_teacher_and_follows_its_recipe():
    from tierlink.zoo.profiles import PROFILES, build_order

    full = PROFILES["full"]
    assert build_order(("small", "medium", "large"), full, "fmnist")[0] == "large"
    assert build_order(("small", "medium", "large"), full, "mnist") == ("small", "medium",
                                                                       "large")
    # The teacher's recipe is part of the student's fingerprint: retraining the teacher
    # retrains the student.
    from dataclasses import replace
    from types import MappingProxyType

    recipes = dict(full.recipes["fmnist"])
    recipes["large"] = replace(recipes["large"], epochs=recipes["large"].epochs + 1)
    other = replace(full, recipes=MappingProxyType({"fmnist": MappingProxyType(recipes)}))
    assert recipe_fingerprint(other, "small") != recipe_fingerprint(full, "small")
    assert recipe_fingerprint(other, "medium") != recipe_fingerprint(full, "medium")
