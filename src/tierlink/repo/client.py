"""Talking to the model repository over HTTP.

* :class:`RepositoryClient` (sync, for the CLI): upload blobs, publish, list, show.
* :func:`fetch_artifact` (async, for a node's slot installer): download a version's two
  files into a directory, checking size and sha256 while writing.

Failures are mapped here, once: a transport failure (refused, timeout) is a
:class:`~tierlink.errors.ControlPlaneError` naming the URL; an error answer is rebuilt from
its ``{"error", "code", "hint"}`` body (:func:`tierlink.errors.error_from_dict`), so a 422
arrives as :class:`~tierlink.errors.ArtifactRejected`, a 409 as
:class:`~tierlink.errors.VersionConflict`, a 404 as
:class:`~tierlink.errors.RepositoryError`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import httpx

from tierlink.errors import (
    ArtifactRejected,
    ControlPlaneError,
    TierlinkError,
    error_from_dict,
)
from tierlink.repo.manifest import PublishedVersion, SignedManifest
from tierlink.repo.verify import hash_file

ONNX_FILE = "model.onnx"
CARD_FILE = "card.json"


class RepositoryClient:
    """Sync client of the repository routes at ``base_url`` (proxy variables ignored).

    ``headers`` go with every call (an operator's ``Authorization``: publishing needs the
    control plane's admin token). ``http``: an ``httpx.Client`` to use instead (tests pass a
    ``TestClient``); the caller then owns it."""

    def __init__(self, base_url: str, timeout_s: float = 60.0, *,
                 headers: Mapping[str, str] | None = None,
                 http: httpx.Client | None = None,
                 verify: ssl.SSLContext | bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self._owned = http is None
        self._http = http if http is not None else httpx.Client(
            base_url=self.base_url, timeout=timeout_s, trust_env=False, verify=verify)

    def upload_blob(self, path: Path | str) -> dict[str, Any]:
        """Upload a file as a blob (streamed); ``{"sha256", "size", "created"}``."""
        sha, _size = hash_file(path)
        with open(path, "rb") as f:
            response = self._call("PUT", f"/v1/blobs/{sha}", f"the upload of {path}",
                                  content=f)
        return _object(response)

    def publish(self, signed: SignedManifest) -> dict[str, Any]:
        """Publish a signed manifest (its blobs uploaded first); the version entry plus
        ``"created"`` (False: the identical version was already published)."""
        m = signed.manifest
        response = self._call("POST", f"/v1/models/{m.name}/versions",
                              f"publishing {m.name} version {m.version}",
                              json=signed.to_dict())
        return _object(response)

    def list_versions(self, name: str | None = None) -> list[PublishedVersion]:
        """Published versions (of ``name``), by name then publication time."""
        if name is not None:
            body = _object(self._call("GET", f"/v1/models/{name}/versions",
                                      f"the versions of {name}"))
            return [PublishedVersion.from_dict(e) for e in body.get("versions", [])]
        body = _object(self._call("GET", "/v1/models", "the model list"))
        return [PublishedVersion.from_dict(e) for model in body.get("models", [])
                for e in model.get("versions", [])]

    def get(self, name: str, version: str) -> PublishedVersion:
        """One published version; :class:`~tierlink.errors.RepositoryError` when unknown."""
        response = self._call("GET", f"/v1/models/{name}/versions/{version}",
                              f"{name} version {version}")
        return PublishedVersion.from_dict(_object(response))

    def close(self) -> None:
        if self._owned:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        url = self.base_url + path
        try:
            response = self._http.request(method, path, headers=self.headers, **kwargs)
        except httpx.HTTPError as exc:
            raise _unreachable(url, what, exc, self.timeout_s) from exc
        if response.status_code >= 400:
            raise error_of(response, url, what)
        return response


async def fetch_artifact(base_url: str, signed: SignedManifest, dest_dir: Path | str,
                         client: httpx.AsyncClient, partial_dir: Path | None = None
                         ) -> tuple[Path, Path]:
    """Download the version's ONNX graph and card into ``dest_dir`` as ``model.onnx`` and
    ``card.json``; returns their paths. Each is streamed to a partial file, its size and
    sha256 checked against the manifest as it arrives (a mismatch removes it and raises
    :class:`ArtifactRejected`), fsynced, then renamed. The signature is *not* checked here:
    the caller runs :func:`tierlink.repo.verify.verify_artifact` on the result. ``client``
    carries the caller's credentials (a node's ``Authorization`` header).

    With ``partial_dir`` a download **resumes**: the partial file is ``<sha256>.part``
    there (named by the blob, so it only ever continues the same bytes) and outlives a
    failed call, a cut link or a killed process; the next call asks for the rest with an
    HTTP range request (a server that answers the whole file starts it over) and checks the
    digest of the whole, so a partial file tampered with is refused, removed, and fetched
    anew by the call after. Without it a failed download leaves nothing behind."""
    dest = Path(dest_dir)
    m = signed.manifest
    onnx = await _fetch_blob(base_url, m.onnx_sha256, m.onnx_size, dest / ONNX_FILE,
                             "ONNX graph", client, partial_dir)
    card = await _fetch_blob(base_url, m.card_sha256, m.card_size, dest / CARD_FILE,
                             "model card", client, partial_dir)
    return onnx, card


async def _fetch_blob(base_url: str, sha: str, size: int, path: Path, what: str,
                      client: httpx.AsyncClient, partial_dir: Path | None) -> Path:
    url = f"{base_url.rstrip('/')}/v1/blobs/{sha}"
    if partial_dir is None:
        return await _fetch_into(url, sha, size, path, what, client,
                                 path.with_name(path.name + ".part"), resume=False)
    await asyncio.to_thread(partial_dir.mkdir, parents=True, exist_ok=True)
    part = partial_dir / f"{sha}.part"
    async with _PARTIALS.setdefault(part, asyncio.Lock()):  # one writer per partial file
        return await _fetch_into(url, sha, size, path, what, client, part, resume=True)


_PARTIALS: dict[Path, asyncio.Lock] = {}


async def _fetch_into(url: str, sha: str, size: int, path: Path, what: str,
                      client: httpx.AsyncClient, part: Path, resume: bool) -> Path:
    try:
        held = await asyncio.to_thread(_held, part, size) if resume else None
        f = await asyncio.to_thread(open, part, "ab" if held else "wb")
        try:
            got_sha, got_size = await _download(url, f, size, what, client, held)
            f.flush()
            await asyncio.to_thread(os.fsync, f.fileno())
        finally:
            f.close()
        if (got_sha, got_size) != (sha, size):
            raise ArtifactRejected(
                f"downloaded {what} from {url} does not match the manifest: {got_size} "
                f"bytes, sha256 {got_sha[:12]}...; expected {size} bytes, {sha[:12]}...",
                hint="the repository's copy is corrupt or was replaced: republish the version")
        os.replace(part, path)
    except ArtifactRejected:
        part.unlink(missing_ok=True)  # never resumed: the next call starts over
        raise
    except BaseException:
        if not resume:
            part.unlink(missing_ok=True)
        raise
    return path


def _held(part: Path, size: int) -> Any:
    """The digest of what a partial file already holds (None when there is none, or when
    it is longer than the blob: then it is started over)."""
    try:
        held = part.stat().st_size
    except FileNotFoundError:
        return None
    if not 0 < held <= size:
        return None
    digest = hashlib.sha256()
    with part.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest


async def _download(url: str, f: Any, size: int, what: str, client: httpx.AsyncClient,
                    held: Any = None) -> tuple[str, int]:
    """Stream ``url`` into the open file ``f`` (after the bytes ``held`` hashes, when it
    is a resumed partial file); ``(sha256 hex, bytes in the file)``."""
    digest = held if held is not None else hashlib.sha256()
    written = f.tell() if held is not None else 0
    if written == size:
        return digest.hexdigest(), written  # complete already: only checked
    headers = {"range": f"bytes={written}-"} if written else None
    try:
        async with client.stream("GET", url, headers=headers) as response:
            if response.status_code >= 400:
                await response.aread()
                raise error_of(response, url, f"the {what}")
            if written and response.status_code != 206:  # the whole file: start over
                f.seek(0)
                f.truncate()
                digest, written = hashlib.sha256(), 0
            async for chunk in response.aiter_bytes():
                digest.update(chunk)
                f.write(chunk)
                written += len(chunk)
                if written > size:
                    raise ArtifactRejected(f"downloaded {what} from {url} is longer than the "
                                           f"{size} bytes the manifest says",
                                           hint="republish the version")
    except httpx.HTTPError as exc:
        raise _unreachable(url, f"the {what}", exc, None) from exc
    return digest.hexdigest(), written


def error_of(response: httpx.Response, url: str, what: str) -> TierlinkError:
    """The tierlink error an error answer carries (a ControlPlaneError when it has none)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping) and "code" in body and "error" in body:
        return error_from_dict(dict(body), response.status_code)
    return ControlPlaneError(f"{url} refused {what}: HTTP {response.status_code}: "
                             f"{response.text[:200] or response.reason_phrase}",
                             status=response.status_code)


def _unreachable(url: str, what: str, exc: httpx.HTTPError,
                 timeout_s: float | None) -> ControlPlaneError:
    if isinstance(exc, httpx.TimeoutException):
        limit = f" within {timeout_s:g} s" if timeout_s else ""
        return ControlPlaneError(f"the repository at {url} did not answer {what}{limit}")
    return ControlPlaneError(f"cannot reach the repository at {url} for {what}: "
                             f"{type(exc).__name__}: {exc or 'no detail'}")


def _object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError as exc:
        raise ControlPlaneError(f"{response.request.url} answered with invalid JSON: {exc}",
                                hint="is the URL a tierlink control plane?") from exc
    if not isinstance(body, dict):
        raise ControlPlaneError(f"{response.request.url} answered with a JSON "
                                f"{type(body).__name__}, not an object",
                                hint="is the URL a tierlink control plane?")
    return body
