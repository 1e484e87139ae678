"""The Ray Serve engine's parts that need no cluster: autoscaling settings from the fleet
file, one application per model version, a node without a cluster address refused."""

from __future__ import annotations

import pytest

from tierlink.errors import ConfigError
from tierlink.node.ray_serve import RayHost, _autoscaling, app_name
from tierlink.settings.engine import EngineConfig


def test_autoscaling_follows_the_fleet_file() -> None:
    config = EngineConfig(kind="ray", min_replicas=1, max_replicas=3,
                          target_ongoing_requests=1.5)
    scaling = _autoscaling(config)
    assert (scaling["min_replicas"], scaling["max_replicas"],
            scaling["target_ongoing_requests"]) == (1, 3, 1.5)
    assert app_name("cloud-1", "m", "3") == "tierlink-cloud-1-m-v3"


def test_a_ray_node_without_a_cluster_address_is_refused() -> None:
    with pytest.raises(ConfigError, match="no ray_address"):
        RayHost("cloud-1", "", EngineConfig(kind="ray"))
