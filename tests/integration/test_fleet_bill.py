"""The bill on a running fleet: every answer carries what it cost by part and tier
(``tierlink.cost``), and the fleet counts each request's bill once, at the node it entered
— an upstream that answered a forwarded request counts nothing for it."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import metric_samples, route

pytestmark = pytest.mark.integration

COST = "tierlink_cost_usd_total"


def bills(http: httpx.Client, fleet: RunningFleet) -> dict[str, dict[tuple[str, ...], float]]:
    """Each node's cost series: (path, tier, part) -> USD."""
    return {node: {(s["path"], s["tier"], s["part"]): v
                   for s, v in metric_samples(http, url, COST) if s["task"] == "fmnist"}
            for node, url in fleet.node_urls.items()}


def grew(before: dict[tuple[str, ...], float], after: dict[tuple[str, ...], float]
         ) -> dict[tuple[str, ...], float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def test_each_answer_is_billed_by_part_once_where_it_entered(
        shared_fleet: RunningFleet, http: httpx.Client, fmnist_test: Labelled,
        hard_samples: np.ndarray) -> None:
    before = bills(http, shared_fleet)
    dev = shared_fleet.node_urls["dev-1"]
    answers = [route(http, dev, fmnist_test.input[i: i + 1], privacy="any")
               for i in [*hard_samples[:6], 0, 1]]
    assert all(a.status == 200 for a in answers)
    total, parts = 0.0, {}
    for a in answers:
        bill = json.loads(a.parameters["tierlink.cost"])
        flat = {(part, tier): usd for part, by in bill.items() for tier, usd in by.items()}
        assert sum(flat.values()) == pytest.approx(a.parameters["tierlink.cost_usd"])
        total += a.parameters["tierlink.cost_usd"]
        for key, usd in flat.items():
            parts[key] = parts.get(key, 0.0) + usd
    escalated = [a for a in answers if int(a.parameters["tierlink.escalations"])]
    assert escalated, "the hard samples escalate"
    assert ("compute", "device") in parts and any(t != "device" for _, t in parts)

    after = bills(http, shared_fleet)
    counted = grew(before["dev-1"], after["dev-1"])
    assert sum(counted.values()) == pytest.approx(total, rel=1e-6)
    assert {p for p, _, _ in counted} <= {"local", "escalated", "remote", "split"}
    assert "escalated" in {p for p, _, _ in counted}
    by_part: dict[tuple[str, str], float] = {}
    for (_, tier, part), usd in counted.items():
        by_part[(part, tier)] = by_part.get((part, tier), 0.0) + usd
    assert by_part == pytest.approx(parts, rel=1e-6)
    for node in ("edge-1", "edge-2", "cloud-1"):  # what they answered was dev-1's to count
        assert grew(before[node], after[node]) == {}, node


def test_tierlink_cost_reads_the_bill_off_the_running_fleet(
        shared_fleet: RunningFleet, http: httpx.Client, fmnist_test: Labelled,
        hard_samples: np.ndarray) -> None:
    from typer.testing import CliRunner

    from tierlink.cli.main import app

    dev = shared_fleet.node_urls["dev-2"]
    for i in hard_samples[10:14]:
        assert route(http, dev, fmnist_test.input[i: i + 1], privacy="any").status == 200
    nodes = [a for url in shared_fleet.node_urls.values() for a in ("--node", url)]
    done = CliRunner().invoke(app, ["cost", "--by", "task,path", "--json", *nodes])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    counted = sum(v for url in shared_fleet.node_urls.values()
                  for s, v in metric_samples(http, url, COST))
    assert report["usd"] == pytest.approx(counted) and report["usd"] > 0
    escalated = next(line for line in report["lines"]
                     if (line["task"], line["path"]) == ("fmnist", "escalated"))
    assert escalated["requests"] >= 4 and escalated["usd_per_1k"] > 0
    by_control = CliRunner().invoke(app, ["cost", "--control", shared_fleet.control_url,
                                          "--admin-token", shared_fleet.admin_token,
                                          "--json"])
    assert by_control.exit_code == 0, by_control.output
    assert json.loads(by_control.output)["usd"] == pytest.approx(counted)
