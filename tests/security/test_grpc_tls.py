"""TLS for the gRPC API on a real loopback server: with client certificates required the
caller's identity reaches the handler and a caller without one fails the handshake; with
them optional every caller is anonymous; a renewed pair is presented on new connections."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from tierlink.security.grpc_tls import channel_credentials, peer_of_call, server_credentials
from tierlink.security.pki import CertIdentity, describe
from tierlink.security.tls import TlsFiles
from tls_support import Pki

SERVICE, METHOD = "tierlink.test.Echo", "Peer"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


async def _echo(_request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    peer = peer_of_call(context)
    return (peer.uri() if peer else "-").encode()


@asynccontextmanager
async def serving(files: TlsFiles, client_auth: str,
                  generation: Callable[[], int] = lambda: 0) -> AsyncIterator[str]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        METHOD: grpc.unary_unary_rpc_method_handler(_echo)}),))
    port = server.add_secure_port("127.0.0.1:0",
                                  server_credentials(files, client_auth, generation))
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def call(target: str, files: TlsFiles) -> str:
    async with grpc.aio.secure_channel(target, channel_credentials(files)) as channel:
        answer = await channel.unary_unary(f"/{SERVICE}/{METHOD}")(b"", timeout=5.0)
    return bytes(answer).decode()


def test_required_client_certificates_bind_the_caller_and_turn_away_others(pki: Pki) -> None:
    server = pki.pair(CertIdentity("node", "edge-1", "edge"), "edge-1")
    node = pki.pair(CertIdentity("node", "dev-1", "device"), "dev-1")

    async def run() -> None:
        async with serving(server, "required") as target:
            assert await call(target, node) == "urn:tierlink:node:device:dev-1"
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(target, pki.trust_only)
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE

    asyncio.run(run())


def test_optional_client_certificates_leave_every_caller_anonymous(pki: Pki) -> None:
    server = pki.pair(CertIdentity("node", "edge-1", "edge"), "edge-1")
    node = pki.pair(CertIdentity("node", "dev-1", "device"), "dev-1")

    async def run() -> None:
        async with serving(server, "optional") as target:
            assert await call(target, pki.trust_only) == "-"
            assert await call(target, node) == "-"  # gRPC asks for no certificate here

    asyncio.run(run())


def test_a_foreign_ca_fails_the_handshake(pki: Pki, tmp_path: Path) -> None:
    server = pki.pair(CertIdentity("node", "edge-1", "edge"), "edge-1")
    rogue = Pki(tmp_path / "rogue")

    async def run() -> None:
        async with serving(server, "optional") as target:
            with pytest.raises(grpc.aio.AioRpcError):
                await call(target, rogue.trust_only)

    asyncio.run(run())


def presented_serial(target: str, ca: Path) -> str:
    """The serial of the certificate the server presents to a new connection."""
    host, port = target.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5.0) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return str(describe(ssl.DER_cert_to_PEM_cert(der).encode())["serial"])


def test_a_renewed_pair_is_presented_on_new_connections(pki: Pki) -> None:
    files = pki.pair(CertIdentity("node", "edge-1", "edge"), "edge-1")
    renewals = [0]
    first = describe(Path(str(files.cert)).read_bytes())["serial"]

    async def run() -> None:
        async with serving(files, "optional", lambda: renewals[0]) as target:
            assert await asyncio.to_thread(presented_serial, target, files.ca) == first
            pki.pair(CertIdentity("node", "edge-1", "edge"), "edge-1")  # the keeper renews
            second = describe(Path(str(files.cert)).read_bytes())["serial"]
            assert await asyncio.to_thread(presented_serial, target, files.ca) == first
            renewals[0] += 1  # ... and says so
            assert await asyncio.to_thread(presented_serial, target, files.ca) == second
            assert await call(target, pki.trust_only) == "-"  # and it still serves

    asyncio.run(run())
