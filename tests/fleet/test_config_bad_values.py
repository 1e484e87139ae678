"""A fleet file's wrong values and misspelled keys are refused with a ConfigError naming the
field, whatever their type — never a Python error from deep in the parser."""

from typing import Any

import pytest

from tierlink.errors import ConfigError
from tierlink.fleet.config import parse_fleet

BASE: dict[str, Any] = {"name": "x", "nodes": [{"id": "c", "tier": "cloud", "models": []}]}
TASK = {"input": {"name": "x", "datatype": "FP32", "shape": [-1, 3]}}
CHAT = {"name": "lm", "model": "smollm2-135m"}


@pytest.mark.parametrize(("change", "named"), [
    ({"nodes": [{"id": "c", "tier": {"a": 1}, "models": []}]}, "nodes[0].tier"),
    ({"nodes": [{"id": "c", "tier": 3, "models": []}]}, "nodes[0].tier"),
    ({"links": 5}, "links"),
    ({"tasks": {"t": {"input": {"name": "x", "shape": [-1, 3], "dtyp": "FP32"}}}},
     "tasks.t.inputs[0]: unknown key(s) ['dtyp']"),
    ({"tasks": {"t": {**TASK, "labels": 5}}}, "tasks.t.labels"),
    ({"routing": {"cascade": {"records": {"m": {"share": 1.0, "accuracy": 0.9,
                                                "acuracy": 0.9}}}}}, "unknown key(s) ['acuracy']"),
    ({"nodes": [{"id": "c", "tier": "cloud", "models": [],
                 "chat": {"models": [{**CHAT, "max_sequences": "many"}]}}]}, "max_sequences"),
    ({"nodes": [{"id": "c", "tier": "cloud", "models": [],
                 "chat": {"models": [{**CHAT, "max_sequences": 0}]}}]}, "max_sequences"),
    ({"nodes": [{"id": "c", "tier": "cloud", "models": [], "threads": 0}]}, "nodes[0].threads"),
    ({"nodes": [{"id": "c", "tier": "cloud", "models": [], "escalation_queue": -1}]},
     "nodes[0].escalation_queue"),
    ({"nodes": [{"id": "c", "tier": "cloud", "models": [], "escalation_queue": "deep"}]},
     "nodes[0].escalation_queue"),
    ({"nodes": [{"id": "c", "tier": "cloud", "models": [], "device_state_file": 5}]},
     "nodes[0].device_state_file"),
    ({"routing": {"device_state": {"hot": "warm"}}}, "routing.device_state.hot"),
    ({"routing": {"device_state": {"low_battery": 2}}}, "routing.device_state.low_battery"),
    ({"routing": {"device_state": {"low_batery": 0.1}}}, "routing.device_state.low_batery"),
])
def test_a_wrong_value_is_a_config_error_naming_its_field(change: dict[str, Any],
                                                          named: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_fleet({**BASE, **change}, "fleet.yaml")
    assert named in err.value.message
