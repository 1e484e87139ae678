"""Task declarations (``tasks/spec.py``): the fleet YAML / model store form, what is refused
(naming the field), how inputs match, and the ``tasks:`` section of a fleet file."""

from __future__ import annotations

import json

import pytest

from tierlink.errors import ConfigError
from tierlink.fleet.config import parse_fleet
from tierlink.models.task import TaskSpec, same_inputs, task_from_dict
from tierlink.models.tensors import TensorDecl, tensor_decl

SPAM = {"kind": "classification",
        "input": {"name": "tokens", "datatype": "int64", "shape": [-1, 256]},
        "outputs": {"scores": "logits"}, "labels": ["ham", "spam"],
        "options": {"probabilities": False}}


def test_the_fleet_form_parses_with_one_input():
    task = task_from_dict("spam", SPAM)
    assert task.name == "spam" and task.kind == "classification"
    assert task.inputs == (TensorDecl("tokens", "INT64", (-1, 256)),)  # datatype upper-cased
    assert task.output("scores") == "logits" and task.output("boxes") is None
    assert task.labels == ("ham", "spam")
    assert task.option("probabilities") is False and task.option("tolerance", 0.5) == 0.5


def test_defaults_are_a_classifier_and_fp32():
    task = task_from_dict("t", {"inputs": [{"name": "x", "shape": [-1, 4]}]})
    assert task.kind == "classification"
    assert task.inputs == (TensorDecl("x", "FP32", (-1, 4)),)
    assert dict(task.outputs) == {} and task.labels == () and dict(task.options) == {}


def test_several_inputs_keep_their_order():
    task = task_from_dict("t", {"inputs": [{"name": "a", "shape": [-1, 3]},
                                           {"name": "b", "datatype": "FP64", "shape": [-1]}]})
    assert [i.describe() for i in task.inputs] == ["a FP32[-1, 3]", "b FP64[-1]"]


def test_to_dict_round_trips_through_json():
    task = task_from_dict("spam", SPAM)
    again = task_from_dict("spam", json.loads(json.dumps(task.to_dict())), "model store")
    assert again == task
    assert task.to_dict()["inputs"] == [{"name": "tokens", "datatype": "INT64",
                                         "shape": [-1, 256]}]


def test_a_task_is_frozen_including_its_mappings():
    task = task_from_dict("spam", SPAM)
    with pytest.raises(AttributeError):
        task.kind = "regression"  # type: ignore[misc]
    with pytest.raises(TypeError):
        task.outputs["scores"] = "other"  # type: ignore[index]
    with pytest.raises(TypeError):
        task.options["probabilities"] = True  # type: ignore[index]


def test_the_declared_name_may_differ_from_the_key():
    assert task_from_dict("key", {**SPAM, "name": "spam"}).name == "spam"


@pytest.mark.parametrize("raw, words", [
    ("not a mapping", ["tasks.spam must be a mapping"]),
    ({**SPAM, "colour": "red"}, ["unknown key(s) ['colour']"]),
    ({"kind": "classification"}, ["tasks.spam declares no input"]),
    ({"inputs": "x"}, ["declares no input"]),
    ({**SPAM, "outputs": ["logits"]}, ["tasks.spam.outputs must map roles"]),
    ({**SPAM, "options": [1]}, ["tasks.spam.options must be a mapping"]),
    ({**SPAM, "input": "tokens"}, ["tasks.spam.inputs[0] must be a mapping"]),
    ({**SPAM, "input": {"name": "tokens", "datatype": "STRING", "shape": [-1]}},
     ["tasks.spam.inputs[0].datatype 'STRING'", "not an OIP datatype"]),
    ({**SPAM, "input": {"name": "tokens", "shape": [-1, 0]}},
     ["tasks.spam.inputs[0].shape [-1, 0]"]),
    ({**SPAM, "input": {"name": "tokens", "shape": [-2, 4]}}, ["-1 for any"]),
    ({**SPAM, "input": {"shape": [-1, 4]}}, ["tasks.spam.inputs[0]", "'name'"]),
    ({**SPAM, "input": {"name": "x", "shape": ["many"]}}, ["tasks.spam.inputs[0]"]),
])
def test_a_bad_declaration_is_refused_naming_the_field(raw, words):
    with pytest.raises(ConfigError) as err:
        task_from_dict("spam", raw)
    for word in words:
        assert word in err.value.message


def test_tensor_decl_needs_a_shape():
    with pytest.raises(ConfigError, match="here"):
        tensor_decl({"name": "x"}, "here")


@pytest.mark.parametrize("a, b, same", [
    (TensorDecl("x", "FP32", (-1, 4)), TensorDecl("x", "FP32", (8, 4)), True),  # -1: any
    (TensorDecl("x", "FP32", (-1, -1)), TensorDecl("x", "FP32", (-1, 4)), True),
    (TensorDecl("x", "FP32", (-1, 4)), TensorDecl("x", "FP32", (-1, 5)), False),
    (TensorDecl("x", "FP32", (-1, 4)), TensorDecl("x", "FP64", (-1, 4)), False),
    (TensorDecl("x", "FP32", (-1, 4)), TensorDecl("input", "FP32", (-1, 4)), False),
    (TensorDecl("x", "FP32", (-1, 4)), TensorDecl("x", "FP32", (-1, 4, 1)), False),
])
def test_tensor_decls_match_by_name_datatype_rank_and_fixed_sizes(a, b, same):
    assert a.matches(b) is same and b.matches(a) is same


def test_same_inputs_compares_every_input_in_order():
    def spec(*decls: TensorDecl) -> TaskSpec:
        return TaskSpec("t", "classification", decls)

    a, b = TensorDecl("a", "FP32", (-1, 3)), TensorDecl("b", "FP32", (-1, 1))
    assert same_inputs(spec(a, b), spec(a, b))
    assert not same_inputs(spec(a, b), spec(a))
    assert not same_inputs(spec(a, b), spec(b, a))


# -- the fleet file's ``tasks:`` ----------------------------------------------------------

NODES = {"nodes": [{"id": "dev-1", "tier": "device", "models": ["spam-tiny"],
                    "providers": ["cuda", "cpu"]}], "links": []}


def test_a_fleet_declares_tasks_and_node_providers():
    cfg = parse_fleet({**NODES, "tasks": {"spam": SPAM}})
    assert cfg.tasks["spam"] == task_from_dict("spam", SPAM)
    assert cfg.nodes[0].providers == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert parse_fleet(NODES).tasks == {}


def test_a_fleet_task_of_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError) as err:
        parse_fleet({**NODES, "tasks": {"spam": {**SPAM, "kind": "keypoints"}}})
    assert "unknown output kind 'keypoints'" in err.value.message
    for kind in ("classification", "multilabel", "detection", "regression", "embedding"):
        assert kind in err.value.hint


def test_a_fleet_task_error_names_the_task():
    with pytest.raises(ConfigError, match=r"tasks\.spam\.inputs\[0\]\.datatype"):
        parse_fleet({**NODES, "tasks": {"spam": {**SPAM, "input": {
            "name": "tokens", "datatype": "TEXT", "shape": [-1]}}}})
