"""Downloads that resume: a node cut off or killed mid-download keeps its partial file and
asks only for the rest (an HTTP range request) the next time; the digest of the whole is
checked, so a partial file tampered with is refused and nothing partial is installed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from repo_support import Artifact, FakeClock, make_artifact, repo_app
from tierlink.errors import ArtifactRejected, ControlPlaneError
from tierlink.repo.client import RepositoryClient, fetch_artifact
from tierlink.repo.verify import verify_artifact

URL = "http://control"
CHUNK = 64 * 1024  # what the server sends at once (Starlette's FileResponse)
GRAPH_BYTES = 16 * CHUNK


@pytest.fixture
def big(tmp_path: Path, key: Ed25519PrivateKey) -> Artifact:
    return make_artifact(tmp_path / "big", key, graph=os.urandom(GRAPH_BYTES))


@pytest.fixture
def app(tmp_path: Path, public: str, clock: FakeClock, big: Artifact) -> Iterator[Any]:
    app = repo_app(tmp_path / "control", (public,), clock)
    with TestClient(app) as http, RepositoryClient(URL, http=http) as repo:
        repo.upload_blob(big.onnx)
        repo.upload_blob(big.card)
        repo.publish(big.signed)
    yield app
    app.state.repository.versions.close()


class Watched(httpx.AsyncBaseTransport):
    """The app's transport, recording each request's range and the body bytes it sent;
    with ``cut_after`` the first answer breaks off once that many bytes went through."""

    def __init__(self, app: Any, cut_after: int | None = None) -> None:
        self.inner = httpx.ASGITransport(app)
        self.cut_after = cut_after
        self.ranges: list[str | None] = []
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.ranges.append(request.headers.get("range"))
        response = await self.inner.handle_async_request(request)
        cut, self.cut_after = self.cut_after, None
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_Counted(self, response.stream, cut))


class _Counted(httpx.AsyncByteStream):
    """The body in 64 KiB chunks, as a socket would deliver it (the ASGI transport hands
    it over whole), broken off after ``cut`` bytes."""

    def __init__(self, owner: Watched, inner: Any, cut: int | None) -> None:
        self.owner, self.inner, self.cut = owner, inner, cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        passed = 0
        async for body in self.inner:
            for at in range(0, len(body), CHUNK):
                if self.cut is not None and passed >= self.cut:
                    raise httpx.ReadError("connection reset (test)")
                chunk = body[at:at + CHUNK]
                passed += len(chunk)
                self.owner.sent += len(chunk)
                yield chunk


def fetch(transport: httpx.AsyncBaseTransport, artifact: Artifact, dest: Path,
          partials: Path) -> tuple[Path, Path]:
    async def run() -> tuple[Path, Path]:
        async with httpx.AsyncClient(transport=transport) as http:
            return await fetch_artifact(URL, artifact.signed, dest, http, partial_dir=partials)
    dest.mkdir(parents=True, exist_ok=True)
    return asyncio.run(run())


def test_a_cut_download_resumes_with_only_the_rest(app: Any, big: Artifact, public: str,
                                                  tmp_path: Path) -> None:
    partials, sha = tmp_path / "downloads", big.manifest.onnx_sha256
    cut = Watched(app, cut_after=GRAPH_BYTES // 2)
    with pytest.raises(ControlPlaneError, match="cannot reach"):
        fetch(cut, big, tmp_path / "slot", partials)
    held = (partials / f"{sha}.part").stat().st_size
    assert held >= GRAPH_BYTES // 2 and not (tmp_path / "slot" / "model.onnx").exists()

    again = Watched(app)
    onnx, card = fetch(again, big, tmp_path / "slot", partials)
    assert again.ranges[0] == f"bytes={held}-"  # the graph: only the rest was asked for
    graph_sent = again.sent - big.manifest.card_size
    assert graph_sent == GRAPH_BYTES - held
    assert verify_artifact(big.signed, onnx, card, [public]) == big.signed.key_id
    assert list(partials.iterdir()) == []  # nothing left behind


def test_a_tampered_partial_file_is_refused_and_nothing_is_installed(
        app: Any, big: Artifact, public: str, tmp_path: Path) -> None:
    partials, sha = tmp_path / "downloads", big.manifest.onnx_sha256
    with pytest.raises(ControlPlaneError):
        fetch(Watched(app, cut_after=GRAPH_BYTES // 2), big, tmp_path / "slot", partials)
    part = partials / f"{sha}.part"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(ArtifactRejected, match="does not match the manifest"):
        fetch(Watched(app), big, tmp_path / "slot", partials)
    assert not part.exists() and list((tmp_path / "slot").iterdir()) == []
    onnx, card = fetch(Watched(app), big, tmp_path / "slot", partials)  # fresh: whole
    assert verify_artifact(big.signed, onnx, card, [public]) == big.signed.key_id


def test_a_server_without_ranges_is_downloaded_whole_again(app: Any, big: Artifact,
                                                           tmp_path: Path) -> None:
    partials, sha = tmp_path / "downloads", big.manifest.onnx_sha256
    with pytest.raises(ControlPlaneError):
        fetch(Watched(app, cut_after=GRAPH_BYTES // 2), big, tmp_path / "slot", partials)

    class NoRanges(Watched):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            request.headers.pop("range", None)
            return await super().handle_async_request(request)

    onnx, _ = fetch(NoRanges(app), big, tmp_path / "slot", partials)
    assert onnx.read_bytes() == big.onnx.read_bytes()
    assert not (partials / f"{sha}.part").exists()


# -- a process killed -9 at half ----------------------------------------------------------

DOWNLOADER = textwrap.dedent("""
    import asyncio, json, sys, time
    from pathlib import Path
    import httpx
    from tierlink.repo.client import fetch_artifact
    from tierlink.repo.manifest import SignedManifest

    class Slow(httpx.AsyncHTTPTransport):  # a slow link: the kill lands mid-download
        async def handle_async_request(self, request):
            response = await super().handle_async_request(request)
            inner = response.stream
            class Stream(httpx.AsyncByteStream):
                async def __aiter__(self):
                    async for chunk in inner:
                        await asyncio.sleep(0.05)
                        yield chunk
                async def aclose(self):
                    await inner.aclose()
            return httpx.Response(response.status_code, headers=response.headers,
                                  stream=Stream())

    url, signed, dest, partials = sys.argv[1:5]
    signed = SignedManifest.from_dict(json.loads(Path(signed).read_text()))
    async def main():
        async with httpx.AsyncClient(transport=Slow(), trust_env=False) as http:
            await fetch_artifact(url, signed, Path(dest), http, partial_dir=Path(partials))
    asyncio.run(main())
