"""TLS contexts on a real loopback server: the peer's identity reaches the ASGI app,
client_auth "required" turns away a caller without a certificate, a foreign CA fails the
handshake, and reloading a context changes the certificate new connections present."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tierlink.errors import ConfigError
from tierlink.security.asgi_tls import TlsHttpProtocol, peer_of
from tierlink.security.pki import Authority, CertIdentity
from tierlink.security.tls import TlsFiles, client_context, reload, server_context
from tls_support import Pki


async def echo_peer(scope: Any, receive: Any, send: Any) -> None:
    peer = peer_of(scope)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": (peer.uri() if peer else "-").encode()})


@contextlib.asynccontextmanager
async def serve(files: TlsFiles, client_auth: str) -> AsyncIterator[str]:
    ctx = server_context(files, client_auth)
    server = uvicorn.Server(uvicorn.Config(echo_peer, host="127.0.0.1", port=0, lifespan="off",
                                           http=TlsHttpProtocol, log_level="warning",
                                           ssl_context_factory=lambda _c, _d: ctx))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"https://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        await task


async def get(url: str, files: TlsFiles | Any) -> str:
    verify = client_context(files) if isinstance(files, TlsFiles) else files
    async with httpx.AsyncClient(verify=verify, trust_env=False) as client:
        return (await client.get(url)).text


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


def test_the_app_sees_who_is_calling(pki: Pki) -> None:
    server = pki.pair(CertIdentity("node", "edge-1", "edge"), "server")

    async def main() -> None:
        async with serve(server, "optional") as url:
            node = pki.pair(CertIdentity("node", "dev-1", "device"), "dev")
            assert await get(url, node) == "urn:tierlink:node:device:dev-1"
            assert await get(url, pki.trust_only) == "-"  # an application without one
    asyncio.run(main())


def test_required_client_auth_and_foreign_cas_fail_the_handshake(pki: Pki) -> None:
    server = pki.pair(CertIdentity("node", "edge-1", "edge"), "server")
    foreign = pki.pair(CertIdentity("node", "dev-1", "device"), "foreign",
                       ca=Authority.create("other", time.time()))

    async def main() -> None:
        async with serve(server, "required") as url:
            with pytest.raises(httpx.HTTPError):
                await get(url, pki.trust_only)
            with pytest.raises(httpx.HTTPError):
                await get(url, TlsFiles(pki.trust_only.ca, foreign.cert, foreign.key))
            ok = pki.pair(CertIdentity("client", "app"), "app")
            assert await get(url, ok) == "urn:tierlink:client:app"
    asyncio.run(main())


def test_a_reloaded_context_presents_the_new_certificate(pki: Pki) -> None:
    server = pki.pair(CertIdentity("node", "edge-1", "edge"), "server")

    async def main() -> None:
        async with serve(server, "optional") as url:
            files = pki.pair(CertIdentity("node", "dev-1", "device"), "dev")
            ctx = client_context(files)
            assert await get(url, ctx) == "urn:tierlink:node:device:dev-1"
            pki.pair(CertIdentity("node", "dev-1b", "device"), "dev")  # same files, new pair
            reload([ctx], files)
            assert await get(url, ctx) == "urn:tierlink:node:device:dev-1b"
    asyncio.run(main())


def test_contexts_refuse_what_they_cannot_use(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="client_auth"):
        server_context(pki.pair(CertIdentity("client", "a"), "a"), "sometimes")
    with pytest.raises(ConfigError, match="needs a certificate"):
        server_context(pki.trust_only)
    with pytest.raises(ConfigError, match="fleet CA"):
        client_context(TlsFiles(tmp_path / "missing.pem"))


def test_a_caller_reaches_the_node_it_names_or_nobody(pki: Pki) -> None:
    """An address proves nothing (a node's CSR names what addresses it likes; on one
    machine they all share 127.0.0.1): a caller that names the node it means to reach gets
    that node or a refused handshake, before anything is sent."""
    from tierlink.errors import UpstreamError, UpstreamUnavailable
    from tierlink.transport.client import OipClient

    server = pki.pair(CertIdentity("node", "edge-1", "edge"), "server")

    async def main() -> None:
        async with serve(server, "optional") as url, \
                OipClient(tls=client_context(pki.trust_only)) as client:
            assert await client.ready(url, peer="edge-1")
            await client.probe(url, 10, peer="edge-1")
            assert not await client.ready(url, peer="edge-2")
            with pytest.raises(UpstreamUnavailable, match="it is not node edge-2"):
                await client.probe(url, 10, peer="edge-2")
            assert await client.ready(url)  # no node named: the address is checked
            with pytest.raises(UpstreamError, match="cannot be named"):  # not a 500
                await client.probe(url, 10, peer="a..b")
    asyncio.run(main())


def test_only_the_control_plane_passes_for_the_control_plane(pki: Pki) -> None:
    from tierlink.control.client import ControlClient
    from tierlink.errors import ControlPlaneError

    control = pki.pair(CertIdentity("control", "c1"), "control")
    node = pki.pair(CertIdentity("node", "edge-1", "edge"), "edge")

    async def export(files: TlsFiles) -> bytes:
        async with serve(files, "optional") as url, \
                ControlClient(url, timeout_s=5.0, tls=client_context(pki.trust_only)) as client:
            return await client.export_hard_examples()

    assert asyncio.run(export(control)) == b"-"
    with pytest.raises(ControlPlaneError, match="control.tierlink.internal"):
        asyncio.run(export(node))  # a node's certificate, at the control plane's address
