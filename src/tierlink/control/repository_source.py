"""The signed model repository as a model source of the catalog
(:mod:`tierlink.models.catalog`): ``name@version`` is a version published to a control
plane (``tierlink model publish``, ``tierlink model import --control``).

Resolving ``spam-small@2`` downloads the version's files, checks them against its signed
manifest and the manifest's signature against the trusted publisher keys, and installs them
into the framework's layout under ``$TIERLINK_HOME/repo`` (``spam-small/2/``: the model
file under the name its card gives, ``card.json``, and ``manifest.json``, the signed
manifest). A version installed before is used from there, its files checked against that
manifest again (a changed byte is refused). A plain ``spam-small`` means the version of it
installed last. The repository's own content-addressed blob store stays on the control
plane; only what is installed from it uses the layout.

Where the repository is and whom to trust: :class:`~tierlink.models.catalog.SourceOptions`
(``repository``, ``trusted_keys``, ``token``), else the environment: ``TIERLINK_REPOSITORY``
(the control plane's URL), ``TIERLINK_TRUSTED_KEYS`` (publisher public keys, comma
separated, as ``tierlink model keygen`` prints them) and ``TIERLINK_ADMIN_TOKEN`` (reads
take any enrolled node's or the operator's token).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from tierlink.durable import read_json
from tierlink.errors import ArtifactRejected, ModelNotFound
from tierlink.models.card import load_card
from tierlink.models.catalog import Resolved, SourceOptions
from tierlink.models.data import Splits
from tierlink.models.layout import CARD_FILE, Layout, check_part
from tierlink.repo.client import ONNX_FILE as DOWNLOADED_FILE
from tierlink.repo.manifest import SignedManifest

MANIFEST_FILE = "manifest.json"

SEPARATOR = "@"


def split_ref(ref: str) -> tuple[str, str | None]:
    """``name@version`` -> ``(name, version)``; a plain name -> ``(name, None)``."""
    name, sep, version = ref.partition(SEPARATOR)
    return name, (version if sep else None)


class RepositorySource:
    """Published versions, installed on first use into ``$TIERLINK_HOME/repo``."""

    name = "repo"
    rank = 30

    def __init__(self, options: SourceOptions, root: Path | None = None,
                 transport: Any = None) -> None:
        """``root``: where versions are installed (``$TIERLINK_HOME/repo``); ``transport``:
        an ``httpx`` transport to reach the repository through (tests: the app in
        process)."""
        from tierlink.models.home import tierlink_home

        self.options = options
        self.layout = Layout(root if root is not None else tierlink_home() / "repo")
        self.url = options.repository or os.environ.get("TIERLINK_REPOSITORY") or None
        keys = options.trusted_keys or tuple(
            k.strip() for k in os.environ.get("TIERLINK_TRUSTED_KEYS", "").split(",")
            if k.strip())
        self.trusted_keys = tuple(keys)
        self.token = options.token or os.environ.get("TIERLINK_ADMIN_TOKEN") or None
        self.transport = transport

    def offers(self, name: str) -> bool:
        model, version = split_ref(name)
        if version is None:
            return self.layout.current(model) is not None
        return self.url is not None or version in self.layout.versions(model)

    def names(self) -> list[str]:
        """Every installed version as ``name@version``."""
        return [f"{n}{SEPARATOR}{v}" for n in self.layout.names()
                for v in self.layout.versions(n)]

    def data(self, task: str) -> Splits | None:
        return None  # a repository holds models, not labelled data

    def resolve(self, names: Sequence[str]) -> dict[str, Resolved]:
        return {ref: self._resolve(ref) for ref in names}

    def _resolve(self, ref: str) -> Resolved:
        model, version = split_ref(ref)
        check_part("name", model)
        if version is None:
            version = self.layout.current(model)
            if version is None:
                raise ModelNotFound(f"no version of {model!r} is installed from the repository",
                                    hint=f"name one: {model}@VERSION")
        check_part("version", version)
        if version not in self.layout.versions(model):
            self._install(model, version)
        return self._checked(ref, self.layout.dir(model, version))

    def _checked(self, ref: str, directory: Path) -> Resolved:
        """The installed files, checked against the manifest they were installed with."""
        from tierlink.repo.verify import check_card, check_file

        signed = SignedManifest.from_dict(read_json(directory / MANIFEST_FILE,
                                                    "signed manifest"))
        card = load_card(directory / CARD_FILE)
        m = signed.manifest
        check_file("model file", directory / card.file, m.onnx_sha256, m.onnx_size)
        check_file("model card", directory / CARD_FILE, m.card_sha256, m.card_size)
        check_card(signed, directory / CARD_FILE)
        return Resolved(ref, directory / card.file, directory / CARD_FILE, source=self.name)

    def _install(self, model: str, version: str) -> None:
        """Download, verify (files and signature), install; nothing is installed when any
        check fails."""
        from tierlink.repo.verify import verify_artifact

        url, keys = self._where()
        self.options.say(f"installing {model}@{version} from the repository at {url}")
        with self.layout.installing(model, version) as staging:
            signed = _run(self._download(url, model, version, staging))
            files = staging / DOWNLOADED_FILE, staging / CARD_FILE
            verify_artifact(signed, *files, keys)
            card = load_card(files[1])
            if card.file != DOWNLOADED_FILE:  # the card names the model's file
                files[0].rename(staging / card.file)
            (staging / MANIFEST_FILE).write_text(json.dumps(signed.to_dict(), indent=2))

    async def _download(self, url: str, model: str, version: str,
                        dest: Path) -> SignedManifest:
        """The version's signed manifest, its files downloaded into ``dest`` (each checked
        against the manifest as it arrives), as a node fetches a version to install."""
        from tierlink.control.client import ControlClient

        tls = self.options.verify if not isinstance(self.options.verify, bool) else None
        async with ControlClient(url, transport=self.transport, tls=tls,
                                 authorization=f"Bearer {self.token}" if self.token
                                 else None) as client:
            signed = await client.version_manifest(model, version)
            await client.download_version(signed, dest)
        return signed

    def _where(self) -> tuple[str, tuple[str, ...]]:
        if self.url is None:
            raise ModelNotFound("no model repository is configured",
                                hint="set TIERLINK_REPOSITORY to the control plane's URL")
        if not self.trusted_keys:
            raise ArtifactRejected("no publisher key is trusted, so no version from the "
                                   "repository can be verified",
                                   hint="set TIERLINK_TRUSTED_KEYS to the publishers' public "
                                        "keys (tierlink model keygen prints one)")
        return self.url, self.trusted_keys


def _run(coro: Coroutine[Any, Any, SignedManifest]) -> SignedManifest:
    """Run a download to completion from sync code, also when called on an event loop's
    thread (then on a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


__all__ = ["MANIFEST_FILE", "RepositorySource", "split_ref"]
