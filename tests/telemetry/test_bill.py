"""``tierlink cost``'s report (``telemetry/bill.py``): the bill's series summed by any of
their labels, cost per request only where the grouping labels are the requests', a
Prometheus window queried with ``increase``, and bad labels, windows or answers named."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tierlink.cli.main import app
from tierlink.errors import ConfigError, ControlPlaneError
from tierlink.telemetry import bill

COSTS = [
    ({"task": "fmnist", "model": "l", "version": "1", "path": "escalated", "site": "lab",
      "tier": "cloud", "part": "compute"}, 6.0),
    ({"task": "fmnist", "model": "l", "version": "1", "path": "escalated", "site": "lab",
      "tier": "cloud", "part": "transfer"}, 1.0),
    ({"task": "fmnist", "model": "l", "version": "1", "path": "escalated", "site": "lab",
      "tier": "device", "part": "compute"}, 0.5),
    ({"task": "fmnist", "model": "s", "version": "1", "path": "local", "site": "lab",
      "tier": "device", "part": "compute"}, 2.5),
]
REQUESTS = [({"task": "fmnist", "path": "escalated", "site": "lab"}, 100.0),
            ({"task": "fmnist", "path": "local", "site": "lab"}, 900.0)]


def test_the_bill_sums_by_any_labels_dearest_first() -> None:
    report = bill.group(COSTS, REQUESTS, ("tier", "part"), "since start")
    assert [(line.group, line.usd) for line in report.lines] == [
        (("cloud", "compute"), 6.0), (("device", "compute"), 3.0), (("cloud", "transfer"), 1.0)]
    assert report.usd == 10.0 and all(line.requests is None for line in report.lines)


def test_cost_per_request_where_the_groups_are_the_requests() -> None:
    report = bill.group(COSTS, REQUESTS, ("path",), "1h")
    assert {line.group: (line.usd, line.requests, line.usd_per_1k) for line in report.lines} \
        == {("escalated",): (7.5, 100.0, 75.0), ("local",): (2.5, 900.0, 2500 / 900)}
    out = report.to_dict()
    assert out["usd"] == 10.0 and out["window"] == "1h"
    assert out["lines"][0] == {"path": "escalated", "usd": 7.5, "share": 0.75,
                               "requests": 100.0, "usd_per_1k": 75.0}


@pytest.mark.parametrize("text", ["tier,nodes", "", "tier,tier", "instance"])
def test_labels_the_bill_does_not_have_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--by") as err:
        bill.parse_by(text)
    assert "task, model, version, path, site, tier, part" in err.value.hint


@pytest.mark.parametrize("window", ["1 h", "60", "1h; drop", "h"])
def test_a_window_that_is_no_duration_is_refused(window: str) -> None:
    with pytest.raises(ConfigError, match="Prometheus duration"):
        bill.check_window(window)


def prometheus(answers: dict[str, list[tuple[dict[str, str], float]]], seen: list[str]
               ) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        seen.append(query)
        name = next(k for k in answers if k in query)
        result = [{"metric": m, "value": [0, str(v)]} for m, v in answers[name]]
        return httpx.Response(200, json={"status": "success",
                                         "data": {"resultType": "vector", "result": result}})
    return httpx.Client(transport=httpx.MockTransport(handle))


def test_a_prometheus_window_is_the_increase_of_both_series() -> None:
    seen: list[str] = []
    client = prometheus({bill.COST: [({"task": "fmnist", "path": "local"}, 2.0)],
                         bill.REQUESTS: [({"task": "fmnist", "path": "local"}, 400.0)]}, seen)
    report = bill.from_prometheus(client, "http://prom:9090", "15m", ("task", "path"))
    assert seen == ["sum by (task, path) (increase(tierlink_cost_usd_total[15m]))",
                    "sum by (task, path) (increase(tierlink_billed_requests_total[15m]))"]
    assert report.lines[0].usd_per_1k == 5.0


def test_a_prometheus_that_refuses_is_named() -> None:
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(
        400, json={"status": "error", "error": "parse error"})))
    with pytest.raises(ControlPlaneError, match="prom:9090"):
        bill.from_prometheus(client, "http://prom:9090", "1h", ("tier",))


def test_the_command_refuses_a_window_without_prometheus_and_a_bad_label() -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["cost", "--window", "1h", "--node", "http://127.0.0.1:9"])
    assert done.exit_code == 2 and "--window needs --prometheus" in done.output
    done = runner.invoke(app, ["cost", "--by", "region", "--node", "http://127.0.0.1:9"])
    assert done.exit_code == 2 and "--by 'region'" in done.output


def test_the_command_prints_the_bill_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: dict[str, Any] = {}

    def fake(client: httpx.Client, urls: list[str], by: tuple[str, ...]) -> bill.BillReport:
        captured["urls"], captured["by"] = urls, by
        return bill.group(COSTS, REQUESTS, by, "since start")

    monkeypatch.setattr(bill, "from_nodes", fake)
    done = CliRunner().invoke(app, ["cost", "--by", "site", "--node", "http://n1:8000",
                                    "--json"])
    assert done.exit_code == 0, done.output
    assert captured == {"urls": ["http://n1:8000"], "by": ("site",)}
    assert json.loads(done.output)["lines"][0]["usd_per_1k"] == 10.0
