"""The cost model (``estimate/cost.py``): bills by part and tier, and prices that change
with the hour — a tier's windows of the day (wrapping past midnight), the model priced at a
moment, the fleet file's ``cost.schedule`` read and written back, and bad schedules named."""

from __future__ import annotations

import pytest

from tierlink.core.types import Bill, Tier
from tierlink.errors import ConfigError
from tierlink.estimate.cost import DAY_S, CostModel
from tierlink.settings.routing import parse_cost

H = 3600
NIGHT_AND_PEAK = {"schedule": {
    "cloud": [{"from": "22:00", "to": "06:00", "factor": 0.4},
              {"from": "09:00", "to": "18:00", "factor": 1.5}],
    "edge": [{"from": "00:00", "to": "24:00", "factor": 2.0}]}}


def test_bills_add_in_order_and_name_their_parts() -> None:
    cost = CostModel()
    bill = cost.compute_bill(Tier.DEVICE, 10.0) + cost.transfer_bill(Tier.CLOUD, 2_000_000) \
        + cost.compute_bill(Tier.CLOUD, 100.0)
    assert bill.usd == cost.compute(Tier.DEVICE, 10.0) + cost.transfer(Tier.CLOUD, 2_000_000) \
        + cost.compute(Tier.CLOUD, 100.0)
    assert [(t, p) for t, p, _ in bill.items()] == [
        (Tier.DEVICE, "compute"), (Tier.CLOUD, "compute"), (Tier.CLOUD, "transfer")]
    assert Bill.from_wire(bill.to_wire(), bill.usd) == bill
    split = cost.split_bill(Tier.DEVICE, 2.0, Tier.CLOUD, 50_000, 8.0)
    assert split.compute[Tier.CLOUD] == cost.compute(Tier.CLOUD, 8.0)
    assert split.transfer[Tier.CLOUD] == cost.transfer(Tier.CLOUD, 50_000)


@pytest.mark.parametrize(("hour", "cloud", "edge"), [
    (23, 0.4, 2.0), (2, 0.4, 2.0), (6, 1.0, 2.0), (12, 1.5, 2.0), (18, 1.0, 2.0),
    (21.99, 1.0, 2.0)])
def test_a_tiers_prices_follow_its_windows(hour: float, cloud: float, edge: float) -> None:
    cost = parse_cost(NIGHT_AND_PEAK)
    assert cost.factor(Tier.CLOUD, hour * H) == cloud and cost.factor(Tier.EDGE, hour * H) == edge
    assert cost.factor(Tier.DEVICE, hour * H) == 1.0
    priced = cost.at(hour * H)
    assert priced.compute(Tier.CLOUD, 1000.0) == pytest.approx(
        CostModel().compute(Tier.CLOUD, 1000.0) * cloud)
    assert priced.transfer(Tier.CLOUD, 10**9) == pytest.approx(0.05 * cloud)
    assert not priced.schedule


def test_a_model_without_a_schedule_is_its_own_price_at_any_hour() -> None:
    cost = CostModel()
    assert cost.at(12 * H) is cost and cost.changes() == ()


def test_the_schedule_is_written_back_as_the_fleet_file_says_it() -> None:
    cost = parse_cost(NIGHT_AND_PEAK)
    assert parse_cost(cost.to_mapping()) == cost
    assert cost.to_mapping()["schedule"]["cloud"][0] == {"from": "22:00", "to": "06:00",
                                                         "factor": 0.4}
    assert cost.changes() == (0, 6 * H, 9 * H, 18 * H, 22 * H)
    assert all(0 <= s < DAY_S for s in cost.changes())


@pytest.mark.parametrize(("windows", "message"), [
    ([{"from": "22:00", "to": "06:00", "factor": 0.4},
      {"from": "05:00", "to": "07:00", "factor": 0.9}], "overlap"),
    ([{"from": "25:00", "to": "06:00", "factor": 0.4}], "time of day HH:MM"),
    ([{"from": "7", "to": "08:00", "factor": 0.4}], "time of day HH:MM"),
    ([{"from": "07:00", "to": "08:00", "factor": 0}], "factor must be > 0"),
    ([{"from": "07:00", "to": "07:00", "factor": 2}], "is empty"),
    ([{"from": "07:00", "to": "08:00", "price": 2}], "from: HH:MM"),
    ({"from": "07:00"}, "must be a list"),
])
def test_a_bad_schedule_is_refused_naming_it(windows: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cost({"schedule": {"cloud": windows}})


def test_a_misspelled_cost_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="schedul"):
        parse_cost({"schedul": {}})


def test_placement_prices_its_options_at_the_snapshots_hour() -> None:
    import dataclasses
    import random

    from tierlink.core.types import Privacy, Request
    from tierlink.policy import PolicyConfig, TierlinkPolicy
    from tierlink.testing.views import fleet_view

    policy = TierlinkPolicy(PolicyConfig(cost=parse_cost(NIGHT_AND_PEAK)))
    request = Request("r", "fmnist", 1000.0, origin="dev-1", privacy=Privacy.ANY,
                      input_bytes=3136)
    view = fleet_view()
    noon = dataclasses.replace(view, day_s=12 * H)
    night = dataclasses.replace(view, day_s=3 * H)
    # The dearest answer (the cloud's model, the input sent up) at noon's prices (1.5x) and
    # at night's (0.4x); the options' estimates are priced the same way.
    assert policy.reference_cost(request, noon) == pytest.approx(
        policy.reference_cost(request, night) * 1.5 / 0.4)
    assert policy.reference_cost(request, view) == pytest.approx(  # midnight: 0.4x too
        policy.reference_cost(request, night))
    local = {v.day_s: next(c.est.cost for c in policy.feasible_choices(
        request, v, random.Random(0))[0] if c.kind == "local") for v in (noon, night)}
    assert local[noon.day_s] == local[night.day_s] > 0  # the device's prices do not change
