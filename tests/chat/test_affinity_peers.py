"""Conversation affinity (bounded, forgetful) and reading an upstream's model listing."""

from __future__ import annotations

from tierlink.chat.affinity import SessionAffinity
from tierlink.chat.peers import parse_models
from tierlink.core.types import LanguageModelView, Tier


def test_a_session_is_remembered_until_it_expires_or_is_pushed_out() -> None:
    now = [0.0]
    table = SessionAffinity(capacity=2, ttl_s=10.0, clock=lambda: now[0])
    table.served("a", "cloud-1")
    table.served("b", "dev-1")
    assert table.node_of("a") == "cloud-1" and table.node_of(None) is None
    table.served("c", "edge-1")  # "a" was used least recently
    assert table.node_of("a") is None and len(table) == 2
    now[0] = 11.0
    assert table.node_of("b") is None  # forgotten after ttl_s
    table.served(None, "dev-1")  # no session: nothing kept
    assert len(table) == 1


def test_an_upstream_listing_gives_its_tier_and_language_models() -> None:
    view = LanguageModelView("smollm2", ("chat",), quality=0.76, running=3)
    listing = {"object": "list", "tierlink": {"node_id": "cloud-1", "tier": "cloud"},
               "data": [{"id": "smollm2", "tierlink": {"kind": "model", "view": view.to_dict()}},
                        {"id": "chat", "tierlink": {"kind": "task", "model": "smollm2"}},
                        {"id": "other", "tierlink": {"kind": "upstream", "via": "x"}}]}
    tier, models = parse_models(listing)
    assert tier is Tier.CLOUD and models == (view,)


def test_a_view_round_trips_through_json() -> None:
    view = LanguageModelView("m", ("chat", "qa"), None, 4096, 300.5, 40.25, 0.08, 2, 1, 8,
                             "cloud-1/m", 0.64, 0.002)
    assert LanguageModelView.from_dict(view.to_dict()) == view
