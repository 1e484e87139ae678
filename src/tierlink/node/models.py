"""Model versions on a node: what each model serves now, and how a new version gets there.

Per model name the node serves one **active** version and at most one **standby** version
(a canary) that takes ``weight`` of the requests for that name; the active version takes the
rest. :class:`ModelManager` holds them, picks the runtime for each request
(:meth:`~ModelManager.pick`), reports them (:meth:`~ModelManager.served`,
:meth:`~ModelManager.failures`) and reconciles them with what the control plane asks
(:meth:`~ModelManager.apply_desired`, called with every heartbeat answer's ``desired``).

**Versions and where they live.** The *base* version of a model is the one in the node's
spec files (``ModelSource.onnx`` / ``.card``); it is loaded at start and stays in memory
for the life of the process, so it is always there to fall back or roll back to, at once.
Every other version lives in one of the model's A/B slots under ``<state_dir>/slots/``
(:mod:`tierlink.node.slots`), installed from the control plane's repository. Which one is
active after a restart is on disk:

* ``slots/<name>/active.json`` names the active slot (the node serves it after restart);
* ``models/<name>.base.json`` -- written when the node goes back to its base version after
  a slot version was active -- says "serve the base files instead", *over* the very
  ``active.json`` record it was written against (slot, version, ``switched_at``). Any later
  switch writes a new record, which makes the pin stale: no second file has to be removed
  in step with the switch, so no crash can leave the two disagreeing.

**Desired state** (per model, from the control plane): ``weight >= 1`` -- ``version`` must
be active, nothing on standby; ``0 < weight < 1`` -- the active version stays, ``version``
stands by and serves ``weight`` of the requests. Changes that need nothing but memory (a new
weight, the base version as canary, dropping a canary) are made at once; the rest --
loading a version from a slot, or installing it -- runs in one background task, one
version at a time, never on the event loop (file and ONNX work go to threads).

**Install** (new version ``v`` of model ``m``; "old" = the active version before)::

    step                                                       kill -9 here: after restart
    1 GET the signed manifest from the repository              old
    2 stage(m, v): lock + clear the inactive slot (a canary    old (partial slot cleaned)
      loaded from that slot is dropped first)
    3 download model.onnx + card.json (size, sha256 checked)   old (partial download cleaned)
    4 seal: manifest.json, complete marker, verify signature   old (v sealed on standby)
      with the node's trusted keys, version == sealed version
    5 attempt marker models/<m>.attempt (fsynced)              old; v recorded as failed
    6 load the ONNX session, check it fits (name, task,        old; v recorded as failed
      inputs of the base), warm up with one inference
    7 remove the attempt marker                                old (v sealed on standby)
    8a weight < 1: serve v as standby at weight (memory only)  old (v re-loaded as standby
                                                               at the next answer)
    8b weight >= 1: switch active.json to v's slot (atomic),   old before the rename, v after
       then swap the runtime in memory; in-flight requests
       finish on the runtime they started on

**Failures.** A version that cannot be installed -- not in the repository, refused by
verification (:class:`~tierlink.errors.ArtifactRejected`), failing to load or to warm up,
or found behind an attempt marker at start (the process died loading it) -- is recorded per
(model, version) in ``models/failures.json``, reported in heartbeats and never retried
while ``desired`` keeps asking for it; it is forgotten once ``desired`` stops asking for it.
An unreachable control plane is not a failure of the version: the step is retried after
``retry_s``. A node without a ``state_dir`` cannot install: every version it is asked for
other than its base is reported as failed, with that reason.

**Restart** (:meth:`~ModelManager.recover`, before the node serves): an install's attempt
marker becomes a failure; each model serves its active slot (re-verified) unless the base is
pinned or that version failed, in which case it serves the base (and pins it); without a
slot, the base. Loading the active version at start is behind an attempt marker too: a
version that killed :data:`START_CRASH_LIMIT` starts in a row is recorded as failed and the
base served (no crash loop), while a single kill during a restart costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from tierlink.durable import fsync_dir, replace_synced
from tierlink.errors import (
    ArtifactRejected,
    ControlPlaneError,
    InvalidRequest,
    RepositoryError,
    TierlinkError,
)
from tierlink.models import runtimes
from tierlink.models.onnx import DEFAULT_PROVIDERS
from tierlink.models.runtime import ModelRuntime
from tierlink.models.runtimes import LoadSpec
from tierlink.node.slots import ActiveRecord, SlotFiles, SlotManager, SlotName
from tierlink.repo.manifest import SignedManifest, is_safe_name

__all__ = ["ArtifactSource", "Desired", "ModelManager", "Role", "ServedVersion",
           "load_version", "parse_desired", "slot_verifier", "warm_up"]

log = logging.getLogger(__name__)

Role = Literal["active", "standby"]
Loader = Callable[[Path, Path], ModelRuntime]  # (model.onnx, card.json) -> runtime; blocking
Hook = Callable[[str], None]
Verify = Callable[[SlotFiles], None]

#: Fault-injection points of an install, besides :data:`tierlink.node.slots.PHASES`:
#: ``downloaded`` (both files in the staging slot, not sealed), ``loading`` (attempt marker
#: written, session not loaded), ``loaded`` (loaded and warmed up, marker removed).
PHASES = ("downloaded", "loading", "loaded")

#: Starts in a row that may die loading a model's active version before the node gives up
#: on it (records it as failed, serves the base): one kill -9 during a restart must not
#: demote a good version, a version that crashes every start must not crash-loop the node.
START_CRASH_LIMIT = 2

_DTYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT64": np.int64,
           "INT32": np.int32, "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}


def _no_hook(phase: str) -> None:
    return None


# -- what the control plane asks, what the node reports ------------------------------------


@dataclass(frozen=True, slots=True)
class Desired:
    """One model's entry of a heartbeat answer's ``desired``: serve ``version`` for
    ``weight`` (0..1) of the requests for the model (1: as the active version)."""

    version: str
    weight: float

    @classmethod
    def from_dict(cls, data: Any) -> Desired:
        """:class:`InvalidRequest` naming the field when ``data`` is malformed."""
        if not isinstance(data, Mapping):
            raise InvalidRequest(f"expected an object, got {type(data).__name__}")
        version, weight = data.get("version"), data.get("weight", 1.0)
        if not isinstance(version, str) or not is_safe_name(version):
            raise InvalidRequest(f"version {version!r} is not a valid version string")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                or not math.isfinite(weight):
            raise InvalidRequest(f"weight {weight!r} is not a number")
        return cls(version, min(1.0, max(0.0, float(weight))))


def parse_desired(raw: Any) -> tuple[dict[str, Desired], list[str]]:
    """``{model name: Desired}`` from an answer's ``desired`` (None: nothing asked), and
    one message per malformed entry (those entries are left out)."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [f"desired: expected an object, got {type(raw).__name__}"]
    wanted: dict[str, Desired] = {}
    problems = []
    for name, entry in raw.items():
        try:
            wanted[str(name)] = Desired.from_dict(entry)
        except InvalidRequest as exc:
            problems.append(f"desired[{name!r}]: {exc.message}")
    return wanted, problems


