"""A/B model slots on a node's disk: crash-safe install, atomic switch, recovery at start.

Layout, per model name, under the node's state directory ``root``::

    <root>/slots/<name>/
        A/              model.onnx  card.json  manifest.json  complete
        B/              (same)
        active.json     {"slot": "A", "version": "2", "switched_at": 1700000000.0}
        .staging.lock   flock'd while a version is staged: one staging per model at a time

Invariants (each one is what makes a kill -9 harmless):

* A slot counts only when its ``complete`` marker exists. The marker (``{"version",
  "sealed_at"}``) is written last -- tmp file, fsync, rename, fsync of the directory -- after
  ``model.onnx``, ``card.json`` and ``manifest.json`` and the directory were fsynced. Clearing
  a slot removes the marker first. A slot is therefore complete or ignored, never half-valid.
* ``active.json`` names only a complete slot that verified at the moment of the switch, and it
  is replaced atomically (tmp file in the same directory, fsync, ``os.replace``, fsync dir).
* Staging writes only the *inactive* slot: the files of the version being served are never
  touched while it serves.
* Nothing on disk is trusted across a restart: :meth:`SlotManager.recover` re-verifies
  (hash + signature, through the injected ``verify``) before it returns a slot.

The install sequence the node runs, and what a kill -9 at each step leaves after restart
(``recover()`` returns the version in the last column; "old" is the version active before)::

    step                                               who    kill -9 here leaves
    1 stage(name, version): lock, clear inactive slot  slots  old; partial slot cleaned
      (marker removed first)
    2 fetch model.onnx + card.json into staging.dir    node   old; partial download cleaned
    3 staging.seal(manifest): manifest.json, fsync,    slots  old; the new slot may be
      complete marker                                         complete (a standby that is
    4   ... then verify (inside seal)                         re-verified before any switch)
    5 load + warm up an ONNX session on the new files  node   old (same as 3-4)
    6 switch(name, slot): tmp active file, fsync,      slots  old before the rename,
      os.replace, fsync dir                                   new after it
    7 serve the new session, drop the old one          node   new; old kept as standby
                                                              for rollback

Loading and warming up (step 5) is the node's business: a version that fails to load is
never switched to. :meth:`SlotManager.install` runs steps 1-4 with a ``fetch`` callable.
Fault injection: the optional ``hook`` is called with each :data:`PHASES` name as that
point is passed (the crash tests kill the process there); it defaults to a no-op.

Verification is injected (``verify(files)`` raises :class:`~tierlink.errors.ArtifactRejected`);
the real one checks sizes, sha256 and the ed25519 signature of ``files.manifest`` against
``files.onnx`` / ``files.card`` *and* that the manifest's version equals ``files.version``
(the version recorded in the marker at seal time).

One node process owns a state directory. A staging holds the model's ``flock`` until it is
closed; switch and recover take it too (or run under this manager's own staging), so no
other process clears a slot meanwhile. Unix only (``fcntl``). Every call is blocking (fsync,
hashing in ``verify``): call it from a worker thread, not the event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from tierlink.durable import fsync_dir, fsync_file, replace_synced, write_synced
from tierlink.errors import ArtifactRejected, RepositoryError

__all__ = [
    "PHASES",
    "ActiveRecord",
    "Phase",
    "SlotFiles",
    "SlotManager",
    "SlotName",
    "SlotVersions",
    "Staging",
]

log = logging.getLogger(__name__)

SlotName = Literal["A", "B"]
Phase = Literal["clearing", "sealing", "sealed", "verified", "switch_tmp", "switched"]
#: Fault-injection points, in install order: ``clearing`` (inactive slot's marker removed, the
#: rest not yet), ``sealing`` (files + manifest fsynced, no marker yet), ``sealed`` (marker
#: written, not verified), ``verified``, ``switch_tmp`` (new active.json written to its tmp
#: file, not renamed), ``switched`` (renamed and the directory fsynced).
PHASES: tuple[Phase, ...] = ("clearing", "sealing", "sealed", "verified", "switch_tmp",
                             "switched")

ONNX_FILE = "model.onnx"
CARD_FILE = "card.json"
MANIFEST_FILE = "manifest.json"
COMPLETE_FILE = "complete"
ACTIVE_FILE = "active.json"
LOCK_FILE = ".staging.lock"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class SlotFiles:
    """One complete slot: the files the node loads and the manifest they are checked against."""

    name: str                       # model name
    slot: SlotName
    dir: Path
    version: str                    # from the ``complete`` marker, written at seal time
    manifest: Mapping[str, Any]     # the signed manifest dict, as stored in manifest.json
    sealed_at: float                # epoch s

    @property
    def onnx(self) -> Path:
        return self.dir / ONNX_FILE

    @property
    def card(self) -> Path:
        return self.dir / CARD_FILE


@dataclass(frozen=True)
class ActiveRecord:
    """The content of ``active.json``."""

    slot: SlotName
    version: str
    switched_at: float


@dataclass(frozen=True)
class SlotVersions:
    """What the two slots of a model hold, for the heartbeat (markers only, not re-verified)."""

    active_slot: SlotName | None    # None: never switched (the node serves its bootstrap model)
    active: str | None              # version in the active slot, None if it is not complete
    standby: str | None             # version in the other slot, None if it is not complete


Verify = Callable[[SlotFiles], None]
Hook = Callable[[Phase], None]


def _no_hook(phase: Phase) -> None:
    return None


class Staging:
    """The inactive slot of one model, cleared and locked while one version is written into it.

    Made by :meth:`SlotManager.stage`. Write ``model.onnx`` and ``card.json`` into :attr:`dir`
    (paths :attr:`onnx`, :attr:`card`), then call :meth:`seal`. Use as a context manager:
    leaving it releases the lock, and clears the slot again if it was never sealed. The lock
    is held until then, so the node can load the sealed files and :meth:`SlotManager.switch`
    inside the ``with`` block without another staging clearing them underneath.
    """

    def __init__(self, manager: SlotManager, name: str, slot: SlotName, version: str,
                 lock_fd: int) -> None:
        self.name = name
        self.slot: SlotName = slot
        self.version = version
        self.dir = manager.slot_dir(name, slot)
        self.sealed: SlotFiles | None = None
        self._manager = manager
        self._lock_fd: int | None = lock_fd

    @property
    def onnx(self) -> Path:
        return self.dir / ONNX_FILE

    @property
    def card(self) -> Path:
        return self.dir / CARD_FILE

    def seal(self, manifest: Mapping[str, Any]) -> SlotFiles:
        """Write ``manifest.json``, fsync everything, write ``complete``, then verify.

        Raises :class:`RepositoryError` if a file is missing, :class:`ArtifactRejected` if
        verification fails (the marker is removed again: the slot is not usable).
        """
        if self._lock_fd is None:
            raise RepositoryError(f"staging of {self.name} {self.version} is closed",
                                  hint="stage the version again")
        if self.sealed is None:
            self.sealed = self._manager._seal(self, manifest)
        return self.sealed

    def close(self) -> None:
        """Release the staging lock; an unsealed slot is cleared (best effort)."""
        if self._lock_fd is None:
            return
        try:
            if self.sealed is None:
                self._manager._discard(self)
        finally:
            self._manager._release(self.name, self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class SlotManager:
    """A/B slots of every model of one node, under ``<root>/slots/``.

    ``verify`` raises :class:`ArtifactRejected` when a slot's files do not match its
    manifest; it is called at seal, at every switch and at recovery. ``clock`` gives epoch
    seconds for the records; ``hook`` is called with a :data:`Phase` at each fault point.
    Thread-safe; meant to be called from a worker thread (it fsyncs and hashes files).
    """

    def __init__(self, root: Path, verify: Verify, *, clock: Callable[[], float] = time.time,
                 hook: Hook = _no_hook) -> None:
        self.root = Path(root)
        self._verify_fn = verify
        self._clock = clock
        self._hook = hook
        self._mutex = threading.RLock()         # guards _staging and active.json writes
        self._staging: dict[str, Staging] = {}  # this manager's open stagings, by model name

    # ---- queries -------------------------------------------------------------------------

    def slot_dir(self, name: str, slot: SlotName) -> Path:
        return self._model_dir(name) / slot

    def active_record(self, name: str) -> ActiveRecord | None:
        """``active.json`` of ``name``; None if never switched (or unreadable: logged)."""
        path = self._model_dir(name) / ACTIVE_FILE
        try:
            raw = json.loads(path.read_bytes())
            return ActiveRecord(slot=_slot_name(raw["slot"]), version=str(raw["version"]),
                                switched_at=float(raw.get("switched_at", 0.0)))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("slots %s: %s unreadable (%s); treating as never switched", name,
                        path, exc)
            return None

    def active(self, name: str) -> SlotFiles | None:
        """The active slot if it is complete (not re-verified: see :meth:`recover`)."""
        record = self.active_record(name)
        return self._load(name, record.slot) if record else None

    def inactive(self, name: str) -> SlotFiles | None:
        """The slot a staging would write (the standby), if it holds a complete version."""
        return self._load(name, self._target(name))

    def versions(self, name: str) -> SlotVersions:
        """Active and standby versions from the markers (cheap: no hashing)."""
        record = self.active_record(name)
        active = self._load(name, record.slot) if record else None
        standby = self.inactive(name)
        return SlotVersions(active_slot=record.slot if record else None,
                            active=active.version if active else None,
                            standby=standby.version if standby else None)

    # ---- start-up ------------------------------------------------------------------------

    def recover(self, name: str) -> SlotFiles | None:
        """At node start: the version to serve, verified; None means the bootstrap model.

        The active slot if complete and verifying; else the other one if it is (logged as a
        warning, and ``active.json`` is rewritten to it); else None. Leftovers of a staging
        that was killed (incomplete inactive slot, tmp files) are removed.
        """
        with self._exclusive(name):
            record = self.active_record(name)
            self._cleanup(name, record.slot if record else None)
            if record is None:
                return None
            for slot in (record.slot, _other(record.slot)):
                files = self._good(name, slot)
                if files is not None:
                    if slot != record.slot:
                        log.warning("slots %s: active slot %s (version %s) is not usable; "
                                    "falling back to slot %s (version %s)", name,
                                    record.slot, record.version, slot, files.version)
                        self._write_active(name, slot, files.version)
                    return files
            log.warning("slots %s: neither slot holds a good version; the node serves its "
                        "bootstrap model", name)
            return None

    # ---- install -------------------------------------------------------------------------

    def stage(self, name: str, version: str, *, slot: SlotName | None = None) -> Staging:
        """Lock and clear the inactive slot (or ``slot``) of ``name`` for ``version``.

        Raises :class:`RepositoryError` when another staging of ``name`` is in progress, or
        when ``slot`` is the active slot (the served files are never overwritten).
        """
        if not isinstance(version, str) or not version:
            raise RepositoryError(f"invalid version {version!r} for {name}",
                                  hint="versions are non-empty strings, e.g. '2'")
        fd = self._lock(name, f"stage version {version}")
        try:
            target = self._checked_target(name, slot)
            staging = Staging(self, name, target, version, fd)
            with self._mutex:
                self._staging[name] = staging
            self._clear(staging.dir)
        except BaseException:
            self._release(name, fd)
            raise
        log.info("slots %s: staging version %s in slot %s", name, version, target)
        return staging

    def install(self, name: str, version: str, manifest: Mapping[str, Any],
                fetch: Callable[[Path], None]) -> SlotFiles:
        """Steps 1-4: stage, ``fetch(dir)`` writes model.onnx + card.json, seal and verify.

        Returns the sealed, verified (not yet active) slot; the node loads it, then switches.
        The lock is released on return; to load and switch under it, use :meth:`stage`.
        """
        with self.stage(name, version) as staging:
            fetch(staging.dir)
            return staging.seal(manifest)

    def switch(self, name: str, slot: SlotName) -> SlotFiles | None:
        """Atomically make ``slot`` active; it must be complete and verify.

        Returns what was active before (None if nothing was; the same slot if ``slot`` was
        already active), so a rollback is ``switch(name, previous.slot)``.
        """
        return self._switch(name, slot)[1]

    def rollback(self, name: str) -> SlotFiles:
        """Switch to the other slot if it is complete and verifies; returns it (now active)."""
        record = self.active_record(name)
        if record is None:
            raise RepositoryError(f"cannot roll back {name}: no version was ever switched to",
                                  hint="the node serves its bootstrap model")
        return self._switch(name, _other(record.slot))[0]

    # ---- internals -----------------------------------------------------------------------

    def _model_dir(self, name: str) -> Path:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise RepositoryError(f"invalid model name {name!r} for a slot directory",
                                  hint="model names are letters, digits, '.', '_', '-'")
        return self.root / "slots" / name

    def _target(self, name: str) -> SlotName:
        record = self.active_record(name)
        return _other(record.slot) if record else "A"

    def _checked_target(self, name: str, slot: SlotName | None) -> SlotName:
        record = self.active_record(name)
        target = slot or (_other(record.slot) if record else "A")
        if record is not None and target == record.slot:
            raise RepositoryError(
                f"refusing to stage {name} over its active slot {target} "
                f"(version {record.version} is served from it)",
                hint="stage into the inactive slot (the default)")
        return _slot_name(target)

    def _load(self, name: str, slot: SlotName) -> SlotFiles | None:
        """The slot's files if its ``complete`` marker is present and readable."""
        sdir = self.slot_dir(name, slot)
        marker_path = sdir / COMPLETE_FILE
        if not marker_path.exists():
            return None
        try:
            marker = json.loads(marker_path.read_bytes())
            manifest = json.loads((sdir / MANIFEST_FILE).read_bytes())
            if not isinstance(manifest, dict):
                raise TypeError("manifest.json is not an object")
            return SlotFiles(name=name, slot=slot, dir=sdir, version=str(marker["version"]),
                             manifest=manifest, sealed_at=float(marker["sealed_at"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("slots %s: slot %s is marked complete but damaged (%s)", name, slot,
                        exc)
            return None

    def _verify(self, files: SlotFiles) -> None:
        try:
            self._verify_fn(files)
        except OSError as exc:
            raise ArtifactRejected(
                f"{files.name} version {files.version} in slot {files.slot}: its files cannot "
                f"be read ({exc})", hint="stage the version again") from exc

    def _good(self, name: str, slot: SlotName) -> SlotFiles | None:
        """Complete and verifying, or None (why is logged)."""
        files = self._load(name, slot)
        if files is None:
            return None
        try:
            self._verify(files)
        except RepositoryError as exc:
            log.warning("slots %s: slot %s (version %s) does not verify: %s", name, slot,
                        files.version, exc.message)
            return None
        return files

    def _switch(self, name: str, slot: SlotName) -> tuple[SlotFiles, SlotFiles | None]:
        with self._exclusive(name):
            own = self._staging.get(name)
            if own is not None and own.slot == slot and own.sealed is None:
                raise RepositoryError(f"cannot switch {name} to slot {slot}: version "
                                      f"{own.version} is still being staged there",
                                      hint="seal the staging first")
            files = self._load(name, slot)
            if files is None:
                raise RepositoryError(f"cannot switch {name} to slot {slot}: it holds no "
                                      "complete version", hint="install a version first")
            self._verify(files)
            record = self.active_record(name)
            previous = self._load(name, record.slot) if record else None
            self._write_active(name, slot, files.version)
        log.info("slots %s: switched to slot %s (version %s; was %s)", name, slot,
                 files.version, previous.version if previous else "none")
        return files, previous

    def _write_active(self, name: str, slot: SlotName, version: str) -> None:
        mdir = self._model_dir(name)
        record = {"slot": slot, "version": version, "switched_at": self._clock()}
        tmp = mdir / f".{ACTIVE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
        with self._mutex:
            write_synced(tmp, json.dumps(record).encode())
            self._hook("switch_tmp")
            os.replace(tmp, mdir / ACTIVE_FILE)
            fsync_dir(mdir)
        self._hook("switched")

    def _seal(self, staging: Staging, manifest: Mapping[str, Any]) -> SlotFiles:
        sdir = staging.dir
        for path in (staging.onnx, staging.card):
            if not path.is_file():
                raise RepositoryError(
                    f"cannot seal {staging.name} {staging.version}: {path.name} is missing "
                    f"in {sdir}", hint="the download did not finish; stage the version again")
            fsync_file(path)
        write_synced(sdir / MANIFEST_FILE, _manifest_bytes(staging, manifest))
        fsync_dir(sdir)
        self._hook("sealing")
        sealed_at = self._clock()
        marker = json.dumps({"version": staging.version, "sealed_at": sealed_at}).encode()
        replace_synced(sdir / COMPLETE_FILE, marker)
        self._hook("sealed")
        files = SlotFiles(name=staging.name, slot=staging.slot, dir=sdir,
                          version=staging.version, manifest=dict(manifest), sealed_at=sealed_at)
        try:
            self._verify(files)
        except RepositoryError:
            _unmark(sdir)
            raise
        self._hook("verified")
        log.info("slots %s: version %s sealed and verified in slot %s", staging.name,
                 staging.version, staging.slot)
        return files

    def _clear(self, sdir: Path) -> None:
        """Empty a slot directory; the marker goes first so a crash leaves it incomplete."""
        _ensure_dir(sdir)
        _unmark(sdir)
        self._hook("clearing")
        for child in sdir.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        fsync_dir(sdir)

    def _discard(self, staging: Staging) -> None:
        try:
            self._clear(staging.dir)
        except OSError as exc:
            log.warning("slots %s: could not clear unsealed slot %s (%s); recover() will",
                        staging.name, staging.slot, exc)

    def _cleanup(self, name: str, active: SlotName | None) -> None:
        """Remove a killed staging's leftovers: incomplete non-active slots, tmp files."""
        mdir = self._model_dir(name)
        for tmp in mdir.glob(f".{ACTIVE_FILE}.*.tmp"):
            tmp.unlink(missing_ok=True)
        own = self._staging.get(name)
        for slot in ("A", "B"):
            sdir = mdir / slot
            busy = own is not None and own.slot == slot
            if slot == active or busy or not sdir.is_dir() or (sdir / COMPLETE_FILE).exists():
                continue
            if any(sdir.iterdir()):
                log.info("slots %s: removing an unfinished staging in slot %s", name, slot)
                self._clear(sdir)

    # ---- locking -------------------------------------------------------------------------

    def _lock(self, name: str, doing: str) -> int:
        """Take the model's staging lock (flock) or raise: one staging at a time.

        ``doing`` names the caller's operation, for the error and for the lock file, which
        records the holder (pid, operation) so a refused caller can say who holds it.
        """
        mdir = self._model_dir(name)
        _ensure_dir(mdir)
        fd = os.open(mdir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RepositoryError(
                f"slots of {name} are busy ({holder}); cannot {doing} concurrently",
                hint="one install per model at a time: wait for the running one, then retry"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "doing": doing}).encode(), 0)
        return fd

    def _release(self, name: str, fd: int) -> None:
        with self._mutex:
            self._staging.pop(name, None)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    @contextlib.contextmanager
    def _exclusive(self, name: str) -> Iterator[None]:
        """No other process stages ``name`` meanwhile (this manager's own staging is fine)."""
        with self._mutex:
            own = name in self._staging
        if own:
            yield
            return
        fd = self._lock(name, "switch or recover")
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


# ---- file helpers --------------------------------------------------------------------------

def _other(slot: SlotName) -> SlotName:
    return "B" if slot == "A" else "A"


def _slot_name(value: object) -> SlotName:
    if value == "A":
        return "A"
    if value == "B":
        return "B"
    raise ValueError(f"slot must be 'A' or 'B', not {value!r}")


def _manifest_bytes(staging: Staging, manifest: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(dict(manifest), sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        raise ArtifactRejected(f"manifest of {staging.name} {staging.version} is not JSON "
                               f"({exc})") from exc


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info.get('pid')}: {info.get('doing')}"
    except (OSError, ValueError, AttributeError):
        return "holder unknown"






def _unmark(sdir: Path) -> None:
    marker = sdir / COMPLETE_FILE
    if marker.exists():
        marker.unlink()
        fsync_dir(sdir)






def _ensure_dir(path: Path) -> None:
    """mkdir -p; a new directory's entry is fsynced into its parent."""
    if path.is_dir():
        return
    _ensure_dir(path.parent)
    path.mkdir(exist_ok=True)
    fsync_dir(path.parent)
