"""Chat placement over a cluster view: privacy first, then context, time to first token and
tokens/s, then the conversation's node, then quality, time and cost."""

from __future__ import annotations

from dataclasses import replace

from tierlink.core.types import (
    ClusterView,
    LanguageModelView,
    LinkView,
    NodeView,
    Privacy,
    Tier,
)
from tierlink.policy.chat import ChatAsk, plan_chat

DRAFT = LanguageModelView("smollm2", ("chat",), quality=0.56, prefill_tok_s=400.0,
                          decode_tok_s=45.0, verifier="cloud-1/smollm2")
LARGE = LanguageModelView("smollm2", ("chat",), quality=0.76, prefill_tok_s=150.0,
                          decode_tok_s=12.0, price_per_1k=0.002)
EDGE = LanguageModelView("smollm2", ("chat",), quality=0.76, prefill_tok_s=150.0,
                         decode_tok_s=12.0, price_per_1k=0.0005)


def _view(me: NodeView | None = None, cloud: NodeView | None = None,
          edge: NodeView | None = None, rtt_ms: float = 20.0) -> ClusterView:
    me = me or NodeView("dev-1", Tier.DEVICE, (), language_models=(DRAFT,))
    nodes = [me, cloud or NodeView("cloud-1", Tier.CLOUD, (), language_models=(LARGE,))]
    links = [LinkView("dev-1", "cloud-1", rtt_ms, 50.0)]
    if edge is not None:
        nodes.append(edge)
        links.append(LinkView("dev-1", edge.node_id, 2.0, 100.0))
    return ClusterView.build("dev-1", nodes, links)


def _ask(**kw: object) -> ChatAsk:
    base = ChatAsk(model="chat", privacy=Privacy.ANY, origin="dev-1", prompt_tokens=40,
                   max_tokens=64, deadline_ms=30_000.0)
    return replace(base, **kw)  # type: ignore[arg-type]


def _kinds(plan: object) -> list[tuple[str, str]]:
    return [(o.kind, o.node_id) for o in plan.options]  # type: ignore[attr-defined]


def test_privacy_decides_first() -> None:
    assert _kinds(plan_chat(_ask(privacy=Privacy.LOCAL), _view())) == [("local", "dev-1")]
    assert _kinds(plan_chat(_ask(privacy=Privacy.SITE), _view())) == [("local", "dev-1")]
    edge = NodeView("edge-1", Tier.EDGE, (), language_models=(EDGE,))
    site = _kinds(plan_chat(_ask(privacy=Privacy.SITE), _view(edge=edge)))
    assert ("remote", "edge-1") in site and all(n != "cloud-1" for _, n in site)
    assert set(_kinds(plan_chat(_ask(), _view()))) == {
        ("local", "dev-1"), ("speculative", "cloud-1"), ("remote", "cloud-1")}


def test_a_local_prompt_from_another_device_is_not_held_here() -> None:
    assert plan_chat(_ask(privacy=Privacy.LOCAL, origin="dev-9"), _view()).empty


def test_quality_puts_the_large_model_first_and_speculation_is_its_cheap_way() -> None:
    plan = plan_chat(_ask(), _view())
    assert plan.options[0].kind == "speculative"
    spec, remote = (next(o for o in plan.options if o.kind == k)
                    for k in ("speculative", "remote"))
    assert spec.est.cost_per_1k < remote.est.cost_per_1k
    assert spec.est.quality == remote.est.quality == 0.76


def test_the_router_verdict_decides_whether_quality_counts() -> None:
    assert plan_chat(_ask(easy=True), _view()).options[0].kind == "local"
    assert plan_chat(_ask(easy=False), _view()).options[0].kind != "local"


def test_unmeasured_quality_is_never_a_reason_to_go_up() -> None:
    me = NodeView("dev-1", Tier.DEVICE, (), language_models=(replace(DRAFT, quality=None),))
    cloud = NodeView("cloud-1", Tier.CLOUD, (),
                     language_models=(replace(LARGE, quality=None),))
    assert plan_chat(_ask(), _view(me, cloud)).options[0].kind == "local"


def test_a_first_token_target_the_link_cannot_meet_keeps_it_here() -> None:
    plan = plan_chat(_ask(ttft_ms=150.0), _view(rtt_ms=300.0))
    assert _kinds(plan) == [("local", "dev-1")]
    none = plan_chat(_ask(ttft_ms=1.0), _view())
    assert none.empty and "first token within 1 ms" in none.reason


def test_a_busy_verifier_loses_to_a_speed_floor() -> None:
    busy = NodeView("cloud-1", Tier.CLOUD, (),
                    language_models=(replace(LARGE, running=16, queued=30),))
    plan = plan_chat(_ask(min_tokens_per_s=10.0), _view(cloud=busy))
    assert _kinds(plan) == [("local", "dev-1")]
    idle = plan_chat(_ask(min_tokens_per_s=10.0), _view())
    assert {o.kind for o in idle.options} == {"local", "speculative", "remote"}
    fast = plan_chat(_ask(min_tokens_per_s=20.0), _view())
    assert _kinds(fast) == [("local", "dev-1")]  # 12 tok/s alone upstream


