"""Split plans in the simulator: a device holding a model's head runs it, sends the codec's
payload over the link and the tail runs upstream — planned by the node's own policy over
the profile, priced at the device's speed, and never for a request whose features may not
leave."""

from __future__ import annotations

import numpy as np

import sim_support as toy
from tierlink.core.types import CodecPoint, ModelView, Privacy, SplitPoint
from tierlink.fleet.config import parse_fleet
from tierlink.sim.outcomes import Answers, Outcomes
from tierlink.sim.run import simulate
from tierlink.sim.workload import Arrivals, workload

N = 50
CUTS = (SplitPoint("early", 2.0, 38.0, 800_000, (CodecPoint("fp16", 400_000, 0.5, 0.3),)),
        SplitPoint("late", 30.0, 10.0, 5_000, (CodecPoint("fp16", 2_500, 0.1, 0.1),)))


def _fleet() -> tuple:
    config = parse_fleet({
        "name": "photos", "seed": 3, "routing": {"policy": "tierlink",
                                                 "allow_policy_override": True},
        "nodes": [{"id": "edge-1", "tier": "edge", "models": ["big"], "workers": 2},
                  {"id": "dev-1", "tier": "device", "models": ["toy-small"],
                   "heads": ["big"]},
                  {"id": "dev-2", "tier": "device", "models": ["toy-small"]}],
        "links": [{"from": ["dev-1", "dev-2"], "to": "edge-1", "delay_ms": 5,
                   "bandwidth_mbit": 20}]})
    views = {**toy.views(), "big": ModelView("big", "photo", "1", 0.7, 40.0, splits=CUTS)}
    rng = np.random.default_rng(0)
    pred = rng.integers(0, 1000, N).astype(np.int16)
    photos = Outcomes("photo", pred, {"big": Answers(pred, np.full(N, 0.8, np.float32))},
                      input_bytes=602_112)
    return config, views, photos


def test_the_head_holder_splits_and_the_other_device_uploads() -> None:
    config, views, photos = _fleet()
    items = workload(Arrivals("constant", 2.0), 20.0, ["dev-1", "dev-2"], N, seed=1)
    items = [i.__class__(i.seq, i.sample, i.origin, 500.0, i.priority, Privacy.SITE, i.at_s)
             for i in items]
    report, records = simulate(config, views, photos, items, 1, (("tierlink", None),),
                               also={"toy": toy.outcomes()})
    done = records["tierlink"]
    split = [r for r in done if r.split]
    assert split and all(r.item.origin == "dev-1" for r in split)
    assert {r.split for r in split} == {"late/fp16"}  # 2.5 KB beats 400 KB or the photo
    assert all(r.correct and r.tier == "edge" and r.served_by == "edge-1" for r in split)
    head = [r.timings["head_ms"] for r in split]
    assert 25 < float(np.median(head)) < 40  # the profile's 30 ms at the device's speed
    assert all(r.timings["split_bytes"] == 2_500.0 for r in split)
    uploads = [r for r in done if r.item.origin == "dev-2"]
    assert uploads and not any(r.split for r in uploads)
    # the raw photo: 602 KB at 20 Mbit/s is ~240 ms; the split plan is far quicker
    assert np.median([r.latency_ms for r in split]) < np.median([r.latency_ms for r in uploads])
    assert report["runs"]["tierlink"]["privacy_violations"] == 0


def test_features_of_local_requests_stay_on_the_device() -> None:
    config, views, photos = _fleet()
    items = workload(Arrivals("constant", 2.0), 5.0, ["dev-1"], N, seed=1)
    items = [i.__class__(i.seq, i.sample, i.origin, 500.0, i.priority, Privacy.LOCAL, i.at_s)
             for i in items]
    _, records = simulate(config, views, photos, items, 1, (("tierlink", None),),
                          also={"toy": toy.outcomes()})
    assert not any(r.split for r in records["tierlink"])
    assert not any(r.answered for r in records["tierlink"])  # no model of it on the device
