"""A node's inbox route: dedupe by key, relay into its own outbox, per-item acks."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from uplink_support import FakeClock, FakeUpstream

from tierlink.node.inbox_routes import InboxReceiver, install_inbox_routes
from tierlink.node.uplink import CONTROL, INBOX_PATH, Uplink, UplinkConfig, UplinkMetrics


class Edge:
    """An edge's app with only the inbox route; its uplink delivers to a fake control plane
    once ``start`` (the app's lifespan) runs."""

    def __init__(self, root: Path, config: UplinkConfig | None = None) -> None:
        self.control = FakeUpstream(FakeClock())
        self.metrics = UplinkMetrics("edge")
        self.uplink = Uplink("edge-1", root / "edge", control_url="http://control.test:7000",
                             config=config, metrics=self.metrics, clock=self.control.clock,
                             transport=self.control.transport())
        self.receiver = InboxReceiver.open(root / "edge", self.uplink)
        self.app = FastAPI(lifespan=self._lifespan)
        self.deliver = False
        install_inbox_routes(self.app, self.receiver)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        if self.deliver:
            self.uplink.start()
        try:
            yield
        finally:
            if self.deliver:
                await self.uplink.stop()

    def relayed(self) -> list[dict[str, Any]]:
        """What waits in the edge's outbox: key, kind, destination and the envelope."""
        items = self.uplink.outbox.due(CONTROL, self.control.clock() + 1, 100)
        return [{"key": i.key, "kind": i.kind, "destination": i.destination,
                 **json.loads(i.payload)} for i in items]


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Edge]:
    made = Edge(tmp_path)
    yield made
    made.receiver.close()


def batch(*items: Any, sender: str = "dev-1") -> dict[str, Any]:
    return {"from": sender, "items": list(items)}


def item(key: str, kind: str = "result", **extra: Any) -> dict[str, Any]:
    return {"key": key, "kind": kind, "payload": {"k": key}, "created_at": 1000.0, **extra}


def statuses(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return [a["status"] for a in response.json()["acks"]]


def test_items_are_relayed_once_toward_the_control_plane(edge: Edge) -> None:
    sent = batch(item("dev-1:1"), item("dev-1:2", kind="hard_example"), item("dev-1:3"))
    with TestClient(edge.app) as client:
        assert statuses(client.post(INBOX_PATH, json=sent)) == ["ok", "ok", "ok"]
        assert statuses(client.post(INBOX_PATH, json=sent)) == ["duplicate"] * 3  # a replay
    relayed = edge.relayed()
    assert [r["key"] for r in relayed] == ["dev-1:1", "dev-1:2", "dev-1:3"]  # in order
    assert relayed[1] == {"key": "dev-1:2", "kind": "hard_example", "destination": CONTROL,
                          "payload": {"k": "dev-1:2"}, "created_at": 1000.0,
                          "chain": ["dev-1"]}  # the sender joins the chain
    assert edge.receiver.inbox.count() == 3
    assert edge.metrics.registry.get_sample_value(
        "tierlink_inbox_items_total", {"tier": "edge", "status": "duplicate"}) == 3


@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "the body is not JSON"),
    (b"[1, 2]", "not an object"),
    (json.dumps({"items": []}).encode(), "from: expected the sending node's id"),
    (json.dumps({"from": "dev-1", "items": {"a": 1}}).encode(), "items: expected a list"),
    (json.dumps(batch(item("dev-1:1"), {"kind": "result", "payload": 1})).encode(),
     "items[1].key: expected a non-empty string"),
    (json.dumps(batch(item("dev-1:1"), "oops")).encode(), "items[1]: expected an object"),
])
def test_a_malformed_batch_is_a_400_and_nothing_is_stored(edge: Edge, body: bytes,
                                                          message: str) -> None:
    with TestClient(edge.app) as client:
        response = client.post(INBOX_PATH, content=body,
                               headers={"content-type": "application/json"})
    assert response.status_code == 400
    answer = response.json()
    assert answer["code"] == "invalid_request"
    assert message in answer["error"] and answer["error"].startswith("invalid outbox batch")
    assert "tierlink.outbox.wire" in answer["hint"]
    assert edge.uplink.outbox.pending() == 0 and edge.receiver.inbox.count() == 0


def test_an_unacceptable_item_is_rejected_and_the_others_go_through(edge: Edge) -> None:
    sent = batch(item("dev-1:1"), item("dev-1:2", kind="Not A Kind"),
                 {"key": "dev-1:3", "kind": "result", "created_at": 1.0},
                 item("dev-1:4", chain="dev-0"), item("dev-1:5"))
    with TestClient(edge.app) as client:
        response = client.post(INBOX_PATH, json=sent)
    assert statuses(response) == ["ok", "rejected", "rejected", "rejected", "ok"]
    details = [a["detail"] for a in response.json()["acks"]]
    assert details[1].startswith("items[1].kind: expected a lower-case name")
    assert details[2] == "items[2].payload: missing"
    assert details[3].startswith("items[3].chain: expected a list")
    assert [r["key"] for r in edge.relayed()] == ["dev-1:1", "dev-1:5"]


