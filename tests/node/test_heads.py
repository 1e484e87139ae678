import pytest

from tierlink.core.types import ModelView, SplitPoint
from tierlink.node.heads import scale_heads

HEAD = ModelView("big", "t", "1", 0.9, 10.0, splits=(SplitPoint("c1", 2.0, 0.0, 100),
                                                     SplitPoint("c2", 6.0, 0.0, 10)))


def test_heads_are_priced_at_the_speed_the_node_really_runs():
    # A device under a 0.5-core quota: its own model takes twice what its card says.
    scaled = scale_heads((HEAD,), {"small": 1.0}, {"small": 2.0})
    assert [p.head_ms for p in scaled[0].splits] == pytest.approx([4.0, 12.0], rel=0.02)


def test_without_evidence_or_at_full_speed_the_profile_stands():
    assert scale_heads((HEAD,), {"small": 1.0}, {}) == (HEAD,)
    assert scale_heads((HEAD,), {"small": 1.0}, {"small": 1.02}) == (HEAD,)
    assert scale_heads((), {"small": 1.0}, {"small": 3.0}) == ()


def test_a_device_that_only_runs_heads_learns_its_speed_from_them():
    # No whole model here (a camera holding only the head): the heads it ran say 10x.
    from tierlink.node.heads import head_key

    scaled = scale_heads((HEAD,), {}, {head_key("big", "c1"): 20.0})
    assert [p.head_ms for p in scaled[0].splits] == pytest.approx([20.0, 60.0], rel=0.02)


def test_the_whole_models_run_here_are_the_yardstick_when_there_are_any():
    # A head measured once in a bad moment is not renewed unless the policy picks that cut
    # again; the node's own model keeps being run.
    from tierlink.node.heads import head_key

    service = {"small": 2.0, head_key("big", "c1"): 40.0, head_key("big", "c2"): 60.0}
    scaled = scale_heads((HEAD,), {"small": 1.0}, service)
    assert [p.head_ms for p in scaled[0].splits] == pytest.approx([4.0, 12.0], rel=0.02)
