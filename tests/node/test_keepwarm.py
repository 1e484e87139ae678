import asyncio
from dataclasses import dataclass

import pytest

from tierlink.node.keepwarm import KeepWarm


@dataclass
class Up:
    url: str
    last_used: float = float("-inf")

    @property
    def node_id(self) -> str:  # the node the client is told to expect there
        return "node@" + self.url


class Client:
    """Records the checks, and how many to one URL were in flight together at most (a real
    client needs that many connections to it)."""

    def __init__(self, down: set[str] | None = None) -> None:
        self.calls: list[str] = []
        self.down = down or set()
        self.in_flight: dict[str, int] = {}
        self.most_at_once: dict[str, int] = {}

    async def ready(self, base_url: str, timeout_s: float | None = None, *,
                    peer: str | None = None) -> bool:
        assert peer == "node@" + base_url  # each check says whom it expects to reach
        self.calls.append(base_url)
        self.in_flight[base_url] = self.in_flight.get(base_url, 0) + 1
        self.most_at_once[base_url] = max(self.most_at_once.get(base_url, 0),
                                          self.in_flight[base_url])
        await asyncio.sleep(0)
        self.in_flight[base_url] -= 1
        return base_url not in self.down


def test_every_upstream_gets_a_connection_at_start_and_a_late_one_is_retried():
    ups = [Up("http://a"), Up("http://b")]
    client = Client(down={"http://b"})
    now = [10.0]
    warm = KeepWarm(client, lambda: ups, lambda: now[0])
    asyncio.run(warm.open_all(attempts=3, pause_s=0.0))
    assert client.calls.count("http://a") == 2  # two at once, done once they answered
    assert client.most_at_once["http://a"] == 2  # so two connections: overlaps are free
    assert client.calls.count("http://b") == 6  # retried while it starts, then left alone
    assert ups[0].last_used == 10.0 and ups[1].last_used == float("-inf")


def test_how_many_connections_is_a_setting():
    ups = [Up("http://a")]
    client = Client()
    asyncio.run(KeepWarm(client, lambda: ups, lambda: 1.0, connections=1).open_all())
    assert client.calls == ["http://a"]
    with pytest.raises(ValueError, match="at least one"):
        KeepWarm(client, lambda: ups, lambda: 1.0, connections=0)


def test_only_idle_connections_are_pinged():
    ups = [Up("http://busy", last_used=99.0), Up("http://idle", last_used=90.0)]
    client = Client()
    warm = KeepWarm(client, lambda: ups, lambda: 100.0, idle_s=5.0)
    asyncio.run(warm.ping_idle())
    assert client.calls == ["http://idle"] * 2 and ups[1].last_used == 100.0
    assert client.most_at_once["http://idle"] == 2  # both of its connections kept


def test_an_upstream_the_registry_adds_later_is_opened_at_once():
    ups = [Up("http://a", last_used=99.0)]
    client = Client()
    warm = KeepWarm(client, lambda: ups, lambda: 100.0, idle_s=5.0)
    asyncio.run(warm.open_new())
    assert client.calls == []  # nothing new: the open one is left to the idle pings
    ups.append(Up("http://new-edge"))
    asyncio.run(warm.open_new())
    assert client.calls == ["http://new-edge"] * 2 and ups[1].last_used == 100.0
