from __future__ import annotations

import pytest
from pydantic import ValidationError

from tierlink.control.schemas import Heartbeat, NodeRecord, format_validation_error


def _error(body: dict) -> str:
    with pytest.raises(ValidationError) as info:
        Heartbeat.model_validate(body)
    return format_validation_error(info.value, what="heartbeat")


def test_a_full_heartbeat_validates(make_body):
    hb = Heartbeat.model_validate(make_body())
    assert hb.node_id == "edge-1" and hb.tier == "edge"
    assert hb.models[0].cascade[0].answered_accuracy == 0.97
    assert hb.links[0].dst == "cloud-1" and hb.extra == {}


def test_unknown_fields_are_kept_in_extra_at_every_level(make_body):
    body = make_body(gpu={"kind": "none"}, zone="eu-1")
    body["models"][0]["quantization"] = "int8"
    body["links"][0]["jitter_ms"] = 2.0
    body["models"][0]["cascade"][0]["ece"] = 0.01
    hb = Heartbeat.model_validate(body)
    assert hb.extra == {"gpu": {"kind": "none"}, "zone": "eu-1"}
    assert hb.models[0].extra == {"quantization": "int8"}
    assert hb.models[0].cascade[0].extra == {"ece": 0.01}
    assert hb.links[0].extra == {"jitter_ms": 2.0}
    # ... and survive a round trip through the JSON the registry stores.
    again = Heartbeat.model_validate_json(hb.model_dump_json())
    assert again == hb


def test_extras_merge_with_an_explicit_extra_dict(make_body):
    hb = Heartbeat.model_validate(make_body(extra={"a": 1}, b=2))
    assert hb.extra == {"a": 1, "b": 2}


@pytest.mark.parametrize("node_id", ["a", "edge-1", "cloud.eu_west-2", "0" * 63])
def test_valid_node_ids(make_body, node_id):
    assert Heartbeat.model_validate(make_body(node_id=node_id)).node_id == node_id


@pytest.mark.parametrize("node_id", ["", "Edge-1", "edge 1", "-edge", ".x", "a" * 64, "é"])
def test_invalid_node_ids_are_named(make_body, node_id):
    message = _error(make_body(node_id=node_id))
    assert message.startswith("invalid heartbeat: node_id: ")
    assert repr(node_id)[:20] in message


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.update(tier="fog"), "tier"),
        (lambda b: b.update(address="127.0.0.1:8101"), "address"),
        (lambda b: b.update(workers=0), "workers"),
        (lambda b: b.update(queue_depth=-1), "queue_depth"),
        (lambda b: b.update(upstream=["cloud-1", "Cloud 2"]), "upstream[1]"),
        (lambda b: b["models"][0].update(accuracy=1.5), "models[0].accuracy"),
        (lambda b: b["models"][0]["cascade"][0].update(threshold=2), "models[0].cascade[0]"),
        (lambda b: b["links"][0].update(bandwidth_mbit=0), "links[0].bandwidth_mbit"),
        (lambda b: b.pop("started_at"), "started_at"),
    ],
)
def test_errors_name_the_field(make_body, mutate, field):
    body = make_body()
    mutate(body)
    assert f"heartbeat: {field}" in _error(body)


def test_duplicates_and_self_links_are_refused(make_body):
    body = make_body()
    body["models"].append(dict(body["models"][0]))
    assert "models: the same (name, version)" in _error(body)
    body = make_body(links=[{"dst": "edge-1", "rtt_ms": 1.0, "bandwidth_mbit": 1.0}])
    assert "links/upstream" in _error(body)


def test_a_numeric_version_is_read_as_text(make_body):
    body = make_body()
    body["models"][0]["version"] = 3
    assert Heartbeat.model_validate(body).models[0].version == "3"


def test_node_record_adds_registry_fields(make_body):
    record = NodeRecord.model_validate(
        {**make_body(), "registered_at": 1.0, "last_seen": 2.0, "age_s": 0.5, "generation": 1}
    )
    assert isinstance(record, Heartbeat) and record.generation == 1 and record.extra == {}
