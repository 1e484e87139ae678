"""A fleet file's links read as sites and regions; each node's upstream rule."""

from __future__ import annotations

from tierlink.fleet.config import parse_fleet
from tierlink.fleet.topology import fleet_labels, upstream_rule


def fleet(links, *, extra_nodes=(), **top):
    nodes = [{"id": "cloud-1", "tier": "cloud", "models": ["m"]},
             {"id": "edge-1", "tier": "edge", "models": ["m"]},
             {"id": "edge-2", "tier": "edge", "models": ["m"]},
             {"id": "dev-1", "tier": "device", "models": ["m"]},
             {"id": "dev-2", "tier": "device", "models": ["m"]}, *extra_nodes]
    return parse_fleet({"nodes": nodes, "links": links, **top})


def test_links_make_sites_and_regions():
    cfg = fleet([{"from": "dev-1", "to": "edge-1"}, {"from": "dev-2", "to": "edge-2"},
                 {"from": ["edge-1", "edge-2"], "to": "cloud-1"}])
    labels = fleet_labels(cfg)
    assert labels["dev-1"] == {"site": "site-edge-1"}
    assert labels["dev-2"] == {"site": "site-edge-2"}
    assert labels["edge-1"] == {"site": "site-edge-1", "region": "region-cloud-1"}
    assert labels["cloud-1"] == {"region": "region-cloud-1"}


def test_labels_given_in_the_file_win():
    cfg = parse_fleet({"nodes": [{"id": "dev-1", "tier": "device", "models": ["m"],
                                  "labels": {"site": "lab"}},
                                 {"id": "edge-1", "tier": "edge", "models": ["m"]}],
                       "links": [{"from": "dev-1", "to": "edge-1"}]})
    assert fleet_labels(cfg)["dev-1"] == {"site": "lab"}


def test_rules_follow_the_links_or_the_tier():
    cfg = fleet([{"from": "dev-1", "to": "cloud-1"}, {"from": "dev-2", "to": ["edge-1",
                                                                              "cloud-1"]}])
    assert upstream_rule(cfg, cfg.node("dev-1")) == ("cloud", ("region",))
    assert upstream_rule(cfg, cfg.node("dev-2")) == (None, ())  # two tiers: as declared
    assert upstream_rule(cfg, cfg.node("edge-1")) == ("cloud", ("region",))
    assert upstream_rule(cfg, cfg.node("cloud-1")) == (None, ())
    static = fleet([{"from": "dev-1", "to": "edge-1"}], topology="static")
    assert upstream_rule(static, static.node("dev-1")) == (None, ())
