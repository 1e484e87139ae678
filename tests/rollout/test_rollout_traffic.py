import random

import pytest

from tierlink.rollout.traffic import (
    Assignment,
    all_on,
    assign,
    canary_order,
    expected_share,
    stage_weights,
)


def ids(n):
    return [f"edge-{i}" for i in range(1, n + 1)]


@pytest.mark.parametrize("n, weights", [
    (1, [0.1]),
    (2, [0.2]),
    (3, [0.3]),
    (10, [1.0]),
    (15, [1.0, 0.5]),
])
def test_ten_percent_canary_weights(n, weights):
    assert stage_weights(0.1, n) == pytest.approx(weights)
    a = assign("m", "2", "1", 0.1, ids(n))
    assert len(a) == n
    assert expected_share(a, "2") == pytest.approx(0.1)
    assert expected_share(a, "1") == pytest.approx(sum(x.weight for x in a if x.version == "1")
                                                   / n)
    moved = [x for x in a if x.version == "2"]
    assert sorted(x.weight for x in moved) == pytest.approx(sorted(weights))


def test_two_edges_at_ten_percent_is_one_node_at_point_two():
    a = assign("fmnist-medium", "2", "1", 0.1, ["edge-1", "edge-2"])
    assert [x.node_id for x in a] == ["edge-1", "edge-2"]  # sorted output
    assert sorted((x.version, x.weight) for x in a) == [("1", 1.0), ("2", 0.2)]


def test_full_stage_and_all_on():
    a = assign("m", "2", "1", 1.0, ids(3))
    assert all(x.version == "2" and x.weight == 1.0 for x in a)
    assert all_on("1", ["b", "a", "a"]) == (Assignment("a", "1", 1.0), Assignment("b", "1", 1.0))
    assert expected_share((), "2") == 0.0


def test_order_is_deterministic_and_input_order_free():
    nodes = ids(12)
    shuffled = nodes[:]
    random.Random(1).shuffle(shuffled)
    assert canary_order("m", "2", nodes) == canary_order("m", "2", shuffled)
    assert assign("m", "2", "1", 0.3, nodes) == assign("m", "2", "1", 0.3, shuffled)


def test_order_differs_between_rollouts():
    nodes = ids(20)
    firsts = {canary_order("m", str(v), nodes)[0] for v in range(20)}
    assert len(firsts) > 3  # not always the same guinea pig


def test_property_shares_and_nesting_random_fleets():
    rng = random.Random(11)
    for _ in range(300):
        n = rng.randint(1, 40)
        nodes = rng.sample([f"n{i}" for i in range(100)], n)
        stages = sorted({round(rng.uniform(0.01, 1.0), 3) for _ in range(3)}) + [1.0]
        previous_moved: dict[str, float] = {}
        for f in stages:
            a = assign("m", "v2", "v1", f, nodes)
            assert expected_share(a, "v2") == pytest.approx(f, abs=1e-9)
            assert all(0 < x.weight <= 1 for x in a)
            partial = [x for x in a if x.version == "v2" and x.weight < 1]
            assert len(partial) <= 1
            moved = {x.node_id: x.weight for x in a if x.version == "v2"}
            # each stage's canary set contains the previous one's, at no lower weight
            assert all(moved.get(node, 0) >= w - 1e-12 for node, w in previous_moved.items())
            previous_moved = moved


def test_assignment_json_round_trip():
    a = Assignment("edge-1", "2", 0.2)
    assert Assignment.from_dict(a.to_dict()) == a
