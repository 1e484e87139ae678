"""A node's split profile travels with its heartbeat and comes back as ModelView.splits."""

from tierlink.control.client import node_views
from tierlink.control.schemas import Heartbeat
from tierlink.core.types import ModelView, SplitPoint
from tierlink.node.view import model_view_to_dict


def test_split_points_round_trip_through_the_heartbeat_schema():
    points = (SplitPoint("/4/MaxPool_output_0", 0.21, 0.35, 25088),
              SplitPoint("/11/MaxPool_output_0", 0.4, 0.12, 12544))
    model = ModelView("fmnist-large", "fmnist", "1", 0.93, 0.7, splits=points)
    body = Heartbeat.model_validate({
        "node_id": "cloud-1", "tier": "cloud", "address": "http://127.0.0.1:1",
        "started_at": 1.0, "models": [model_view_to_dict(model)]})
    record = body.model_dump(mode="json")
    (node,), _ = node_views([record])
    assert node.models[0].splits == points


def test_a_model_without_a_profile_has_no_split_points():
    model = ModelView("fmnist-small", "fmnist", "1", 0.9, 0.1)
    assert model_view_to_dict(model)["splits"] == []