@dataclass(frozen=True, slots=True)
class ServedVersion:
    """A version the node serves now: its runtime, its role, its share of the requests."""

    name: str
    runtime: ModelRuntime
    role: Role
    weight: float

    @property
    def version(self) -> str:
        return self.runtime.info.version


class ArtifactSource(Protocol):
    """Where versions come from (:class:`tierlink.control.client.ControlClient`, or a fake).

    ``version_manifest`` raises :class:`~tierlink.errors.RepositoryError` for a version the
    repository does not have and :class:`~tierlink.errors.ControlPlaneError` when it
    cannot be asked (retried later); ``download_version`` writes ``model.onnx`` and
    ``card.json`` into the directory, checked against the manifest's sizes and hashes."""

    async def version_manifest(self, name: str, version: str) -> SignedManifest: ...

    async def download_version(self, signed: SignedManifest, dest_dir: Path) -> None: ...


# -- verify, load, warm up (blocking: called in worker threads) ------------------------------


def slot_verifier(trusted_keys: Sequence[str]) -> Verify:
    """The ``verify`` of the node's :class:`SlotManager`: the slot's signed manifest is by
    one of ``trusted_keys`` (none: every version is refused), names the slot's model and
    the version the slot was sealed as, and both files match it."""
    from tierlink.repo.verify import verify_artifact

    keys = tuple(trusted_keys)

    def verify(files: SlotFiles) -> None:
        signed = SignedManifest.from_dict(files.manifest)
        m = signed.manifest
        if (m.name, m.version) != (files.name, files.version):
            raise ArtifactRejected(
                f"slot {files.slot} of {files.name} was sealed as version {files.version} "
                f"but holds the manifest of {m.name} version {m.version}",
                hint="install the version again")
        verify_artifact(signed, files.onnx, files.card, keys)
    return verify


