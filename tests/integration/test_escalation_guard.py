"""The demo fleet's live escalation rate follows what its tuned thresholds predict.

When the spine landed the demo escalated 11% of its requests; later changes brought that
under 1% and nothing noticed: under load escalations were lost (cold connections to the
cloud timed out, and the policy priced cascades with a guess that made answering on the
device look as good). This guard runs the demo's own fleet (``demo/fleets/fleet.yaml`` without
its photo models) on the real zoo — built here on first use, as the demo does, and its
thresholds re-tuned for these models when the file's were tuned on others — under the
demo's mixed load, and compares the share of requests that left the device with the share
the device model's threshold predicts for those very inputs. Marked ``slow``: the first run
on a machine trains the zoo (about five minutes on two cores); it still runs in CI.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tierlink.demo.fleets import fleet_path
from tierlink.demo.phases import DemoSettings, run_workload, threshold_prediction, workload_for
from tierlink.fleet import breakdown as bd
from tierlink.fleet.config import FleetConfig, load_fleet
from tierlink.fleet.launcher import launch
from tierlink.models.data import Labelled

from .integration_support import assert_all_gone

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

EXAMPLE = fleet_path()


def demo_fleet_without_photos() -> FleetConfig:
    config = load_fleet(EXAMPLE)
    nodes = tuple(replace(n, models=tuple(m for m in n.models if m.startswith("fmnist-")),
                          heads=()) for n in config.nodes)
    return replace(config, nodes=nodes)


def test_live_escalations_follow_the_tuned_thresholds_under_demo_load(
        fmnist_test: Labelled, tmp_path: Path) -> None:
    from tierlink.cli.models import fleet_models
    from tierlink.fleet.tuning import retune, stale_thresholds

    config = demo_fleet_without_photos()
    models = fleet_models(config.zoo_profile, config.model_names(), progress=False)
    if stale_thresholds(config, models):  # a machine that trained its own zoo: as the demo
        config, _ = retune(config, "fmnist", progress=False)
    assert config.routing.cascade_records, "the demo fleet prices cascades from records"
    items = workload_for(config, DemoSettings.quick(), len(fmnist_test.labels))[:400]
    fleet = launch(config, models, tmp_path / "fleet")
    groups = [t.group for t in fleet.throttles if t.group is not None]
    try:
        records, privacy = run_workload(fleet, items, fmnist_test.input,
                                        fmnist_test.labels, "fmnist", None,
                                        lambda r: None)
    finally:
        fleet.stop()
        assert_all_gone(fleet, groups)
    prediction = threshold_prediction(config, models, "fmnist")
    assert prediction is not None
    got = bd.escalation(records, prediction)
    assert sum(r.lost for r in records) == 0 and privacy == (0, 0)
    expected, live = got["escalated_share_expected"], got["escalated_share"]
    assert 0.05 < expected < 0.5, got  # the thresholds do escalate a fair share
    # Every request the threshold escalates should leave the device; a few may keep the
    # device's answer when the hop cannot come back in time.
    assert live == pytest.approx(expected, abs=0.04), got
    assert got["escalation_degraded"] <= 0.02 * got["may_escalate"], got
