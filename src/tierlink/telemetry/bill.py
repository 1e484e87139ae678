"""The fleet's bill, grouped by what spends it: ``tierlink cost``.

Every node counts what each request that entered it cost (``tierlink_cost_usd_total``, by
task, model, version, path kind, site, tier and part) and how many it answered
(``tierlink_billed_requests_total``, by task, path kind and site), once per request
(:meth:`~tierlink.telemetry.metrics.NodeMetrics.bill`). A report sums those series by any of
the cost labels — over a window from Prometheus (``increase`` of both), or since the nodes
started from their own ``/metrics``. Cost per request is given where the grouping labels
are the requests' (task, path, site); a request's parts at several tiers are one request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tierlink.errors import ConfigError, ControlPlaneError
from tierlink.telemetry.metrics import COST_LABELS

if TYPE_CHECKING:
    import httpx

COST = "tierlink_cost_usd_total"
REQUESTS = "tierlink_billed_requests_total"
REQUEST_LABELS = ("task", "path", "site")
_WINDOW = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")

Sample = tuple[Mapping[str, str], float]


@dataclass(frozen=True, slots=True)
class BillLine:
    """One group of the bill: its labels' values, what it cost, how many requests."""

    group: tuple[str, ...]
    usd: float
    requests: float | None  # None: the grouping labels are not the requests'

    @property
    def usd_per_1k(self) -> float | None:
        return 1000.0 * self.usd / self.requests if self.requests else None


@dataclass(frozen=True, slots=True)
class BillReport:
    by: tuple[str, ...]
    lines: tuple[BillLine, ...]  # dearest first
    window: str  # "1h", or "since start"

    @property
    def usd(self) -> float:
        return sum(line.usd for line in self.lines)

    def to_dict(self) -> dict[str, Any]:
        return {"window": self.window, "by": list(self.by), "usd": self.usd,
                "lines": [{**dict(zip(self.by, line.group, strict=True)), "usd": line.usd,
                           "share": line.usd / self.usd if self.usd else 0.0,
                           "requests": line.requests, "usd_per_1k": line.usd_per_1k}
                          for line in self.lines]}


def parse_by(text: str) -> tuple[str, ...]:
    """``"task,path"`` as labels of the bill; a label it does not have is refused."""
    by = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in by if x not in COST_LABELS]
    if unknown or not by or len(set(by)) != len(by):
        raise ConfigError(f"--by {text!r}: group by distinct labels of the bill",
                          hint=f"any of {', '.join(COST_LABELS)}")
    return by


def check_window(window: str) -> str:
    if not _WINDOW.match(window):
        raise ConfigError(f"--window {window!r} is not a Prometheus duration",
                          hint="e.g. 15m, 1h, 1d")
    return window


def group(costs: Iterable[Sample], requests: Iterable[Sample], by: tuple[str, ...],
          window: str) -> BillReport:
    """Sum the samples of both series by ``by``; requests only where ``by`` are theirs."""
    usd: dict[tuple[str, ...], float] = {}
    for labels, value in costs:
        key = tuple(labels.get(k, "") for k in by)
        usd[key] = usd.get(key, 0.0) + value
    counted: dict[tuple[str, ...], float] | None = None
    if set(by) <= set(REQUEST_LABELS):
        counted = {}
        for labels, value in requests:
            key = tuple(labels.get(k, "") for k in by)
            counted[key] = counted.get(key, 0.0) + value
    lines = [BillLine(key, value, None if counted is None else counted.get(key, 0.0))
             for key, value in usd.items() if value > 0]
    return BillReport(by, tuple(sorted(lines, key=lambda x: (-x.usd, x.group))), window)


def from_nodes(client: httpx.Client, urls: Sequence[str], by: tuple[str, ...]) -> BillReport:
    """The bill since each node started, read from the nodes' own ``/metrics``."""
    costs: list[Sample] = []
    requests: list[Sample] = []
    for url in urls:
        text = _get(client, f"{url.rstrip('/')}/metrics").text
        costs += _samples(text, COST)
        requests += _samples(text, REQUESTS)
    return group(costs, requests, by, "since start")


def from_prometheus(client: httpx.Client, url: str, window: str,
                    by: tuple[str, ...]) -> BillReport:
    """The bill of the last ``window``: ``increase`` of both series at Prometheus."""
    check_window(window)
    labels = ", ".join(by)
    costs = _query(client, url, f"sum by ({labels}) (increase({COST}[{window}]))")
    requests = (_query(client, url, f"sum by ({labels}) (increase({REQUESTS}[{window}]))")
                if set(by) <= set(REQUEST_LABELS) else [])
    return group(costs, requests, by, window)


def _query(client: httpx.Client, url: str, promql: str) -> list[Sample]:
    body = _get(client, f"{url.rstrip('/')}/api/v1/query", params={"query": promql}).json()
    if body.get("status") != "success":
        raise ControlPlaneError(f"Prometheus at {url} refused {promql!r}: "
                                f"{body.get('error', body)}")
    return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]


def _get(client: httpx.Client, url: str, params: Mapping[str, str] | None = None
         ) -> httpx.Response:
    import httpx

    try:
        response = client.get(url, params=params)
    except httpx.HTTPError as exc:
        raise ControlPlaneError(f"cannot reach {url}: {exc}") from exc
    if response.status_code >= 400:
        raise ControlPlaneError(f"{url} answered {response.status_code}: "
                                f"{response.text[:200]}")
    return response


def _samples(text: str, name: str) -> list[Sample]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(dict(s.labels), float(s.value)) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]
