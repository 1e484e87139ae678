"""A real Prometheus server scrapes every node and the control plane, with the rules of
deploy/rules loaded and evaluated over what it scrapes; promtool accepts the exposition."""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled
from tierlink.netports import pick_port

from .integration_support import metric_sum, route, wait_for

pytestmark = pytest.mark.integration

TARGETS_UP_TIMEOUT_S = 40.0
RULES = Path(__file__).resolve().parents[2] / "deploy" / "rules" / "tierlink.rules.yml"


@dataclass(frozen=True, slots=True)
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def check_running(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{tail}")


@pytest.fixture
def prometheus(shared_fleet: RunningFleet, tmp_path: Path) -> Iterator[Prometheus]:
    """The Prometheus `tierlink up --prometheus` starts, on a free loopback port, scraping
    the shared fleet every second; terminated (by pid) afterwards."""
    from tierlink.fleet import prometheus as prom

    port, log = pick_port(), tmp_path / "prometheus.log"
    proc = prom.start(tmp_path, "127.0.0.1", port, shared_fleet.node_urls,
                      shared_fleet.control_urls, log, scrape_s=1.0)
    try:
        yield Prometheus(f"http://127.0.0.1:{port}", proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        assert proc.poll() is not None


def _api(http: httpx.Client, url: str, path: str, **params: str) -> Any:
    try:
        resp = http.get(f"{url}/api/v1/{path}", params=params)
    except httpx.TransportError:
        return None  # still starting
    if resp.status_code != 200:
        return None
    body = resp.json()
    return body["data"] if body.get("status") == "success" else None


def all_targets_up(http: httpx.Client, prom: Prometheus, expected: int) -> list[dict] | None:
    prom.check_running()
    data = _api(http, prom.url, "targets")
    targets = data["activeTargets"] if data else []
    up = [t for t in targets if t["health"] == "up"]
    return targets if len(targets) == expected and len(up) == expected else None


def test_prometheus_scrapes_every_node_and_the_control_plane(
        shared_fleet: RunningFleet, prometheus: Prometheus, http: httpx.Client,
        fmnist_test: Labelled,
        hard_samples: np.ndarray) -> None:
    expected = len(shared_fleet.node_urls) + 1
    targets = wait_for(lambda: all_targets_up(http, prometheus, expected),
                       TARGETS_UP_TIMEOUT_S, f"{expected} scrape targets up", interval_s=0.5)
    assert {t["labels"]["role"] for t in targets} == {"node", "control"}
    assert {t["labels"]["node"] for t in targets} >= set(shared_fleet.node_urls)

    dev = shared_fleet.node_urls["dev-2"]
    for sample in hard_samples[:5]:
        assert route(http, dev, fmnist_test.input[sample: sample + 1], privacy="any").status == 200
    sent = metric_sum(http, dev, "tierlink_requests_total", kind="task", model="fmnist")
    assert sent >= 5
    query = (f'sum(tierlink_requests_total{{instance="{dev.removeprefix("http://")}",'
             f'kind="task",model="fmnist"}})')

    def scraped() -> float | None:
        data = _api(http, prometheus.url, "query", query=query)
        value = float(data["result"][0]["value"][1]) if data and data["result"] else 0.0
        return value if value >= sent else None

    assert wait_for(scraped, 20, f"Prometheus to see {sent:.0f} requests at dev-2") >= sent
    # Every series carries the node's tier; Prometheus adds which node (instance) and job.
    series = _api(http, prometheus.url, "query", query="tierlink_requests_total")["result"]
    assert series and all({"tier", "instance", "job"} <= set(s["metric"]) for s in series)
    # The bill of the last minutes, as `tierlink cost --prometheus` reads it.
    from tierlink.telemetry import bill

    def billed() -> bill.BillReport | None:  # more requests: a window sees counters grow
        route(http, dev, fmnist_test.input[hard_samples[0]: hard_samples[0] + 1], privacy="any")
        report = bill.from_prometheus(http, prometheus.url, "5m", ("task", "path"))
        return report if report.usd > 0 else None

    report = wait_for(billed, 30, "Prometheus to hold the bill", interval_s=1.0)
    assert {line.group[0] for line in report.lines} == {"fmnist"}
    assert all(line.requests and line.usd_per_1k for line in report.lines)


def test_the_rules_load_and_record_sla_attainment_from_the_fleet(
        shared_fleet: RunningFleet, prometheus: Prometheus, http: httpx.Client,
        fmnist_test: Labelled, hard_samples: np.ndarray) -> None:
    expected = len(shared_fleet.node_urls) + 1
    wait_for(lambda: all_targets_up(http, prometheus, expected), TARGETS_UP_TIMEOUT_S,
             f"{expected} scrape targets up", interval_s=0.5)
    groups = _api(http, prometheus.url, "rules")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert {"tierlink:sla_attainment:ratio_rate5m", "TierlinkSLAAttainmentLow",
            "TierlinkNodeDown"} <= set(rules)
    dev = shared_fleet.node_urls["dev-2"]

    def recorded() -> tuple[float] | None:  # a tuple: 0.0 is an answer too
        for sample in hard_samples[:3]:
            route(http, dev, fmnist_test.input[sample: sample + 1], privacy="any")
        data = _api(http, prometheus.url, "query",
                    query='tierlink:sla_attainment:ratio_rate5m{tier="device"}')
        # One series per priority: one without traffic in the window is 0/0 (NaN).
        values = [float(r["value"][1]) for r in data["result"]] if data else []
        finite = [v for v in values if math.isfinite(v)]
        return (finite[0],) if finite else None

    (attainment,) = wait_for(recorded, 45, "the SLA recording rule to produce a value",
                          interval_s=1.0)
    assert 0.0 <= attainment <= 1.0
    health = {r["name"]: r["health"] for g in _api(http, prometheus.url, "rules")["groups"]
              for r in g["rules"]}
    assert set(health.values()) == {"ok"}, health


def test_every_dashboard_query_runs_on_the_fleet_s_prometheus(
        shared_fleet: RunningFleet, prometheus: Prometheus, http: httpx.Client) -> None:
    """deploy/grafana-dashboard.json: each panel's query is one this Prometheus (with the
    rules loaded) accepts; the ones over raw series return data from the fleet."""
    import json

    expected = len(shared_fleet.node_urls) + 1
    wait_for(lambda: all_targets_up(http, prometheus, expected), TARGETS_UP_TIMEOUT_S,
             f"{expected} scrape targets up", interval_s=0.5)
    dashboard = json.loads((RULES.parents[1] / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        resp = http.get(f"{prometheus.url}/api/v1/query", params={"query": expr})
        assert resp.status_code == 200 and resp.json()["status"] == "success", (expr, resp.text)
    nodes = _api(http, prometheus.url, "query", query="sum by (tier) (tierlink_control_nodes)")
    assert {r["metric"]["tier"] for r in nodes["result"]} == {"device", "edge", "cloud"}


PROCESS_SERIES = ("process_cpu_seconds_total", "process_resident_memory_bytes",
                  "process_open_fds")


def _promtool(text: str) -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(promtool).is_file():
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    check = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                           capture_output=True, timeout=30, check=False)
    assert check.returncode == 0, (check.stdout + check.stderr).decode()


def test_every_node_exports_its_process_and_promtool_accepts_it(
        shared_fleet: RunningFleet, http: httpx.Client) -> None:
    """Each node's own CPU, memory and open files in Prometheus's process_* series (an
    operator sees a leaking node from the fleet's metrics), in its heartbeat's view too."""
    for node, url in shared_fleet.node_urls.items():
        text = http.get(f"{url}/metrics").text
        assert "tierlink_" in text
        found = {line.split()[0] for line in text.splitlines()
                 if line.startswith("process_")}
        assert set(PROCESS_SERIES) <= found, (node, sorted(found))
        _promtool(text)
    fleet = http.get(f"{shared_fleet.control_url}/v1/fleet", headers={
        "authorization": f"Bearer admin:{shared_fleet.admin_token}"}).json()
    processes = {n["node_id"]: n["process"] for n in fleet["nodes"]}
    assert set(processes) >= set(shared_fleet.node_urls)
    for node in shared_fleet.node_urls:
        assert processes[node]["resident_mib"] > 10 and processes[node]["open_fds"] > 3


def test_promtool_accepts_the_control_plane_exposition(shared_fleet: RunningFleet,
                                                      http: httpx.Client) -> None:
    text = http.get(f"{shared_fleet.control_url}/metrics").text
    assert "tierlink_" in text
    _promtool(text)


UP_FLEET = """
name: itest-up-observed
seed: 4
zoo: {profile: test}
control: {ttl_s: 3}
routing: {policy: tierlink, thresholds: {fmnist-small: 0.9}}
nodes:
  - {id: edge-1, tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,  tier: device, models: [fmnist-small]}
links:
  - {from: dev-1, to: edge-1, delay_ms: 2}
"""


def test_tierlink_up_starts_prometheus_with_the_rules_and_a_trace_receiver(
        zoo_models: object, http: httpx.Client, fmnist_test: Labelled, hard_samples: np.ndarray,
        tmp_path: Path) -> None:
    """`tierlink up --prometheus --traces`, as an operator types it: Prometheus scrapes
    every node and the control plane with deploy/rules loaded, spans of a request reach the
    fleet's receiver, and Ctrl-C (SIGTERM) takes everything down."""
    import json
    import os
    import signal
    import sys

    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(UP_FLEET)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierlink.cli.main", "up", str(fleet_file), "--json",
         "--run-dir", str(tmp_path / "run"), "--prometheus", "--prometheus-port", "0",
         "--traces"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, COLUMNS="200"))
    try:
        lines: list[str] = []
        while not lines or lines[-1] != "}":
            line = proc.stdout.readline() if proc.stdout else ""
            if not line:
                raise AssertionError(f"tierlink up ended: {proc.stderr.read() if proc.stderr else ''}")
            lines.append(line.rstrip("\n"))
        info = json.loads("\n".join(lines))
        prom = Prometheus(info["prometheus"], proc, tmp_path / "run" / "logs" / "prometheus.log")
        targets = wait_for(lambda: all_targets_up(http, prom, 3), TARGETS_UP_TIMEOUT_S,
                           "3 scrape targets up", interval_s=0.5)
        assert {t["labels"]["node"] for t in targets} == {"edge-1", "dev-1", "control-0"}
        rules = {r["name"] for g in _api(http, prom.url, "rules")["groups"] for r in g["rules"]}
        assert "TierlinkNodeDown" in rules
        sample = hard_samples[0]
        answer = route(http, info["nodes"]["dev-1"], fmnist_test.input[sample: sample + 1],
                       privacy="any")
        assert answer.status == 200
        traces = Path(info["traces_file"])

        def routed_spans() -> int | None:
            from tierlink.telemetry.trace_view import load_spans

            names = [s.name for s in load_spans([traces])] if traces.exists() else []
            return names.count("tierlink.route") or None

        assert wait_for(routed_spans, 15, "the request's spans at the receiver") >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0
    for url in (info["prometheus"], *info["nodes"].values(), info["control"]):
        with pytest.raises(httpx.TransportError):
            http.get(url, timeout=1.0)
