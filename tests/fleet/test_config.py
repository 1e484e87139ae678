import pytest

from tierlink.core.types import Tier
from tierlink.demo.fleets import fleet_path
from tierlink.errors import ConfigError
from tierlink.fleet.config import load_fleet, parse_fleet

MIN = {"nodes": [{"id": "dev-1", "tier": "device", "models": ["fmnist-small"]},
                 {"id": "edge-1", "tier": "edge", "models": ["fmnist-medium"]}],
       "links": [{"from": "dev-1", "to": "edge-1", "delay_ms": 5, "bandwidth_mbit": 100}]}


def test_example_fleet_loads():
    cfg = load_fleet(fleet_path())
    assert len(cfg.nodes) == 7 and len(cfg.links) == 10
    assert cfg.node("cloud-1").tier is Tier.CLOUD
    assert {l.dst for l in cfg.links_from("dev-1")} == {"edge-1", "edge-2"}
    assert cfg.routing.allow_policy_override


def test_link_rtt_is_twice_the_one_way_delay():
    cfg = parse_fleet(MIN)
    assert cfg.links[0].rtt_ms == 10.0 and cfg.links[0].name == "dev-1->edge-1"


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["nodes"][0].update(id="Bad Id"), "nodes[0].id"),
    (lambda d: d["nodes"][0].update(tier="fog"), "nodes[0].tier"),
    (lambda d: d["nodes"][0].update(workers=0), "nodes[0].workers"),
    (lambda d: d["nodes"][0].update(models=["fmnist-small@2"]), "nodes[0] names 'fmnist-sm"),
    (lambda d: d["nodes"][0].update(default_privacy="secret"), "nodes[0].default_privacy"),
    (lambda d: d["links"][0].update(to="edge-9"), "links[0]"),
    (lambda d: d["links"][0].update(delay_ms=-1), "links[0].delay_ms"),
    (lambda d: d.update(routing={"weights": {"speed": 1}}), "routing.weights.speed"),
    (lambda d: d.update(routing={"thresholds": {"fmnist-small": 2}}), "routing.thresholds"),
    (lambda d: d["nodes"].append(dict(d["nodes"][0])), "appears twice"),
    (lambda d: d.update(routing={"split_codec_loss": {"jpeg": 0.1}}),
     "routing.split_codec_loss.jpeg"),
    (lambda d: d.update(routing={"split_codec_loss": {"int8": -1}}),
     "routing.split_codec_loss.int8"),
])
def test_errors_name_the_field(mutate, field):
    import copy

    data = copy.deepcopy(MIN)
    mutate(data)
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_fleet(data)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_fleet(tmp_path / "nope.yaml")


def test_invalid_yaml_is_a_config_error(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("nodes: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_fleet(p)


def test_measured_codec_losses_replace_the_default_table():
    """A fleet that measured its codecs (`tierlink split codecs`) prices splits with them;
    codecs it does not name keep the default table's figure."""
    cfg = parse_fleet({**MIN, "routing": {"split_codec_loss": {"int8+zstd": 0.0}}})
    losses = {c.spec: c.accuracy_loss for c in cfg.routing.policy_config().split_codecs}
    assert losses["int8+zstd"] == 0.0 and losses["int8"] == 0.05 and losses["fp32"] == 0.0


def test_a_device_may_fail_closed():
    import copy

    data = copy.deepcopy(MIN)
    data["nodes"][0]["default_privacy"] = "local"
    cfg = parse_fleet(data)
    assert cfg.node("dev-1").default_privacy == "local"
    assert cfg.node("edge-1").default_privacy == "any"


def test_a_tls_fleet_refuses_a_node_id_no_certificate_can_name():
    """On a fleet with TLS a node is verified by a name in its certificate
    (`<id>.node.tierlink.internal`): an id with an empty part between dots cannot be one."""
    import copy

    from tierlink.fleet.config import with_tls

    data = copy.deepcopy(MIN)
    data["nodes"][0]["id"] = data["links"][0]["from"] = "dev..1"
    plain = parse_fleet(data)  # without TLS it is only an id
    with pytest.raises(ConfigError, match="cannot be named in a certificate"):
        with_tls(plain, True)
    with pytest.raises(ConfigError, match="dev..1"):
        parse_fleet({**data, "security": {"tls": True}})


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(routing={"polcy": "bandit"}),
     r"routing.polcy: unknown key \(did you mean routing.policy\?\)"),
    (lambda d: d.update(nodez=[]), r"^nodez: unknown key \(did you mean nodes\?\)"),
    (lambda d: d["nodes"][0].update(model=["x"]),
     r"nodes\[0\].model: unknown key \(did you mean nodes\[0\].models\?\)"),
    (lambda d: d["links"][0].update(delay=5), r"links\[0\].delay: unknown key"),
    (lambda d: d.update(zoo={"profiles": "test"}), r"zoo.profiles: unknown key"),
    (lambda d: d.update(routing={"breaker": {"cooldown": 1}}),
     r"routing.breaker.cooldown: unknown key \(did you mean routing.breaker.cooldown_s\?\)"),
    (lambda d: d.update(cost={"compute_usd_per_sec": {}}),
     r"cost.compute_usd_per_sec: unknown key \(did you mean cost.compute_usd_per_s\?\)"),
    (lambda d: d["nodes"][0].update(chat={"models": [{"name": "a", "model": "b"}],
                                          "tsk": "chat"}),
     r"nodes\[0\].chat.tsk: unknown key \(did you mean nodes\[0\].chat.task\?\)"),
])
def test_an_unknown_key_is_refused_at_every_level_with_the_nearest_valid_one(mutate, message):
    import copy

    data = copy.deepcopy(MIN)
    mutate(data)
    with pytest.raises(ConfigError, match=message):
        parse_fleet(data)
