"""A node's chat relays follow its upstreams as the registry changes them: an edge that
joins is asked for its language models, one that leaves is forgotten."""

from __future__ import annotations

import asyncio
from typing import Any, Self

from tierlink.chat.peers import PeerModels
from tierlink.core.types import LanguageModelView
from tierlink.node.topology import UpstreamURLs


class _Response:
    def __init__(self, listing: dict[str, Any]) -> None:
        self.status, self._listing = 200, listing

    async def json(self) -> dict[str, Any]:
        return self._listing

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None


class _Session:
    """Answers ``GET <url>/v1/models`` with one language model named after the host."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def get(self, url: str, timeout: Any = None, server_hostname: str | None = None
            ) -> _Response:
        assert server_hostname is None  # no TLS here: the URL's host is what is checked
        self.asked.append(url)
        host = url.split("//")[1].split("/")[0]
        view = LanguageModelView(f"lm-{host}", ("chat",), quality=0.7)
        return _Response({"tierlink": {"tier": "edge"},
                          "data": [{"id": view.name,
                                    "tierlink": {"kind": "model", "view": view.to_dict()}}]})


class _Up:
    def __init__(self, url: str) -> None:
        self.url = url


def test_peers_follow_the_live_upstreams() -> None:
    live: dict[str, _Up] = {"edge-1": _Up("http://edge-1")}
    session, clock = _Session(), [0.0]
    peers = PeerModels(lambda: UpstreamURLs(live), lambda: session,  # type: ignore[arg-type,return-value]
                       refresh_s=1.0, clock=lambda: clock[0])

    async def scenario() -> None:
        assert [v.node_id for v in await peers.current()] == ["edge-1"]
        live["edge-2"] = _Up("http://edge-2")  # a new edge enrolls
        del live["edge-1"]  # the old one is drained
        clock[0] += 2.0
        await peers.current()
        await peers._task  # type: ignore[misc]  # the background refresh
        views = peers.views()
        assert [v.node_id for v in views] == ["edge-2"]
        assert views[0].language_models[0].name == "lm-edge-2"
    asyncio.run(scenario())
    assert session.asked == ["http://edge-1/v1/models", "http://edge-2/v1/models"]
