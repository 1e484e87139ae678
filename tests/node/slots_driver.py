"""Fakes for the slot tests, and the crash driver run as a subprocess by test_slots_crash.py.

A fake artifact is a few KB of bytes derived from its version; its "manifest" stores their
sha256, and :func:`digest_verify` checks them (no signature: the real verify lives in
``tierlink.repo``). As a script::

    python slots_driver.py ROOT KILL_AT

installs version 2 of ``m`` over whatever is active (the node's sequence: stage, fetch, seal,
load, switch) and SIGKILLs itself at ``KILL_AT``: a :data:`tierlink.node.slots.PHASES` name,
``download`` (half of model.onnx written), ``loading`` (between seal and switch, where the
node loads the session) or ``none`` (runs to the end and exits 0).
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tierlink.errors import ArtifactRejected
from tierlink.node.slots import SlotFiles, SlotManager

NAME = "m"


def artifact(version: str) -> tuple[bytes, bytes]:
    """(model.onnx bytes, card.json bytes) of a fake version: ~4 KB, distinct per version."""
    onnx = hashlib.sha256(f"onnx-{version}".encode()).digest() * 128
    card = f'{{"name": "{NAME}", "version": "{version}"}}'.encode()
    return onnx, card


def manifest(version: str) -> dict[str, Any]:
    onnx, card = artifact(version)
    return {"name": NAME, "version": version, "onnx_sha256": hashlib.sha256(onnx).hexdigest(),
            "card_sha256": hashlib.sha256(card).hexdigest()}


def digest_verify(files: SlotFiles) -> None:
    """The fake ``verify``: both sha256 and the version must match the manifest."""
    if files.manifest.get("version") != files.version:
        raise ArtifactRejected(f"manifest version {files.manifest.get('version')} is not the "
                               f"slot's {files.version}")
    for path, key in ((files.onnx, "onnx_sha256"), (files.card, "card_sha256")):
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if got != files.manifest.get(key):
            raise ArtifactRejected(f"{path.name}: sha256 {got[:12]} does not match the manifest")


def fetcher(version: str, *, after_half: Callable[[], None] | None = None
            ) -> Callable[[Path], None]:
    """A ``fetch(dir)`` writing the fake files; ``after_half`` runs mid-way through model.onnx."""
    onnx, card = artifact(version)

    def fetch(directory: Path) -> None:
        with open(directory / "model.onnx", "wb") as f:
            f.write(onnx[: len(onnx) // 2])
            f.flush()
            if after_half is not None:
                after_half()
            f.write(onnx[len(onnx) // 2:])
        (directory / "card.json").write_bytes(card)
    return fetch


def install_and_switch(slots: SlotManager, version: str,
                       fetch: Callable[[Path], None] | None = None,
                       load: Callable[[SlotFiles], None] | None = None) -> SlotFiles | None:
    """The node's sequence: stage, fetch, seal (verify), load + warm up, switch."""
    with slots.stage(NAME, version) as staging:
        (fetch or fetcher(version))(staging.dir)
        files = staging.seal(manifest(version))
        if load is not None:
            load(files)
        return slots.switch(NAME, files.slot)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(root: str, kill_at: str) -> None:
    def hook(phase: str) -> None:
        if phase == kill_at:
            _die()

    def load(files: SlotFiles) -> None:
        if kill_at == "loading":
            _die()

    slots = SlotManager(Path(root), digest_verify, hook=hook)
    fetch = fetcher("2", after_half=_die if kill_at == "download" else None)
    install_and_switch(slots, "2", fetch, load)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
