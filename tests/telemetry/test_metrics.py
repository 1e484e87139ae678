"""The bill as Prometheus counts it (``NodeMetrics.bill``): each part of an answer's cost
under the tier it went to, labelled by task, model, version, path kind and site; the path
kind read off the outcome."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tierlink.core.types import Bill, Outcome, Tier
from tierlink.telemetry.metrics import COST_LABELS, NodeMetrics, path_kind


def outcome(served_by: str = "dev-1", *, escalations: int = 0, split: str = "",
            bill: Bill | None = None) -> Outcome:
    return Outcome(served_by, Tier.CLOUD if served_by.startswith("cloud") else Tier.DEVICE,
                   "m-large", ("dev-1", served_by), 0.9, escalations=escalations, split=split,
                   bill=bill or Bill.of_compute(Tier.DEVICE, 1e-9), model_version="3")


@pytest.mark.parametrize(("out", "kind"), [
    (outcome(), "local"), (outcome("cloud-1"), "remote"),
    (outcome("cloud-1", escalations=1), "escalated"),
    (outcome("cloud-1", split="conv2/int8"), "split")])
def test_the_path_kind_says_how_it_was_answered(out: Outcome, kind: str) -> None:
    assert path_kind(out, "dev-1") == kind


def samples(metrics: NodeMetrics) -> dict[tuple[str, ...], float]:
    text = metrics.exposition().decode()
    family = next(f for f in text_string_to_metric_families(text)
                  if f.name == "tierlink_cost_usd")
    return {tuple(s.labels[k] for k in COST_LABELS): s.value for s in family.samples
            if s.name.endswith("_total")}


def test_each_part_of_the_bill_is_counted_under_its_tier() -> None:
    metrics = NodeMetrics("device")
    bill = (Bill.of_compute(Tier.CLOUD, 4e-6) + Bill.of_transfer(Tier.CLOUD, 1e-7)
            + Bill.of_compute(Tier.DEVICE, 2e-9))
    metrics.bill("fmnist", outcome("cloud-1", escalations=1, bill=bill), "dev-1", "lab")
    metrics.bill("fmnist", outcome("cloud-1", escalations=1, bill=bill), "dev-1", "lab")
    got = samples(metrics)
    key = ("fmnist", "m-large", "3", "escalated", "lab")
    assert got == {(*key, "cloud", "compute"): pytest.approx(8e-6),
                   (*key, "cloud", "transfer"): pytest.approx(2e-7),
                   (*key, "device", "compute"): pytest.approx(4e-9)}
    assert sum(got.values()) == pytest.approx(2 * bill.usd)


def test_a_free_answer_adds_no_series() -> None:
    metrics = NodeMetrics("device")
    metrics.bill("fmnist", outcome(bill=Bill()), "dev-1", "")
    assert samples(metrics) == {}


def test_the_counter_has_the_labels_the_report_groups_by() -> None:
    assert NodeMetrics("device").cost._labelnames == COST_LABELS