def test_a_full_outbox_answers_retry_from_there_on(tmp_path: Path) -> None:
    edge = Edge(tmp_path, UplinkConfig(max_items=2))
    sent = batch(item("dev-1:1"), item("dev-1:2"), item("dev-1:3"), item("dev-1:4"))
    with TestClient(edge.app) as client:
        response = client.post(INBOX_PATH, json=sent)
        assert statuses(response) == ["ok", "ok", "retry", "retry"]
        assert "refused" in response.json()["acks"][2]["detail"]
        edge.uplink.outbox.ack([i.id for i in edge.uplink.outbox.due(CONTROL, edge.control.clock(), 1)])
        # The sender sends its line again from the item that failed.
        assert statuses(client.post(INBOX_PATH, json=batch(*sent["items"][2:]))) == \
            ["ok", "retry"]
    assert edge.receiver.inbox.count() == 3  # a refused item was not recorded
    edge.receiver.close()


def test_a_key_waiting_as_another_kind_is_rejected(edge: Edge) -> None:
    edge.uplink.enqueue("telemetry", "dev-1:1", {}, CONTROL)
    with TestClient(edge.app) as client:
        response = client.post(INBOX_PATH, json=batch(item("dev-1:1")))
    assert statuses(response) == ["rejected"]
    assert "use a fresh key" in response.json()["acks"][0]["detail"]


def test_a_relay_whose_record_was_lost_is_not_stored_twice(edge: Edge) -> None:
    # As if the edge died after putting the item into its outbox, before recording the key.
    edge.uplink.enqueue("result", "dev-1:1", {"k": "dev-1:1"}, CONTROL, chain=("dev-1",))
    with TestClient(edge.app) as client:
        assert statuses(client.post(INBOX_PATH, json=batch(item("dev-1:1")))) == ["ok"]
    assert edge.uplink.outbox.pending() == 1


def test_relayed_items_reach_the_control_plane_with_their_chain(edge: Edge) -> None:
    edge.deliver = True
    with TestClient(edge.app) as client:
        assert statuses(client.post(INBOX_PATH, json=batch(item("dev-1:1")))) == ["ok"]
        deadline = time.monotonic() + 10
        while not edge.control.applied and time.monotonic() < deadline:
            time.sleep(0.005)
    assert edge.control.applied == ["dev-1:1"]
    delivered = edge.control.bodies[0]
    assert delivered["from"] == "edge-1"
    assert delivered["items"][0]["chain"] == ["dev-1"]
    assert str(edge.control.requests[0].url) == "http://control.test:7000/v1/results"


def test_a_relay_keeps_an_item_for_what_it_had_left_not_a_fresh_ttl(edge: Edge) -> None:
    now, own = edge.control.clock(), edge.uplink.outbox.default_ttl_s
    sent = batch(item("dev-1:1", ttl_s=30.0), item("dev-1:2"), item("dev-1:3", ttl_s=10 * own))
    with TestClient(edge.app) as client:
        assert statuses(client.post(INBOX_PATH, json=sent)) == ["ok", "ok", "ok"]
    expires = {i.key: i.expires_at - now
               for i in edge.uplink.outbox.due(CONTROL, now + 1, 100)}
    # The remainder; the relay's own TTL when the sender says nothing, and at most that.
    assert expires == {"dev-1:1": pytest.approx(30.0), "dev-1:2": pytest.approx(own),
                       "dev-1:3": pytest.approx(own)}


def test_a_bad_or_spent_ttl_is_rejected_alone(edge: Edge) -> None:
    sent = batch(item("dev-1:1", ttl_s="soon"), item("dev-1:2", ttl_s=0),
                 item("dev-1:3", ttl_s=True), item("dev-1:4", ttl_s=5.5))
    with TestClient(edge.app) as client:
        response = client.post(INBOX_PATH, json=sent)
    assert statuses(response) == ["rejected", "rejected", "rejected", "ok"]
    details = [a["detail"] for a in response.json()["acks"]]
    assert details[0].startswith("items[0].ttl_s: expected the seconds")
    assert "expired before it arrived" in details[1]
    assert [r["key"] for r in edge.relayed()] == ["dev-1:4"]


def test_a_sender_tells_each_item_s_remaining_ttl(edge: Edge) -> None:
    edge.deliver = True
    with TestClient(edge.app) as client:
        assert statuses(client.post(INBOX_PATH, json=batch(item("dev-1:1", ttl_s=42.0)))) \
            == ["ok"]
        deadline = time.monotonic() + 10
        while not edge.control.applied and time.monotonic() < deadline:
            time.sleep(0.005)
    assert edge.control.bodies[0]["items"][0]["ttl_s"] == pytest.approx(42.0, abs=0.01)


def test_a_key_delivered_by_one_node_and_replayed_by_another_is_rejected(edge: Edge) -> None:
    from tierlink.errors import PeerRefused

    replays: list[str] = []
    edge.receiver.on_replay = replays.append
    first = json.dumps(batch(item("dev-1:9"))).encode()
    assert [a.status.value for a in edge.receiver.receive(first, "dev-1")] == ["ok"]
    assert [a.status.value for a in edge.receiver.receive(first, "dev-1")] == ["duplicate"]
    replay = json.dumps(batch(item("dev-1:9"), sender="dev-2")).encode()
    acks = edge.receiver.receive(replay, "dev-2")
    assert [a.status.value for a in acks] == ["rejected"] and "replayed" in acks[0].detail
    assert replays == ["dev-2"] and len(edge.relayed()) == 1
    with pytest.raises(PeerRefused, match="from 'dev-1'"):
        edge.receiver.receive(first, "dev-2")  # a batch in another node's name