Host = Callable[[LoadSpec], ModelRuntime]  # the node's engine: in process, or Ray Serve


def load_version(onnx: Path, card: Path, host: Host = runtimes.load,
                 providers: tuple[str, ...] = DEFAULT_PROVIDERS) -> ModelRuntime:
    """An installed version's runtime: chosen by its card's format through the runtime
    registry and hosted by the node's engine (``host``), exactly as at node start."""
    return host(LoadSpec(card=card, model_file=onnx, providers=providers))


def warm_up(rt: ModelRuntime) -> None:
    """One inference on zeros (batch 1): the first real request does not pay for the
    session's lazy initialisation, and a graph that cannot run fails here, not in service."""
    feed: dict[str, np.ndarray] = {spec.name: np.zeros(tuple(1 if d < 0 else d for d in spec.shape),
                                                   dtype=_DTYPES.get(spec.datatype,
                                                                     np.float32))
                                  for spec in rt.inputs}
    rt.infer(feed)


def check_fits(name: str, base: ModelRuntime, rt: ModelRuntime) -> None:
    """A version may replace ``base`` only if clients cannot tell but by its answers: the
    same model name, task and input signature. :class:`ArtifactRejected` otherwise."""
    info, version = rt.info, rt.info.version
    if info.name != name:
        raise ArtifactRejected(f"{name} version {version}: its card names model "
                               f"{info.name!r}", hint="publish the card with the served name")
    if info.task != base.info.task:
        raise ArtifactRejected(f"{name} version {version} is for task {info.task!r}, the "
                               f"node serves {name} for {base.info.task!r}")
    if tuple(rt.inputs) != tuple(base.inputs):
        raise ArtifactRejected(
            f"{name} version {version} takes inputs "
            f"{[s.to_dict() for s in rt.inputs]}, the served version "
            f"{[s.to_dict() for s in base.inputs]}: requests for {name} would fail on it",
            hint="publish a model with another input signature under a new name")


