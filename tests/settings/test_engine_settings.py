"""A node's engine: ONNX Runtime in process, or Ray Serve with its autoscaling."""

from __future__ import annotations

import pytest

from tierlink.errors import ConfigError
from tierlink.fleet.config import parse_fleet
from tierlink.settings.engine import EngineConfig, engine_from_dict, parse_engine


def test_the_default_is_onnxruntime_in_process() -> None:
    node = parse_fleet({"nodes": [{"id": "c", "tier": "cloud", "models": ["m"]}]}).nodes[0]
    assert node.engine == EngineConfig() and not node.engine.on_ray


def test_ray_settings_are_read_and_checked() -> None:
    config = parse_engine("ray", {"min_replicas": 2, "max_replicas": 4, "num_cpus": 0.25}, "n")
    assert (config.on_ray, config.min_replicas, config.max_replicas, config.num_cpus) == \
        (True, 2, 4, 0.25)
    assert engine_from_dict(config.to_dict()) == config
    assert engine_from_dict({}) == EngineConfig()
    for kind, ray in (("tensorrt", None), ("onnxruntime", {"num_cpus": 1}),
                      ("ray", {"replicas": 3}), ("ray", {"min_replicas": 3, "max_replicas": 2}),
                      ("ray", {"num_cpus": 0})):
        with pytest.raises(ConfigError):
            parse_engine(kind, ray, "n")
