"""When asynchronous work should run (``routing/deferral.py``): at the price window its
deadline reaches where its policy's plan costs least — now on a tie or when no cheaper
window is reachable — spread over that window by the request's id, and never later than
the margin before its deadline."""

from __future__ import annotations

import dataclasses
import random

import pytest

from tierlink.core.types import Privacy, Request
from tierlink.estimate.cost import DAY_S
from tierlink.policy import PolicyConfig, TierlinkPolicy
from tierlink.routing.deferral import DEFER_MARGIN_S, deferral, windows
from tierlink.settings.routing import parse_cost
from tierlink.testing.views import fleet_view

H = 3600.0
# Every tier's prices: dear by day, cheap after midnight (a tariff's peak and valley).
TARIFF = parse_cost({"schedule": {tier: [{"from": "09:00", "to": "18:00", "factor": 3.0},
                                         {"from": "00:00", "to": "06:00", "factor": 0.5}]
                                  for tier in ("device", "edge", "cloud")}})


def request(deadline_h: float, rid: str = "r1") -> Request:
    return Request(rid, "fmnist", deadline_h * H * 1000.0, origin="dev-1",
                   privacy=Privacy.LOCAL, input_bytes=3136)


def at(hour: float) -> object:
    return dataclasses.replace(fleet_view(), day_s=hour * H)


POLICY = TierlinkPolicy(PolicyConfig(cost=TARIFF))


def test_the_windows_split_the_wait_at_each_price_change() -> None:
    assert windows(TARIFF, 12 * H, 14 * H) == [
        (0.0, 6 * H), (6 * H, 12 * H), (12 * H, 14 * H)]
    assert windows(TARIFF, 23 * H, 2 * DAY_S)[:3] == [(0.0, H), (H, 7 * H), (7 * H, 10 * H)]


def test_work_that_reaches_the_night_waits_for_it() -> None:
    when = deferral(POLICY, request(14), at(12), TARIFF)
    assert when.deferred and 12 * H <= when.wait_s < 14 * H - DEFER_MARGIN_S
    assert when.est_cost == pytest.approx(when.now_cost * 0.5 / 3.0)


def test_work_whose_deadline_reaches_no_cheaper_window_runs_now() -> None:
    assert deferral(POLICY, request(5), at(12), TARIFF).wait_s == 0.0  # 18:00 is 6 h away
    assert deferral(POLICY, request(14), at(2), TARIFF).wait_s == 0.0  # already the cheapest
    flat = parse_cost({})
    assert deferral(TierlinkPolicy(PolicyConfig(cost=flat)), request(30), at(12),
                    flat).wait_s == 0.0


def test_the_evening_waits_for_the_end_of_the_peak_when_midnight_is_too_far() -> None:
    when = deferral(POLICY, request(4), at(15), TARIFF)  # 18:00 in 3 h; midnight in 9 h
    assert 3 * H <= when.wait_s < 4 * H - DEFER_MARGIN_S
    assert when.est_cost == pytest.approx(when.now_cost / 3.0)


def test_the_start_is_spread_by_request_and_the_same_for_the_same_request() -> None:
    waits = [deferral(POLICY, request(14, f"r{i}"), at(12), TARIFF).wait_s for i in range(40)]
    assert waits[0] == deferral(POLICY, request(14, "r0"), at(12), TARIFF).wait_s
    assert max(waits) - min(waits) > H  # spread over the window, not all at midnight


def test_a_deferred_request_always_starts_before_its_margin() -> None:
    rng = random.Random(7)
    for i in range(200):
        hour, deadline_h = rng.uniform(0, 24), rng.uniform(0.05, 60)
        when = deferral(POLICY, request(deadline_h, f"p{i}"), at(hour), TARIFF)
        assert 0.0 <= when.wait_s <= max(0.0, deadline_h * H - DEFER_MARGIN_S)
        assert when.est_cost <= when.now_cost