# -- the manager's own files -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """What an attempt marker says: ``version`` is being loaded ``during`` an install or a
    start (recovery); ``crashes``: starts that already died loading it, before this one."""

    version: str
    during: Literal["install", "start"] = "install"
    crashes: int = 0


class _StateFiles:
    """What the manager keeps under ``<state_dir>/models/`` (each write atomic, fsynced):
    ``failures.json``, ``<name>.attempt`` and ``<name>.base.json`` (see the module doc)."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir) / "models"

    def read_failures(self) -> dict[str, dict[str, str]]:
        raw = self._read(self.dir / "failures.json")
        if not isinstance(raw, dict):
            return {}
        return {str(name): {str(v): str(msg) for v, msg in versions.items()}
                for name, versions in raw.items() if isinstance(versions, dict)}

    def write_failures(self, failures: Mapping[str, Mapping[str, str]]) -> None:
        _write_json(self.dir / "failures.json", {n: dict(v) for n, v in failures.items() if v})

    def mark_attempt(self, name: str, attempt: Attempt) -> None:
        _write_json(self._path(name, "attempt"), {**asdict(attempt), "pid": os.getpid(),
                                                  "started_at": time.time()})

    def read_attempt(self, name: str) -> Attempt | None:
        raw = self._read(self._path(name, "attempt"))
        if not isinstance(raw, dict) or "version" not in raw:
            return None
        start = raw.get("during") == "start"
        return Attempt(str(raw["version"]), "start" if start else "install",
                       int(raw.get("crashes", 0)) if start else 0)

    def clear_attempt(self, name: str) -> None:
        path = self._path(name, "attempt")
        if path.exists():
            path.unlink()
            fsync_dir(self.dir)

    def pin_base(self, name: str, version: str, over: ActiveRecord) -> None:
        _write_json(self._path(name, "base.json"), {"version": version, "over": asdict(over)})

    def base_pinned(self, name: str, record: ActiveRecord | None) -> bool:
        """Whether the base is pinned over ``record`` (the current ``active.json``)."""
        raw = self._read(self._path(name, "base.json"))
        return (record is not None and isinstance(raw, dict)
                and raw.get("over") == asdict(record))

    def _path(self, name: str, kind: str) -> Path:
        if not is_safe_name(name):
            raise RepositoryError(f"invalid model name {name!r} for a state file")
        return self.dir / f"{name}.{kind}"

    @staticmethod
    def _read(path: Path) -> Any:
        try:
            return json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s is unreadable (%s); ignoring it", path, exc)
            return None