def test_load_raises_the_estimated_time_to_first_token() -> None:
    calm = plan_chat(_ask(), _view())
    busy = plan_chat(_ask(), _view(cloud=NodeView(
        "cloud-1", Tier.CLOUD, (), language_models=(replace(LARGE, running=16, queued=20),))))
    def ttft(plan: object, kind: str) -> float:
        return next(o.est.ttft_ms for o in plan.options if o.kind == kind)  # type: ignore[attr-defined]
    assert ttft(busy, "remote") > 2 * ttft(calm, "remote")


def test_a_conversation_returns_to_the_node_holding_its_cache() -> None:
    assert plan_chat(_ask(sticky="dev-1"), _view()).options[0].kind == "local"
    gone = replace(_view().nodes["cloud-1"], healthy=False)
    plan = plan_chat(_ask(sticky="cloud-1"), _view(cloud=gone))
    assert _kinds(plan) == [("local", "dev-1")]  # its node is down: placed afresh


def test_context_length_and_unknown_models() -> None:
    small = NodeView("dev-1", Tier.DEVICE, (),
                     language_models=(replace(DRAFT, context=100),))
    plan = plan_chat(_ask(prompt_tokens=90, max_tokens=20), _view(small))
    assert [o.kind for o in plan.options] == ["remote"]
    unknown = plan_chat(_ask(model="gpt-9"), _view())
    assert unknown.empty and "'gpt-9'" in unknown.reason


def test_a_node_without_a_model_relays_and_the_cheaper_equal_wins() -> None:
    gateway = NodeView("dev-1", Tier.DEVICE, ())
    edge = NodeView("edge-1", Tier.EDGE, (), language_models=(EDGE,))
    plan = plan_chat(_ask(), _view(gateway, edge=edge))
    assert _kinds(plan) == [("remote", "edge-1"), ("remote", "cloud-1")]


def test_a_chosen_mode_filters_and_skips_the_time_limits() -> None:
    plan = plan_chat(_ask(only="remote", ttft_ms=1.0), _view())
    assert _kinds(plan) == [("remote", "cloud-1")]
    refused = plan_chat(_ask(only="speculative", privacy=Privacy.LOCAL), _view())
    assert refused.empty and "as speculative" in refused.reason


def test_the_hop_limit_stops_relays() -> None:
    assert {o.kind for o in plan_chat(_ask(hops=3), _view()).options} == {
        "local", "speculative"}


def test_a_pinned_conversation_leaves_a_node_too_loaded_to_answer_in_time() -> None:
    """A hot spot: one session's affinity would pin all of its turns to one node; once that
    node cannot give the first token in time, the turn goes where it can (the cache is
    then prefilled there), and it comes back when the node is free again."""
    jammed = NodeView("cloud-1", Tier.CLOUD, (), language_models=(
        replace(LARGE, running=16, queued=400),))
    ask = _ask(sticky="cloud-1", ttft_ms=3000.0)
    assert plan_chat(ask, _view()).options[0].node_id == "cloud-1"
    moved = plan_chat(ask, _view(cloud=jammed))
    assert moved.options and all(o.node_id != "cloud-1" for o in moved.options)


def test_a_split_goes_where_the_prompt_s_features_may() -> None:
    head = replace(DRAFT, verifier="", split="cloud-1/smollm2", split_share=8 / 30)
    me = NodeView("dev-1", Tier.DEVICE, (), language_models=(head,))
    # a local prompt's hidden states leave its device only where the fleet allows it
    assert _kinds(plan_chat(_ask(privacy=Privacy.LOCAL), _view(me))) == [("local", "dev-1")]
    allowed = plan_chat(_ask(privacy=Privacy.LOCAL, features_may_leave=True), _view(me))
    assert set(_kinds(allowed)) == {("local", "dev-1"), ("split", "cloud-1")}
    assert all(o.kind != "remote" for o in allowed.options)  # the text itself stays
    # a site prompt's features never reach the cloud; an `any` prompt's may
    assert ("split", "cloud-1") not in _kinds(plan_chat(_ask(privacy=Privacy.SITE,
                                                             features_may_leave=True),
                                                        _view(me)))
    split = next(o for o in plan_chat(_ask(), _view(me)).options if o.kind == "split")
    assert split.model == "smollm2" and split.local_model == "smollm2"
    # every token crosses the link: slower than relaying the whole answer
    remote = next(o for o in plan_chat(_ask(), _view(me)).options if o.kind == "remote")
    assert split.est.tokens_per_s < remote.est.tokens_per_s
    assert split.est.tokens_per_s < 1000.0 / 20.0  # at most one token per 20 ms round trip
    gone = NodeView("cloud-1", Tier.CLOUD, (), language_models=(LARGE,), healthy=False)
    assert ("split", "cloud-1") not in _kinds(plan_chat(_ask(), _view(me, cloud=gone)))
