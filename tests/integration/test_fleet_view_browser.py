"""The fleet view in a real headless Chromium against a real fleet: the nodes appear by tier
and site, traffic fills the figures, a rollout's phase changes on screen as the controller
moves it, and a node killed with -9 turns unhealthy — all from the page's own live stream,
opened with the operator token."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled

from .integration_support import Models, route, tierlink

pytestmark = pytest.mark.integration

FLEET = """
name: itest-fleet-view
seed: 5
zoo: {profile: test}
control: {ttl_s: 3}
trusted_keys: [%s]
routing: {policy: tierlink, thresholds: {fmnist-small: 0.9}}
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-large], labels: {site: region-a}}
  - {id: edge-1,  tier: edge,   models: [fmnist-medium], labels: {site: lab}}
  - {id: edge-2,  tier: edge,   models: [fmnist-medium], labels: {site: shop}}
  - {id: dev-1,   tier: device, models: [fmnist-small], labels: {site: lab}}
  - {id: dev-2,   tier: device, models: [fmnist-small], labels: {site: shop}}
links:
  - {from: dev-1, to: edge-1, delay_ms: 2}
  - {from: dev-2, to: edge-2, delay_ms: 2}
  - {from: [edge-1, edge-2], to: cloud-1, delay_ms: 10}
"""
MODEL = "fmnist-medium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]
# Where to keep the screenshot besides the test's own directory (the README's is made so).
SCREENSHOT_ENV = "TIERLINK_FLEET_VIEW_PNG"


@pytest.fixture
def browser_page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    assert Path(chromium).is_file(), "headless Chromium is needed: apt-get install chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS,
                                    headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            yield page
        finally:
            browser.close()


def test_the_fleet_view_follows_the_fleet_live(
        start_fleet: Callable[[str], RunningFleet], zoo_models: Models, browser_page: Any,
        http: httpx.Client, fmnist_test: Labelled, hard_samples: np.ndarray,
        tmp_path: Path) -> None:
    key = tmp_path / "publisher.key"
    public = tierlink("model", "keygen", "--out", str(key)).strip().splitlines()[-1]
    fleet = start_fleet(FLEET % public)
    page = browser_page
    page.goto(f"{fleet.control_url}/ui#token={fleet.admin_token}")

    # Every node appears, by tier, healthy; the token left the address bar.
    for node in fleet.node_urls:
        page.wait_for_selector(f'tr[data-node="{node}"][data-health="healthy"]',
                               timeout=15_000)
    assert "token" not in page.url
    assert page.locator('table[data-tier="edge"] tr[data-node]').count() == 2
    assert "site" in page.inner_text("#nodes") and "shop" in page.inner_text(
        'tr[data-node="edge-2"]')
    # Each node's own process: memory and open files from its heartbeat
    assert "MiB" in page.inner_text('tr[data-node="edge-1"] td[data-process]')

    # Traffic: the figures fill from the nodes' heartbeats.
    for i, sample in enumerate(np.concatenate([hard_samples[:20], np.arange(20)])):
        entry = fleet.node_urls["dev-1" if i % 2 else "dev-2"]
        assert route(http, entry, fmnist_test.input[sample: sample + 1],
                     privacy="any").status == 200
    page.wait_for_function(
        "() => document.getElementById('sla').textContent.endsWith('%')", timeout=20_000)
    page.wait_for_selector("#shares span", timeout=20_000)

    # A rollout: its phase changes on screen as the controller moves it.
    onnx, card = zoo_models[MODEL]
    token, url = fleet.admin_token, fleet.control_url
    tierlink("model", "publish", MODEL, str(onnx), "--card", str(card), "--version", "2",
             "--notes", "same weights, version 2", "--key", str(key), "--control", url,
             "--eval-limit", "100", token=token)
    started = json.loads(tierlink("rollout", "start", MODEL, "2", "--tier", "edge",
                                  "--canary", "50%", "--soak", "10m", "--control", url,
                                  "--json", token=token))
    rid = started["id"]
    page.wait_for_selector(f'tr[data-rollout="{rid}"][data-phase="soaking"]', timeout=60_000)
    page.wait_for_selector('span.tag.standby, tr[data-node^="edge"] >> text=v2',
                           timeout=30_000)
    for _ in range(2):  # the next stage (all edges), then promoted
        tierlink("rollout", "promote", str(rid), "--control", url, token=token)
    page.wait_for_selector(f'tr[data-rollout="{rid}"][data-phase="promoted"]', timeout=30_000)

    # kill -9 an edge: it turns unhealthy on screen, and stays listed as down.
    fleet.kill("edge-2")
    page.wait_for_selector('tr[data-node="edge-2"][data-health="late"], '
                           'tr[data-node="edge-2"][data-health="down"]', timeout=15_000)
    page.wait_for_selector('tr[data-node="edge-2"][data-health="down"]', timeout=20_000)
    assert page.locator('tr[data-node="edge-1"][data-health="healthy"]').count() == 1
    assert page.inner_text("#conn") == "live"

    shot = tmp_path / "fleet-view.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copy(shot, os.environ[SCREENSHOT_ENV])


def test_a_wrong_token_is_refused_on_the_page(shared_fleet: RunningFleet,
                                             browser_page: Any) -> None:
    page = browser_page
    page.goto(f"{shared_fleet.control_url}/ui#token=not-the-operator-token")
    page.wait_for_selector("#login:not([hidden])", timeout=10_000)
    assert "refused" in page.inner_text("#login-error")
    page.fill("#token", shared_fleet.admin_token)
    page.click("#login button")
    page.wait_for_selector('tr[data-node="dev-1"]', timeout=15_000)