def _write_json(path: Path, data: Any) -> None:
    """Replace ``path`` atomically: tmp file, fsync, rename, fsync the directory."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        fsync_dir(path.parent.parent)
    replace_synced(path, json.dumps(data, sort_keys=True).encode())




# -- the manager ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Loaded:
    runtime: ModelRuntime
    slot: SlotName | None  # None: the base version (the spec's files)

    @property
    def version(self) -> str:
        return self.runtime.info.version


@dataclass(slots=True)
class _Model:
    base: ModelRuntime
    active: _Loaded
    standby: _Loaded | None = None
    weight: float = 0.0  # the standby's share; 0 without a standby


class FailedVersions:
    """The versions of each model that could not be installed, with why: reported (in the
    heartbeat, and not retried) until ``desired`` stops asking for that version; kept in
    the state files, so a restart remembers them (``files`` None: in memory only)."""

    def __init__(self, files: _StateFiles | None) -> None:
        self._files = files
        self._by_model: dict[str, dict[str, str]] = {}

    def __contains__(self, key: tuple[str, str]) -> bool:
        name, version = key
        return version in self._by_model.get(name, {})

    def copy(self) -> dict[str, dict[str, str]]:
        """``{model: {version: why}}``."""
        return {name: dict(versions) for name, versions in self._by_model.items() if versions}

    async def load(self) -> None:
        if self._files is not None:
            self._by_model = await asyncio.to_thread(self._files.read_failures)

    async def add(self, name: str, version: str, message: str) -> None:
        self._by_model.setdefault(name, {})[version] = message
        await self._save()

    async def keep_wanted(self, wanted: Mapping[str, Desired]) -> None:
        """Forget every failure of a version ``wanted`` no longer asks for."""
        kept = {name: {want.version: versions[want.version]}
                for name, versions in self._by_model.items()
                if (want := wanted.get(name)) is not None and want.version in versions}
        if kept != self.copy():
            self._by_model = kept
            await self._save()

    async def _save(self) -> None:
        if self._files is not None:
            await asyncio.to_thread(self._files.write_failures, self.copy())


class ModelManager:
    """The versions a node serves, per model name; see the module docstring.

    ``base``: the runtime of each model from the node's spec files (its base version).
    ``state_dir``: where slots and the manager's files live (None: the node can serve its
    base versions, take a base version as canary, but not install). ``trusted_keys``: the
    keys a version must be signed by (``verify`` replaces the whole check, for tests).
    ``source``: the repository. ``load``: model file + card -> runtime (blocking; the
    node's engine hosts it). ``clock``
    (monotonic s) times retries; ``hook`` is called at each install phase (crash tests).

    :attr:`active` maps each name to its active runtime; the node serves from that dict
    (the very object, updated in place on the event loop at each switch). ``on_switch`` is
    called after each switch with the name and the new active runtime.
    """

    def __init__(self, base: Mapping[str, ModelRuntime], *, state_dir: Path | None = None,
                 trusted_keys: Sequence[str] = (), source: ArtifactSource | None = None,
                 verify: Verify | None = None, load: Loader = load_version,
                 clock: Callable[[], float] = time.monotonic, hook: Hook = _no_hook,
                 retry_s: float = 5.0) -> None:
        self._models = {name: _Model(rt, _Loaded(rt, None)) for name, rt in base.items()}
        self.active: dict[str, ModelRuntime] = dict(base)
        self._verify = verify or slot_verifier(trusted_keys)
        self._slots = (SlotManager(Path(state_dir), self._verify, hook=hook)
                       if state_dir is not None else None)
        self._files = _StateFiles(Path(state_dir)) if state_dir is not None else None
        self._source = source
        self._load_fn = load
        self._clock = clock
        self._hook = hook
        self._retry_s = retry_s
        self._failures = FailedVersions(self._files)
        self._wanted: dict[str, Desired] = {}
        self._retry_at: dict[tuple[str, str], float] = {}
        self._warned: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.on_switch: Callable[[str, ModelRuntime], None] | None = None
        self.installs: Counter[tuple[str, str]] = Counter()  # (model, outcome) -> count
        self.busy: tuple[str, str] | None = None  # (model, version) being worked on

    # ---- what is served ------------------------------------------------------------------

    def versions(self, name: str) -> tuple[str, ...]:
        """The versions of ``name`` served now: active first, then the standby."""
        m = self._models.get(name)
        if m is None:
            return ()
        return (m.active.version,) + ((m.standby.version,) if m.standby else ())

    def runtime(self, name: str, version: str | None = None) -> ModelRuntime | None:
        """The active runtime of ``name``, or the one serving ``version`` (active or
        standby); None when the node serves no such model or version."""
        m = self._models.get(name)
        if m is None:
            return None
        if version is None:
            return m.active.runtime
        for loaded in (m.active, m.standby):
            if loaded is not None and loaded.version == version:
                return loaded.runtime
        return None

    def pick(self, name: str, version: str | None, rng: random.Random) -> ModelRuntime | None:
        """The runtime one request for ``name`` runs on: the pinned ``version`` if given
        (None when not served), else the standby with probability ``weight``, else the
        active one. Called per request on the event loop."""
        m = self._models.get(name)
        if m is None or version is not None:
            return self.runtime(name, version)
        if m.standby is not None and rng.random() < m.weight:
            return m.standby.runtime
        return m.active.runtime

    def standby_share(self, name: str, version: str) -> tuple[float, bool]:
        """(the weight of ``name``'s standby version, 0 without one; whether ``version`` is
        that standby) — how a request's answer was drawn (mirroring samples by it)."""
        m = self._models.get(name)
        if m is None or m.standby is None:
            return 0.0, False
        return m.weight, m.standby.version == version

    def served(self) -> list[ServedVersion]:
        """Every version served now, per model the active one then the standby (for the
        heartbeat: active weight = 1 - standby weight)."""
        out = []
        for name, m in self._models.items():
            share = m.weight if m.standby is not None else 0.0
            out.append(ServedVersion(name, m.active.runtime, "active", 1.0 - share))
            if m.standby is not None:
                out.append(ServedVersion(name, m.standby.runtime, "standby", share))
        return out

    def failures(self) -> dict[str, dict[str, str]]:
        """``{model: {version: why it could not be installed}}`` (a copy)."""
        return self._failures.copy()

    # ---- start, answers, stop ------------------------------------------------------------

    async def recover(self) -> None:
        """At node start, before serving: crashed attempts become failures, and each model
        serves its last good version (see the module docstring). Blocking work in threads."""
        if self._files is None:
            return
        await self._failures.load()
        for name in self._models:
            await self._recover(name)

    async def apply_desired(self, desired: Any) -> None:
        """Reconcile with a heartbeat answer's ``desired`` (see the module docstring).

        Called on the event loop with every answer; returns at once (installs run in the
        background task). Idempotent: an install in progress is not restarted, a failed
        version is not retried. Models absent from ``desired`` are left as they are; a
        model this node does not serve is ignored (logged once)."""
        wanted, problems = parse_desired(desired)
        for problem in problems + [f"desired names {name!r}, which this node does not serve"
                                   for name in wanted if name not in self._models]:
            self._warn_once(problem)
        self._wanted = {n: w for n, w in wanted.items() if n in self._models}
        await self._failures.keep_wanted(self._wanted)
        if self._next_job() is not None and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._work(), name="tierlink-model-installs")

    async def wait_idle(self) -> None:
        """Until the background task has nothing left to do now (tests, shutdown)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Cancel the background task (an install in progress is abandoned: its slot is
        cleared or left sealed on standby, never half-active)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- in-memory changes (event loop) --------------------------------------------------

    def _settle(self, name: str, want: Desired) -> bool:
        """Make every change ``want`` needs that is memory only; True when nothing else
        is needed (the background task has no work for this model)."""
        m = self._models[name]
        if m.standby is not None and m.standby.version != want.version:
            self._drop_standby(name, f"desired is now version {want.version}")
        if want.weight >= 1.0:
            return m.active.version == want.version and m.standby is None
        if m.active.version == want.version or want.weight <= 0.0:
            if m.standby is not None:
                self._drop_standby(name, f"desired gives it weight {want.weight:g}")
            return True
        if m.standby is not None:
            m.weight = want.weight
            return True
        if want.version == m.base.info.version:
            self._set_standby(name, _Loaded(m.base, None), want.weight)
            return True
        return False

    def _set_active(self, name: str, loaded: _Loaded) -> None:
        m = self._models[name]
        before = m.active.version
        m.active, m.standby, m.weight = loaded, None, 0.0
        self.active[name] = loaded.runtime
        where = f"slot {loaded.slot}" if loaded.slot else "the node's spec files"
        log.info("%s: serving version %s from %s (was %s)", name, loaded.version, where,
                 before)
        if self.on_switch is not None:
            self.on_switch(name, loaded.runtime)

    def _set_standby(self, name: str, loaded: _Loaded, weight: float) -> None:
        m = self._models[name]
        if loaded.version == m.active.version:
            return
        m.standby, m.weight = loaded, weight
        log.info("%s: version %s stands by for %.1f%% of the requests (active: %s)", name,
                 loaded.version, 100 * weight, m.active.version)

    def _drop_standby(self, name: str, why: str) -> None:
        m = self._models[name]
        if m.standby is not None:
            log.info("%s: version %s no longer stands by (%s)", name, m.standby.version, why)
        m.standby, m.weight = None, 0.0

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    # ---- the background task -------------------------------------------------------------

    def _next_job(self) -> tuple[str, Desired] | None:
        now = self._clock()
        for name, want in self._wanted.items():
            if self._settle(name, want) or (name, want.version) in self._failures:
                continue
            if self._retry_at.get((name, want.version), -math.inf) > now:
                continue
            return name, want
        return None

    async def _work(self) -> None:
        while (job := self._next_job()) is not None:
            await self._run_job(*job)

    async def _run_job(self, name: str, want: Desired) -> None:
        key = (name, want.version)
        self.busy = key
        try:
            installed = await self._converge(name, want)
        except ControlPlaneError as exc:  # the repository is unreachable: not the version's fault
            self._retry_at[key] = self._clock() + self._retry_s
            self.installs[(name, "unreachable")] += 1
            log.warning("%s version %s: %s; retrying in %.0f s", name, want.version, exc,
                        self._retry_s)
        except Exception as exc:  # noqa: BLE001 - any failure of a version is reported
            await self._fail(name, want.version, exc)
        else:
            if installed:
                self.installs[(name, "ok")] += 1
            if self._wanted.get(name) == want and not self._settle(name, want):
                # Done, yet not there (should not happen): never spin on it.
                self._retry_at[key] = self._clock() + self._retry_s
        finally:
            self.busy = None

    async def _converge(self, name: str, want: Desired) -> bool:
        """One step toward ``want``; True when a version was loaded for it."""
        m = self._models[name]
        if want.weight >= 1.0:
            if m.standby is not None and m.standby.version == want.version:
                await self._make_active(name, m.standby)
                return False
            if want.version == m.base.info.version:
                await self._make_active(name, _Loaded(m.base, None))
                return False
        async with self._obtained(name, want.version) as loaded:
            await self._place(name, loaded)
        return True

    async def _place(self, name: str, loaded: _Loaded) -> None:
        """Serve a freshly loaded version as what ``desired`` says *now*."""
        want = self._wanted.get(name)
        if want is None or want.version != loaded.version:
            log.info("%s version %s is ready, but desired changed meanwhile; not serving it",
                     name, loaded.version)
        elif want.weight >= 1.0:
            await self._make_active(name, loaded)
        elif want.weight > 0.0:
            self._set_standby(name, loaded, want.weight)

    async def _make_active(self, name: str, loaded: _Loaded) -> None:
        """Switch on disk (the slot; or pin the base), then in memory."""
        if loaded.slot is None:
            await asyncio.to_thread(self._pin_base, name)
        else:
            slots = self._disk(name, loaded.version)[0]
            await asyncio.to_thread(slots.switch, name, loaded.slot)
        self._set_active(name, loaded)

    @contextlib.asynccontextmanager
    async def _obtained(self, name: str, version: str) -> AsyncIterator[_Loaded]:
        """``version`` loaded and warmed up: from a slot that holds it, else installed
        into the inactive slot (held locked until the caller is done: it may switch)."""
        slots = self._disk(name, version)[0]
        files = await asyncio.to_thread(verified_slot, slots, name, version, self._verify)
        if files is not None:
            yield await self._load(name, files)
            return
        if self._source is None:
            raise RepositoryError(f"cannot install {name} version {version}: this node has "
                                  "no control plane to download it from")
        signed = await self._source.version_manifest(name, version)
        if (signed.name, signed.version) != (name, version):
            raise ArtifactRejected(f"the repository answered {name} version {version} with "
                                   f"the manifest of {signed.name} version {signed.version}")
        await self._free_inactive(slots, name)
        staging = await asyncio.to_thread(slots.stage, name, version)
        try:
            await self._source.download_version(signed, staging.dir)
            self._hook("downloaded")
            files = await asyncio.to_thread(staging.seal, signed.to_dict())
            yield await self._load(name, files)
        finally:
            await asyncio.to_thread(staging.close)

    async def _free_inactive(self, slots: SlotManager, name: str) -> None:
        """A canary loaded from the slot about to be staged stops serving first."""
        record = await asyncio.to_thread(slots.active_record, name)
        target: SlotName = ("B" if record.slot == "A" else "A") if record else "A"
        m = self._models[name]
        if m.standby is not None and m.standby.slot == target:
            self._drop_standby(name, f"its slot {target} is needed for an install")

    async def _load(self, name: str, files: SlotFiles, attempt: Attempt | None = None
                    ) -> _Loaded:
        """Load + check + warm up, behind an attempt marker (a crash here is remembered)."""
        state = self._disk(name, files.version)[1]
        base = self._models[name].base
        await asyncio.to_thread(state.mark_attempt, name, attempt or Attempt(files.version))
        self._hook("loading")
        try:
            rt = await asyncio.to_thread(prepared, self._load_fn, name, base, files)
        except BaseException:  # it failed without killing the process: not a crash
            state.clear_attempt(name)
            raise
        await asyncio.to_thread(state.clear_attempt, name)
        self._hook("loaded")
        return _Loaded(rt, files.slot)

    def _disk(self, name: str, version: str) -> tuple[SlotManager, _StateFiles]:
        """The slots and state files, or :class:`RepositoryError` when the node has none."""
        if self._slots is None or self._files is None:
            raise RepositoryError(f"cannot install {name} version {version}: this node has "
                                  "no state_dir to keep model versions in",
                                  hint="set state_dir in the node's spec (the fleet file)")
        return self._slots, self._files

    # ---- failures and restart ------------------------------------------------------------

    async def _fail(self, name: str, version: str, exc: BaseException | str,
                    outcome: str | None = None) -> None:
        if isinstance(exc, TierlinkError):
            message = f"{exc.code}: {exc.message}"
        else:
            message = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        await self._failures.add(name, version, message)
        outcome = outcome or ("rejected" if isinstance(exc, ArtifactRejected) else "failed")
        self.installs[(name, outcome)] += 1
        log.error("%s version %s cannot be installed (not retried while desired asks for "
                  "it): %s", name, version, message)

    async def _recover(self, name: str) -> None:
        slots, state = self._disk(name, "")
        crashed = await asyncio.to_thread(state.read_attempt, name)
        if crashed is not None:
            await asyncio.to_thread(state.clear_attempt, name)
            if crashed.during == "install":
                await self._fail(name, crashed.version, "the node process died while loading "
                                 f"version {crashed.version} (a crash in the runtime, or "
                                 "killed)", "crashed")
        files = await asyncio.to_thread(self._recovered_files, slots, state, name)
        if files is None:
            return
        crashes = crashed.crashes + 1 if crashed is not None and crashed.during == "start" \
            and crashed.version == files.version else 0
        if crashes >= START_CRASH_LIMIT:
            await self._fail(name, files.version, f"the node process died {crashes} times in "
                             f"a row loading version {files.version} at start", "crashed")
            await asyncio.to_thread(self._pin_base, name)
            return
        try:
            loaded = await self._load(name, files, Attempt(files.version, "start", crashes))
        except Exception as exc:  # noqa: BLE001 - the base version serves instead
            await self._fail(name, files.version, exc)
            await asyncio.to_thread(self._pin_base, name)
            return
        self._set_active(name, loaded)

    def _recovered_files(self, slots: SlotManager, state: _StateFiles,
                         name: str) -> SlotFiles | None:
        """The slot to serve after a restart; None: the base (blocking)."""
        pinned = state.base_pinned(name, slots.active_record(name))
        files = slots.recover(name)
        if files is None:
            return None
        if not pinned and (name, files.version) not in self._failures:
            return files
        if not pinned:
            log.warning("%s: version %s in the active slot failed before; serving the base "
                        "version %s", name, files.version, self._models[name].base.info.version)
        self._pin_base(name)  # over the record recover() left, which it may have rewritten
        return None

    def _pin_base(self, name: str) -> None:
        """Persist "serve the base files" over the current active.json (blocking)."""
        if self._slots is None or self._files is None:
            return
        record = self._slots.active_record(name)
        if record is not None:
            self._files.pin_base(name, self._models[name].base.info.version, record)


def prepared(load: Callable[[Path, Path], ModelRuntime], name: str, base: ModelRuntime,
             files: SlotFiles) -> ModelRuntime:
    """The runtime of the version in ``files``: loaded, its card's version checked against
    the slot's, its signature against the base's, warmed up (blocking)."""
    rt = load(files.onnx, files.card)
    if rt.info.version != files.version:
        raise ArtifactRejected(f"{name}: the card in slot {files.slot} says version "
                               f"{rt.info.version}, the slot holds {files.version}")
    check_fits(name, base, rt)
    warm_up(rt)
    return rt


def verified_slot(slots: SlotManager, name: str, version: str,
                  verify: Callable[[SlotFiles], Any]) -> SlotFiles | None:
    """A complete slot of ``name`` that holds ``version`` and verifies (blocking)."""
    for files in (slots.active(name), slots.inactive(name)):
        if files is None or files.version != version:
            continue
        try:
            verify(files)
        except (RepositoryError, OSError) as exc:
            log.warning("%s: slot %s holds version %s but does not verify (%s); "
                        "installing it again", name, files.slot, version, exc)
            continue
        return files
    return None