""")


@pytest.fixture
def served(app: Any) -> Iterator[str]:
    """The repository on a real socket (uvicorn in a thread)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10.0)


def test_a_download_killed_at_half_resumes_with_the_remainder_plus_at_most_a_chunk(
        app: Any, served: str, big: Artifact, public: str, tmp_path: Path) -> None:
    import json

    signed = tmp_path / "signed.json"
    signed.write_text(json.dumps(big.signed.to_dict()))
    partials, dest = tmp_path / "downloads", tmp_path / "slot"
    dest.mkdir()
    part = partials / f"{big.manifest.onnx_sha256}.part"
    proc = subprocess.Popen([sys.executable, "-c", DOWNLOADER, served, str(signed), str(dest),
                             str(partials)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30.0
        while (not part.exists() or part.stat().st_size < GRAPH_BYTES // 2) \
                and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10.0)
        if proc.stderr:
            proc.stderr.close()
    held = part.stat().st_size
    assert GRAPH_BYTES // 2 <= held < GRAPH_BYTES and not (dest / "model.onnx").exists()

    counted = _CountingTransport()
    async def resume() -> tuple[Path, Path]:
        async with httpx.AsyncClient(transport=counted, trust_env=False) as http:
            return await fetch_artifact(served, big.signed, dest, http, partial_dir=partials)
    onnx, card = asyncio.run(resume())
    graph_fetched = counted.received - big.manifest.card_size
    assert graph_fetched <= GRAPH_BYTES - held + CHUNK  # the remainder, plus one chunk
    assert verify_artifact(big.signed, onnx, card, [public]) == big.signed.key_id


class _CountingTransport(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.received = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        inner, owner = response.stream, self

        class Stream(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in inner:  # type: ignore[union-attr]
                    owner.received += len(chunk)
                    yield chunk

            async def aclose(self) -> None:
                await inner.aclose()  # type: ignore[union-attr]

        return httpx.Response(response.status_code, headers=response.headers, stream=Stream())
