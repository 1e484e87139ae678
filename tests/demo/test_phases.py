"""The demo's photo workload set-up, without a fleet: which model and devices it uses."""


from tierlink.demo import phases as demo
from tierlink.demo.fleets import fleet_path
from tierlink.fleet.config import load_fleet, parse_fleet
from tierlink.fleet.launcher import RunningFleet

EXAMPLE = fleet_path()
MODEL = "imagenet-mobilenetv2"


def fleet(dev_heads: list[list[str]]):
    nodes = [{"id": "edge-1", "tier": "edge", "models": ["fmnist-medium", MODEL]},
             {"id": "cloud-1", "tier": "cloud", "models": ["fmnist-large"]}]
    nodes += [{"id": f"dev-{i + 1}", "tier": "device", "models": ["fmnist-small"], "heads": h}
              for i, h in enumerate(dev_heads)]
    devices = [n["id"] for n in nodes[2:]]
    return parse_fleet({"nodes": nodes, "links": [{"from": devices, "to": ["edge-1", "cloud-1"]}]})


def test_the_example_fleet_splits_mobilenet_from_dev_1_to_the_edges():
    cfg = load_fleet(EXAMPLE)
    assert demo.photo_model(cfg) == MODEL
    assert demo.photo_origins(cfg, MODEL) == ("dev-1", "dev-2")
    # The Fashion-MNIST layout is unchanged: devices reach only the edges.
    assert {l.dst for l in cfg.links_from("dev-1")} == {"edge-1", "edge-2"}
    assert MODEL in cfg.node("cloud-1").models


def test_origins_are_the_head_holders_then_one_device_without():
    cfg = fleet([[MODEL], [], [MODEL], []])
    assert demo.photo_origins(cfg, MODEL) == ("dev-1", "dev-3", "dev-2")
    assert demo.photo_origins(fleet([[MODEL]]), MODEL) == ("dev-1",)


def test_a_fleet_without_photo_heads_has_no_photo_phase():
    cfg = fleet([[], []])
    assert demo.photo_model(cfg) is None
    assert demo.photo_phase(cfg, demo.DemoSettings(), {}) is None


def test_photo_requests_zero_turns_the_phase_off():
    cfg = fleet([[MODEL]])
    assert demo.photo_phase(cfg, demo.DemoSettings(photo_requests=0), {}) is None


def test_quick_settings_keep_a_small_photo_workload():
    quick = demo.DemoSettings.quick()
    assert 0 < quick.photo_requests <= 60 and quick.photo_rate_per_s > 0


def test_the_fleet_summary_lists_heads(tmp_path):
    summary = demo.fleet_summary(RunningFleet(load_fleet(EXAMPLE), tmp_path))
    heads = {n["id"]: n["heads"] for n in summary["nodes"]}
    assert heads["dev-1"] == [MODEL] and heads["dev-2"] == []
