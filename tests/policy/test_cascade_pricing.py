"""The cascade priced from `cascade tune`'s calibration records, the accuracy tolerance, and
the cost term's fixed unit."""

import random
from types import MappingProxyType

import pytest

from tierlink.core.types import CascadeRecord, Privacy, Request
from tierlink.policy import PolicyConfig, TierlinkPolicy
from tierlink.testing.views import fleet_view

SMALL, MEDIUM, LARGE = "fmnist-small", "fmnist-medium", "fmnist-large"


def records(threshold: float = 0.8) -> MappingProxyType:
    """The small model answers 80% (98% right); on what it escalates the edge model is
    right 60% of the time and the cloud 70%."""
    return MappingProxyType({
        (SMALL,): CascadeRecord(1.0, 0.91, threshold, 0.8, 0.98),
        (MEDIUM,): CascadeRecord(1.0, 0.925, threshold, 0.85, 0.97),
        (LARGE,): CascadeRecord(1.0, 0.936),
        (SMALL, MEDIUM): CascadeRecord(0.2, 0.6, threshold, 0.3, 0.85),
        (SMALL, LARGE): CascadeRecord(0.2, 0.7),
        (MEDIUM, LARGE): CascadeRecord(0.15, 0.68),
        (SMALL, MEDIUM, LARGE): CascadeRecord(0.14, 0.62),
    })


def req(deadline: float = 1000.0, privacy: Privacy = Privacy.ANY) -> Request:
    return Request("r", "fmnist", deadline, origin="dev-1", privacy=privacy, input_bytes=3136)


def choices(cfg: PolicyConfig, request: Request, self_id: str = "dev-1") -> dict:
    pol = TierlinkPolicy(cfg)
    return {c.label: c for c in pol._choices(self_id, request, fleet_view(self_id=self_id),
                                             request.deadline_ms - cfg.reserve_ms,
                                             0, random.Random(0), ())}


def test_cascade_is_priced_from_the_records_at_the_threshold_in_force():
    cfg = PolicyConfig(thresholds={SMALL: 0.8, MEDIUM: 0.8}, cascade_records=records())
    cascade = choices(cfg, req(30.0))["cascade:edge"]  # 30 ms: the edge cannot reach the cloud
    # 80% answered here at 98%, the rest by the edge model on what the device escalated.
    assert cascade.est.accuracy == pytest.approx(0.8 * 0.98 + 0.2 * 0.6)
    assert cascade.threshold == 0.8


def test_the_upstream_is_valued_on_the_hard_inputs_along_the_whole_path():
    cfg = PolicyConfig(thresholds={SMALL: 0.8, MEDIUM: 0.8}, cascade_records=records())
    cascade = choices(cfg, req(1000.0))["cascade:edge"]
    # The edge's best on the escalated inputs: its own cascade (30% at 85%, the rest by the
    # cloud at 62%) or straight to the cloud (70%) -- never the overall 92.5%/93.6%.
    edge_part = (cascade.est.accuracy - 0.8 * 0.98) / 0.2
    assert edge_part in (pytest.approx(0.3 * 0.85 + 0.7 * 0.62), pytest.approx(0.7))


def test_a_record_tuned_for_another_threshold_is_not_used():
    cfg = PolicyConfig(thresholds={SMALL: 0.9, MEDIUM: 0.9}, cascade_records=records(0.8))
    cascade = choices(cfg, req(30.0))["cascade:edge"]
    assert cascade.est.accuracy != pytest.approx(0.8 * 0.98 + 0.2 * 0.6)  # the card's curve


def test_local_answers_are_valued_with_the_records_accuracy():
    cfg = PolicyConfig(thresholds={SMALL: 0.8}, cascade_records=records())
    assert choices(cfg, req())["local"].est.accuracy == pytest.approx(0.91)


def test_within_the_tolerance_the_cheaper_option_wins():
    # The device answers 90%: escalating the rest costs less than sending everything to
    # the edge (which passes 15% on to the cloud), at about the same accuracy.
    recs = dict(records())
    recs[(SMALL,)] = CascadeRecord(1.0, 0.91, 0.8, 0.9, 0.965)
    cfg = PolicyConfig(thresholds={SMALL: 0.8, MEDIUM: 0.8}, accuracy_tolerance=1.0,
                       cascade_records=MappingProxyType(recs))
    got = choices(cfg, req(1000.0))
    best = max(c.est.accuracy for c in got.values())
    assert got["cascade:edge"].est.accuracy >= best - 0.01  # accurate enough
    assert got["cascade:edge"].est.cost < got["remote:edge"].est.cost
    plan = TierlinkPolicy(cfg).plan(req(1000.0), fleet_view(), random.Random(0))
    assert plan.reason == "cascade:edge"
    assert plan.placements[0].escalate_below == 0.8


def test_options_beyond_the_tolerance_are_only_fallbacks():
    cfg = PolicyConfig(thresholds={SMALL: 0.8, MEDIUM: 0.8}, cascade_records=records(),
                       accuracy_tolerance=0.1)
    plan = TierlinkPolicy(cfg).plan(req(1000.0), fleet_view(), random.Random(0))
    assert plan.reason != "local"  # 91% is too far below what the fleet can do
    assert any(p.kind == "local" for p in plan.placements)  # still a fallback


def test_the_cost_unit_does_not_depend_on_which_options_fit_the_deadline():
    pol = TierlinkPolicy(PolicyConfig())
    view = fleet_view()
    assert pol.reference_cost(req(30.0), view) == pol.reference_cost(req(1000.0), view) > 0


def test_on_an_escalated_slice_the_tolerance_widens_by_its_share():
    from tierlink.policy.placement import Choice, Eligibility, Estimate

    eligible = Eligibility(PolicyConfig(thresholds={SMALL: 0.8, MEDIUM: 0.8},
                                        cascade_records=records(), accuracy_tolerance=1.0))
    assert eligible._share((SMALL,)) == pytest.approx(0.2) and eligible._share(()) == 1.0
    node = fleet_view().nodes["edge-1"]
    options = [Choice(kind, Estimate(1.0, 1.0, 0.0, acc), node)
               for kind, acc in (("a", 0.70), ("b", 0.66), ("c", 0.62))]
    # On every input, 1 point: only the best. On the 20% the device escalated, a point
    # lost costs a fifth of a point overall: 5 points there.
    assert [c.kind for c in eligible.of(options)] == ["a"]
    assert [c.kind for c in eligible.of(options, (SMALL,))] == ["a", "b"]


def test_a_tuned_cascade_that_is_accurate_enough_is_run_at_every_node():
    # 2 points of tolerance, 10 on the device's hard 20%: answering those on the edge
    # (60%) would be "accurate enough" and cheapest, but the tuned chain escalates what the
    # edge model is unsure of to the cloud, and its target holds only if every node does.
    cfg = PolicyConfig(thresholds={SMALL: 0.8, MEDIUM: 0.8}, cascade_records=records(),
                       accuracy_tolerance=2.0)
    got = choices(cfg, req(1000.0))["cascade:edge"]
    assert (got.est.accuracy - 0.8 * 0.98) / 0.2 == pytest.approx(0.3 * 0.85 + 0.7 * 0.62)
    plan = TierlinkPolicy(cfg).plan(req(1000.0), fleet_view(), random.Random(0))
    assert plan.reason == "cascade:edge"
    # Without a deadline that leaves room for the cloud, the edge answers them itself.
    got = choices(cfg, req(30.0))["cascade:edge"]
    assert (got.est.accuracy - 0.8 * 0.98) / 0.2 == pytest.approx(0.6)
