from tierlink.core.types import ModelView, SplitPoint
from tierlink.node.service import scale_heads

HEAD = ModelView("big", "t", "1", 0.9, 10.0, splits=(SplitPoint("c1", 2.0, 0.0, 100),
                                                     SplitPoint("c2", 6.0, 0.0, 10)))


def test_heads_are_priced_at_the_speed_the_node_really_runs():
    # A device under a 0.5-core quota: its own model takes twice what its card says.
    scaled = scale_heads((HEAD,), {"small": 1.0}, {"small": 2.0})
    assert [p.head_ms for p in scaled[0].splits] == [4.0, 12.0]


def test_without_evidence_or_at_full_speed_the_profile_stands():
    assert scale_heads((HEAD,), {"small": 1.0}, {}) == (HEAD,)
    assert scale_heads((HEAD,), {"small": 1.0}, {"small": 1.02}) == (HEAD,)
    assert scale_heads((), {"small": 1.0}, {"small": 3.0}) == ()
