from tierlink.core.types import NodeView, Tier
from tierlink.node.view import build_view

REC = {"node_id": "edge-1", "tier": "edge", "address": "http://x",
       "models": [{"name": "fmnist-medium", "task": "fmnist", "version": "1", "accuracy": 0.92,
                   "latency_ms": 0.3, "cascade": [{"threshold": 0.9, "answered_share": 0.8,
                                                   "answered_accuracy": 0.98}]}],
       "queue_depth": 2, "inflight": 0, "workers": 1, "upstream": ["cloud-1"],
       "links": [{"dst": "cloud-1", "rtt_ms": 80.0, "bandwidth_mbit": 50.0}], "age_s": 0.4}


def test_registry_records_become_the_policy_view_with_breaker_health():
    me = NodeView("dev-1", Tier.DEVICE, ())
    from tierlink.core.types import LinkView

    view = build_view(me, [REC, {"node_id": "broken"}], [LinkView("dev-1", "edge-1", 10, 100)],
                      healthy=lambda n: n != "edge-1", outstanding={})
    edge = view.nodes["edge-1"]
    assert edge.queue_depth == 2 and not edge.healthy and edge.models[0].cascade
    assert "broken" not in view.nodes  # a malformed record is skipped, the rest still routes
    assert view.upstream["dev-1"][Tier.EDGE] == ("edge-1",)


def test_records_are_parsed_once_per_fetched_list(monkeypatch):
    from tierlink.control import client
    from tierlink.node.view import ParsedRecords

    calls = []
    real = client.node_views
    monkeypatch.setattr(client, "node_views", lambda recs: calls.append(1) or real(recs))
    me, parsed = NodeView("dev-1", Tier.DEVICE, ()), ParsedRecords()
    fetched = [REC, {"node_id": "broken"}]
    for health in (True, False, True):  # the view is rebuilt more often than fetched
        view = build_view(me, fetched, [], healthy=lambda n, h=health: h, outstanding={},
                          parsed=parsed)
        assert view.nodes["edge-1"].healthy is health  # live state is applied every time
    assert len(calls) == 2  # two records, parsed once
    refetched = [dict(REC, queue_depth=5)]  # the cache replaces its list on a fetch
    view = build_view(me, refetched, [], healthy=lambda n: True, outstanding={}, parsed=parsed)
    assert view.nodes["edge-1"].queue_depth == 5 and len(calls) == 3
