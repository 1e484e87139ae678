"""CpuThrottle: detection and group handling on fake cgroup trees, and one real throttle."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tierlink.errors import LinkEmulationError
from tierlink.netem.cgroup import CgroupFs, CpuQuota, CpuThrottle


class FakeKernelFs(CgroupFs):
    """Mimics cgroupfs on plain directories: mkdir makes interface files, rmdir removes them,
    and writing a pid to ``cgroup.procs`` moves it out of every other group of the tree."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree

    def mkdir(self, path: Path) -> None:
        path.mkdir()
        v2 = any((p / "cgroup.controllers").exists() for p in path.parents)
        files = ({"cpu.max": "max 100000", "cgroup.subtree_control": "",
                  "cgroup.controllers": "cpu"} if v2 else
                 {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1"})
        for name, text in {**files, "cgroup.procs": "", "cpu.stat": "nr_throttled 3"}.items():
            (path / name).write_text(text)

    def rmdir(self, path: Path) -> None:
        if [p for p in path.iterdir() if p.is_dir()] or (path / "cgroup.procs").read_text():
            raise OSError(16, "Device or resource busy")
        for child in path.iterdir():
            child.unlink()
        path.rmdir()

    def write(self, path: Path, text: str) -> None:
        if path.name == "cgroup.subtree_control":
            path.write_text(" ".join(sorted({*path.read_text().split(), text.lstrip("+")})))
        elif path.name == "cgroup.procs":
            for procs in self.tree.rglob("cgroup.procs"):
                procs.write_text("".join(f"{p}\n" for p in procs.read_text().split()
                                         if p != text))
            path.write_text(path.read_text() + f"{text}\n")
        else:
            path.write_text(text)


def _v1_tree(root: Path) -> Path:
    cpu = root / "cpu"
    cpu.mkdir(parents=True)
    for name, text in {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1",
                       "cgroup.procs": "1\n42\n"}.items():
        (cpu / name).write_text(text)
    return cpu


def _v2_tree(root: Path, controllers: str) -> Path:
    unified = root / "unified"
    unified.mkdir(parents=True)
    for name, text in {"cgroup.controllers": controllers, "cgroup.subtree_control": "",
                       "cgroup.procs": "1\n42\n"}.items():
        (unified / name).write_text(text)
    return unified


def test_quota_uses_a_short_period_and_stretches_it_for_tiny_fractions() -> None:
    assert CpuQuota.for_fraction(0.2) == CpuQuota(quota_us=2_000, period_us=10_000)
    assert CpuQuota.for_fraction(1.5) == CpuQuota(quota_us=15_000, period_us=10_000)
    assert CpuQuota.for_fraction(0.05) == CpuQuota(quota_us=1_000, period_us=20_000)
    for bad in (0, -0.5, float("nan"), 0.0001):
        with pytest.raises(LinkEmulationError, match="fraction"):
            CpuQuota.for_fraction(bad)


def test_v1_group_gets_quota_holds_pids_and_is_removed(tmp_path: Path) -> None:
    cpu = _v1_tree(tmp_path)
    # The v2 mount exists but lacks the cpu controller, as on this project's machines.
    _v2_tree(tmp_path, controllers="hugetlb")
    fs = FakeKernelFs(tmp_path)
    throttle = CpuThrottle.create("edge-1", 0.2, root=tmp_path, run_id="r1", fs=fs)
    assert throttle.mode == "cgroup-v1"
    assert throttle.group == cpu / "tierlink" / "edge-1-r1"
    assert (throttle.group / "cpu.cfs_period_us").read_text() == "10000"
    assert (throttle.group / "cpu.cfs_quota_us").read_text() == "2000"
    throttle.add(42)
    assert throttle.pids() == [42]
    assert "42" not in (cpu / "cgroup.procs").read_text().split()
    assert throttle.stats() == {"nr_throttled": 3}
    throttle.close()
    assert "42" in (cpu / "cgroup.procs").read_text().split()  # moved back, not killed
    assert not (cpu / "tierlink").exists()
    throttle.close()  # idempotent


def test_v2_is_preferred_when_it_has_the_cpu_controller(tmp_path: Path) -> None:
    _v1_tree(tmp_path)
    unified = _v2_tree(tmp_path, controllers="cpu memory pids")
    fs = FakeKernelFs(tmp_path)
    with CpuThrottle.create("cloud-1", 0.5, root=tmp_path, run_id="r2", fs=fs) as throttle:
        assert throttle.mode == "cgroup-v2"
        assert throttle.group is not None
        assert (throttle.group / "cpu.max").read_text() == "5000 10000"
        assert "cpu" in (unified / "cgroup.subtree_control").read_text().split()
        assert "cpu" in (unified / "tierlink" / "cgroup.subtree_control").read_text().split()
        throttle.add(42)
        assert throttle.pids() == [42]
    assert "42" in (unified / "cgroup.procs").read_text().split()
    assert not (unified / "tierlink").exists()


def test_parent_stays_while_another_run_uses_it(tmp_path: Path) -> None:
    cpu = _v1_tree(tmp_path)
    fs = FakeKernelFs(tmp_path)
    first = CpuThrottle.create("a", 0.3, root=tmp_path, run_id="1", fs=fs)
    second = CpuThrottle.create("a", 0.3, root=tmp_path, run_id="2", fs=fs)
    assert first.group != second.group
    first.close()
    assert (cpu / "tierlink" / "a-2").is_dir()
    assert (cpu / "tierlink" / "cpu.shares").read_text() == "1024"
    second.close()
    assert not (cpu / "tierlink").exists()


@pytest.mark.parametrize("mode", ["cgroup-v1", "cgroup-v2"])
def test_the_parent_weighs_as_much_as_its_groups_together(tmp_path: Path, mode: str) -> None:
    """Each throttled node competes for a busy machine like one process outside the
    parent: the parent's weight is the default times its groups, as they come and go."""
    hierarchy = _v1_tree(tmp_path) if mode == "cgroup-v1" else _v2_tree(tmp_path, "cpu")
    weight, each = ("cpu.shares", 1024) if mode == "cgroup-v1" else ("cpu.weight", 100)
    fs = FakeKernelFs(tmp_path)
    throttles = [CpuThrottle.create(f"dev-{i}", 0.5, root=tmp_path, run_id="r", fs=fs)
                 for i in range(4)]
    assert {t.mode for t in throttles} == {mode}
    assert (hierarchy / "tierlink" / weight).read_text() == str(4 * each)
    for t in throttles[:3]:
        t.close()
    assert (hierarchy / "tierlink" / weight).read_text() == str(each)
    throttles[3].close()
    assert not (hierarchy / "tierlink").exists()


def test_no_cgroups_warns_and_does_nothing(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    _v2_tree(tmp_path, controllers="hugetlb")
    with caplog.at_level(logging.WARNING, logger="tierlink.netem.cgroup"):
        throttle = CpuThrottle.create("device-1", 0.25, root=tmp_path, fs=FakeKernelFs(tmp_path))
    assert throttle.mode == "none"
    assert "no cpu controller" in throttle.reason
    assert "NOT enforced" in caplog.text
    throttle.add(12345)
    assert throttle.pids() == [12345] and throttle.stats() == {}
    throttle.close()


def test_bad_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(LinkEmulationError, match="name"):
        CpuThrottle.create("../escape", 0.5, root=tmp_path)


# --- the real kernel -----------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def test_real_throttle_holds_a_busy_loop_to_a_fifth_of_a_core() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroups")
    throttle = CpuThrottle.create("pytest-busy", 0.2)
    if throttle.mode == "none":
        pytest.skip(f"no usable cgroup cpu controller: {throttle.reason}")
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        throttle.add(child.pid)
        before_cpu, before_wall = _cpu_seconds(child.pid), time.monotonic()
        throttled_before = throttle.stats().get("nr_throttled", 0)
        time.sleep(1.5)  # measuring a rate over a window, not waiting for an event
        used = (_cpu_seconds(child.pid) - before_cpu) / (time.monotonic() - before_wall)
        throttled = throttle.stats().get("nr_throttled", 0) - throttled_before
    finally:
        throttle.close()
        child.kill()
        child.wait(timeout=10)
    assert 0.08 <= used <= 0.30, f"busy loop used {used:.3f} core under a 0.2 quota"
    assert throttled > 50  # ~150 periods of 10 ms, most of them throttled
    assert throttle.group is not None and not throttle.group.exists()


def test_real_throttled_loops_get_a_process_turn_on_a_busy_machine() -> None:
    """Busy loops throttled to half a core each, beside as many unthrottled busy loops as
    the machine has cores twice over (each its own session, as a fleet's nodes are): each
    throttled loop gets about an unthrottled one's share, not a fraction of it (at the
    parent's default weight the throttled loops together would weigh as one process)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroups")
    throttles = [CpuThrottle.create(f"pytest-share-{i}", 0.5) for i in range(2)]
    if throttles[0].mode == "none":
        pytest.skip(f"no usable cgroup cpu controller: {throttles[0].reason}")
    loop = [sys.executable, "-c", "while True: pass"]
    busy = [subprocess.Popen(loop, start_new_session=True)
            for _ in range(2 * (os.cpu_count() or 1))]
    held = [subprocess.Popen(loop, start_new_session=True) for _ in throttles]
    try:
        for throttle, child in zip(throttles, held, strict=True):
            throttle.add(child.pid)
        before = [_cpu_seconds(p.pid) for p in busy + held]
        time.sleep(2.0)  # measuring shares over a window, not waiting for an event
        used = [_cpu_seconds(p.pid) - b for p, b in zip(busy + held, before, strict=True)]
    finally:
        for throttle in throttles:
            throttle.close()
        for child in busy + held:
            child.kill()
            child.wait(timeout=10)
    free = sorted(used[:len(busy)])[len(busy) // 2]  # the median unthrottled loop
    throttled = min(used[len(busy):])
    assert throttled >= 0.75 * free, (
        f"a throttled loop used {throttled:.2f} s of CPU, an unthrottled one {free:.2f} s")
