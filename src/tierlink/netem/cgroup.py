"""Real CPU quotas for node processes, with Linux cgroups.

``CpuThrottle.create("edge-1", 0.5)`` makes a group that may use half of one core, and
``throttle.add(pid)`` moves a process (all its threads) into it. The mechanism, by preference:

* ``cgroup-v2``: a v2 hierarchy whose ``cgroup.controllers`` lists ``cpu`` (at the cgroup root,
  or at ``<root>/unified`` on a hybrid layout); the group's ``cpu.max`` is ``"quota period"``.
* ``cgroup-v1``: the v1 ``cpu`` hierarchy (``<root>/cpu``); ``cpu.cfs_period_us`` and
  ``cpu.cfs_quota_us``.
* ``none``: neither is available or writable (not root, read-only mount): a warning is logged
  and the throttle does nothing, so a fleet still runs, just unthrottled.

The period is short (10 ms), so a throttled process stalls often and briefly, like a slower
CPU, instead of running at full speed for 100 ms and then freezing. (The kernel needs a quota of
at least 1 ms, so fractions under 0.1 use a longer period.)

Groups live under ``<hierarchy>/tierlink/<name>-<run id>``: unique per run, so concurrent runs and
leftovers of a crashed run never collide. The ``tierlink`` parent weighs as much as its groups
together (``cpu.shares`` 1024 or ``cpu.weight`` 100 each, the kernel's defaults): the
scheduler shares a busy machine among the parent and the processes outside it first, so at the
default weight every throttled node together would count as one process — four emulated
devices starved to a quarter of one process's share while an unthrottled neighbour starts up.
:meth:`CpuThrottle.close` moves any process still in the group back to the hierarchy's root
group (unthrottled), removes the group, and removes the ``tierlink`` parent if no other run
uses it (else weighs it again). It never kills anything.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Self

from tierlink.errors import LinkEmulationError

__all__ = ["CgroupFs", "CpuQuota", "CpuThrottle", "Mode"]

log = logging.getLogger(__name__)

Mode = Literal["cgroup-v2", "cgroup-v1", "none"]

DEFAULT_ROOT = Path("/sys/fs/cgroup")
PARENT = "tierlink"
# A group's weight by default (v1 ``cpu.shares``, v2 ``cpu.weight``) and the largest allowed.
WEIGHT = {"cgroup-v1": ("cpu.shares", 1024, 262_144), "cgroup-v2": ("cpu.weight", 100, 10_000)}
PERIOD_US = 10_000  # short: throttling shows up as many small stalls, not a few 100 ms ones
MIN_QUOTA_US = 1_000  # the kernel refuses smaller quotas
MAX_PERIOD_US = 1_000_000  # the kernel refuses longer periods

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")  # + run id stays under NAME_MAX (255)
_HINT = "set cpu_quota in the fleet file to a positive fraction of one core, e.g. 0.5"


@dataclass(frozen=True, slots=True)
class CpuQuota:
    """``quota_us`` of CPU time per ``period_us`` of wall time (quota / period = cores)."""

    quota_us: int
    period_us: int

    @classmethod
    def for_fraction(cls, fraction: float) -> CpuQuota:
        """The quota for ``fraction`` of one core (> 1 means several cores)."""
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
                or not math.isfinite(fraction) or fraction <= 0:
            raise LinkEmulationError(f"cpu fraction {fraction!r} must be a positive number",
                                     hint=_HINT, field="fraction")
        period = PERIOD_US
        if fraction * period < MIN_QUOTA_US:
            period = math.ceil(MIN_QUOTA_US / fraction)
        if period > MAX_PERIOD_US:
            raise LinkEmulationError(
                f"cpu fraction {fraction!r} is too small: the kernel needs at least "
                f"{MIN_QUOTA_US / MAX_PERIOD_US:g} of a core", hint=_HINT, field="fraction")
        return cls(quota_us=round(fraction * period), period_us=period)

    @property
    def cores(self) -> float:
        return self.quota_us / self.period_us


class CgroupFs:
    """The filesystem operations CpuThrottle uses, so a test can mimic the kernel's cgroupfs.

    On a real cgroupfs, ``mkdir`` makes the kernel create the group's interface files and
    ``rmdir`` removes a group although those files are in it.
    """

    def mkdir(self, path: Path) -> None:
        path.mkdir()

    def rmdir(self, path: Path) -> None:
        path.rmdir()

    def read(self, path: Path) -> str:
        return path.read_text()

    def write(self, path: Path, text: str) -> None:
        # One write() call per value: cgroupfs parses each write on its own.
        with open(path, "w") as file:
            file.write(text)


@dataclass(frozen=True, slots=True)
class _Hierarchy:
    mode: Mode
    root: Path  # the hierarchy's root group


def _v2_candidates(root: Path) -> list[Path]:
    return [root, root / "unified"]


def _v1_candidates(root: Path) -> list[Path]:
    return [root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"]


def _detect(root: Path, fs: CgroupFs, reasons: list[str]) -> list[_Hierarchy]:
    """Usable hierarchies, best first; why the others are not is appended to ``reasons``."""
    found: list[_Hierarchy] = []
    for path in _v2_candidates(root):
        controllers = path / "cgroup.controllers"
        if not controllers.is_file():
            continue
        if "cpu" not in fs.read(controllers).split():
            reasons.append(f"the cgroup v2 hierarchy at {path} has no cpu controller")
        elif not os.access(path, os.W_OK):
            reasons.append(f"the cgroup v2 hierarchy at {path} is not writable (run as root)")
        else:
            found.append(_Hierarchy("cgroup-v2", path))
    for path in _v1_candidates(root):
        if not (path / "cpu.cfs_quota_us").is_file():
            continue
        if os.access(path, os.W_OK):
            found.append(_Hierarchy("cgroup-v1", path))
            break
        reasons.append(f"the cgroup v1 cpu hierarchy at {path} is not writable (run as root)")
    if not found and not reasons:
        reasons.append(f"no cgroup hierarchy with a cpu controller under {root}")
    return found


def _make_group(fs: CgroupFs, hierarchy: _Hierarchy, leaf: str, quota: CpuQuota) -> Path:
    """Create ``<hierarchy>/tierlink/<leaf>`` with ``quota``; on failure remove what it made."""
    parent = hierarchy.root / PARENT
    if hierarchy.mode == "cgroup-v2":
        _enable_cpu(fs, hierarchy.root)
    if not parent.is_dir():
        try:
            fs.mkdir(parent)
        except FileExistsError:
            pass  # another run made it meanwhile
    if hierarchy.mode == "cgroup-v2":
        _enable_cpu(fs, parent)
    group = parent / leaf
    fs.mkdir(group)
    try:
        if hierarchy.mode == "cgroup-v2":
            fs.write(group / "cpu.max", f"{quota.quota_us} {quota.period_us}")
        else:
            fs.write(group / "cpu.cfs_period_us", str(quota.period_us))
            fs.write(group / "cpu.cfs_quota_us", str(quota.quota_us))
    except OSError:
        fs.rmdir(group)
        raise
    _weigh_parent(fs, hierarchy.mode, parent)
    return group


def _weigh_parent(fs: CgroupFs, mode: Mode, parent: Path) -> None:
    """Give ``parent`` the weight of its groups together (at least one group's): each
    throttled node competes for a busy machine like one process outside the parent, never
    all of them together like a single one. Best effort: a failure only logs."""
    if mode == "none" or not parent.is_dir():
        return
    name, each, most = WEIGHT[mode]
    try:
        groups = sum(1 for child in parent.iterdir() if child.is_dir())
        fs.write(parent / name, str(min(most, each * max(1, groups))))
    except OSError as exc:
        log.warning("cpu throttle: could not weigh %s: %s", parent, exc)


def _enable_cpu(fs: CgroupFs, group: Path) -> None:
    """Let ``group``'s children use the cpu controller (v2 only)."""
    control = group / "cgroup.subtree_control"
    if "cpu" not in fs.read(control).split():
        fs.write(control, "+cpu")


class CpuThrottle:
    """A CPU quota applied to processes; build it with :meth:`create`.

    Not thread-safe; one owner (the fleet launcher) creates it, adds the node's pid, and closes
    it when the node stops. Also a context manager.
    """

    def __init__(self, name: str, mode: Mode, quota: CpuQuota, *, group: Path | None = None,
                 hierarchy_root: Path | None = None, fs: CgroupFs | None = None,
                 reason: str = "") -> None:
        self.name = name
        self.mode: Mode = mode
        self.quota = quota
        self.group = group  # None in mode "none"
        self.reason = reason  # why the mode is "none" (empty otherwise)
        self._hierarchy_root = hierarchy_root
        self._fs = fs or CgroupFs()
        self._pids: list[int] = []
        self._closed = False

    @classmethod
    def create(cls, name: str, fraction: float, root: Path | None = None, *,
               run_id: str | None = None, fs: CgroupFs | None = None) -> CpuThrottle:
        """A throttle to ``fraction`` of one core, with the best mechanism available.

        ``root`` is the cgroup filesystem root (default ``/sys/fs/cgroup``); tests pass a fake
        tree, and a fake ``fs``. ``run_id`` makes the group unique (default: pid + random).
        Never fails for lack of cgroups: it logs a warning and returns mode ``"none"``.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise LinkEmulationError(f"throttle name {name!r} must match {_NAME.pattern}",
                                     hint="use the node id", field="name")
        quota = CpuQuota.for_fraction(fraction)
        fs = fs or CgroupFs()
        leaf = f"{name}-{run_id or f'{os.getpid()}-{secrets.token_hex(3)}'}"
        reasons: list[str] = []
        for hierarchy in _detect(root or DEFAULT_ROOT, fs, reasons):
            try:
                group = _make_group(fs, hierarchy, leaf, quota)
            except OSError as exc:
                reasons.append(f"{hierarchy.mode} at {hierarchy.root} failed: {exc}")
                continue
            log.info("cpu throttle %s: %.3g core(s) with %s at %s", name, quota.cores,
                     hierarchy.mode, group)
            return cls(name, hierarchy.mode, quota, group=group,
                       hierarchy_root=hierarchy.root, fs=fs)
        reason = "; ".join(reasons)
        log.warning("cpu throttle %s: NOT enforced (%s); the process will use the CPU "
                    "unthrottled. Run as root on a machine with cgroups to enforce it.",
                    name, reason)
        return cls(name, "none", quota, fs=fs, reason=reason)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group; a no-op in mode "none"."""
        if self._closed:
            raise LinkEmulationError(f"cpu throttle {self.name} is closed",
                                     hint="create a new throttle")
        self._pids.append(pid)
        if self.group is None:
            return
        try:
            self._fs.write(self.group / "cgroup.procs", str(pid))
        except ProcessLookupError as exc:
            raise LinkEmulationError(f"cannot throttle pid {pid}: no such process",
                                     hint="add the pid of a running process", pid=pid) from exc
        except OSError as exc:
            raise LinkEmulationError(f"cannot move pid {pid} into {self.group}: {exc}",
                                     hint="run as root", pid=pid) from exc

    def pids(self) -> list[int]:
        """The processes in the group now (those added, in mode "none")."""
        if self.group is None:
            return list(self._pids)
        text = self._fs.read(self.group / "cgroup.procs")
        return [int(line) for line in text.split()]

    def stats(self) -> dict[str, int]:
        """The group's ``cpu.stat`` (``nr_periods``, ``nr_throttled``, ...); {} in mode "none"."""
        if self.group is None:
            return {}
        stats: dict[str, int] = {}
        for line in self._fs.read(self.group / "cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                stats[key] = int(value)
        return stats

    def close(self) -> None:
        """Move remaining processes to the root group, then remove the group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.group is None or self._hierarchy_root is None:
            return
        for pid in self.pids():
            self._release(self._hierarchy_root, pid)
        try:
            self._fs.rmdir(self.group)
        except OSError as exc:
            log.warning("cpu throttle %s: could not remove %s: %s", self.name, self.group, exc)
            return
        try:
            self._fs.rmdir(self.group.parent)
        except OSError:  # another run still has a group there
            _weigh_parent(self._fs, self.mode, self.group.parent)

    def _release(self, root: Path, pid: int) -> None:
        try:
            self._fs.write(root / "cgroup.procs", str(pid))
        except ProcessLookupError:
            pass  # it exited meanwhile
        except OSError as exc:
            log.warning("cpu throttle %s: could not move pid %d out: %s", self.name, pid, exc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CpuThrottle(name={self.name!r}, mode={self.mode!r}, "
                f"cores={self.quota.cores:.3g}, group={self.group})")
