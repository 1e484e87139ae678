"""The demo report's breakdowns: by privacy level, by SLA class, the ``any`` requests by
whether the cloud was within reach, and the live escalation rate beside the prediction."""

import numpy as np
import pytest

from tierlink.core.types import Priority, Privacy
from tierlink.fleet import breakdown as bd
from tierlink.fleet.breakdown import cloud_room_ms
from tierlink.fleet.config import parse_fleet
from tierlink.fleet.workload import Record, WorkItem

SLA = {30.0: Priority.REALTIME, 150.0: Priority.INTERACTIVE, 1000.0: Priority.BATCH}


def rec(seq, privacy, deadline, tier="device", pred=1, label=1, latency=5.0, cost=0.0,
        answered=True, degraded=""):
    item = WorkItem(seq, seq, "dev-1", deadline, SLA[deadline], privacy, 0.0)
    return Record(item, label, answered, False, "" if answered else "refused", latency,
                  pred=pred, tier=tier if answered else "", cost=cost, degraded=degraded)


def records():
    return [
        rec(0, Privacy.LOCAL, 30.0),
        rec(1, Privacy.SITE, 150.0, tier="edge", cost=1e-9),
        rec(2, Privacy.ANY, 1000.0, tier="cloud", cost=1e-6, latency=120.0),
        rec(3, Privacy.ANY, 30.0, pred=0, latency=40.0),  # wrong and late
        rec(4, Privacy.ANY, 150.0, degraded="upstream_failed"),
    ]


def test_by_privacy_counts_each_level():
    got = bd.by_privacy(records())
    assert list(got) == ["local", "site", "any"]
    assert got["any"]["requests"] == 3
    assert got["any"]["accuracy"] == pytest.approx(2 / 3)
    assert got["any"]["sla_attainment"] == pytest.approx(2 / 3)
    assert got["any"]["tier_share"]["cloud"] == pytest.approx(1 / 3)
    assert got["any"]["cost_per_1k"] == pytest.approx(1000 * 1e-6 / 3)
    assert got["site"]["escalated_share"] == 1.0 and got["local"]["escalated_share"] == 0.0


def test_by_sla_is_ordered_by_deadline_and_names_it():
    got = bd.by_sla(records())
    assert list(got) == ["realtime", "interactive", "batch"]
    assert got["realtime"]["deadline_ms"] == 30.0 and got["realtime"]["requests"] == 2


def test_any_requests_split_by_cloud_room():
    got = bd.by_privacy_and_room(records(), cloud_room_ms=100.0)
    assert got["cloud_reachable"]["requests"] == 2
    assert got["cloud_out_of_reach"]["requests"] == 1


def test_escalation_beside_the_prediction():
    below = np.zeros(10, dtype=bool)
    below[[1, 2]] = True  # the threshold would escalate samples 1 and 2
    got = bd.escalation(records(), bd.Prediction(0.8, 0.2, below))
    assert got["may_escalate"] == 4  # site and any
    assert got["escalated_share"] == pytest.approx(2 / 4)  # samples 1 and 2 left
    assert got["escalated_share_expected"] == pytest.approx(2 / 4)
    assert got["escalated_share_tuned"] == 0.2
    assert got["escalation_degraded"] == 1  # kept the device's answer


def test_cloud_room_comes_from_the_declared_links():
    fleet = parse_fleet({
        "nodes": [{"id": "c", "tier": "cloud", "models": ["m"]},
                  {"id": "e", "tier": "edge", "models": ["m"]},
                  {"id": "d", "tier": "device", "models": ["m"]}],
        "links": [{"from": "d", "to": "e", "delay_ms": 5},
                  {"from": "e", "to": "c", "delay_ms": 40}],
        "routing": {"reserve_ms": 5}})
    assert cloud_room_ms(fleet) == 2 * 5 + 2 * 40 + 5
