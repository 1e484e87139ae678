"""A/B slots survive kill -9 at every point of an install, and damaged slots on disk.

Each crash case runs ``slots_driver.py`` in a subprocess that installs version 2 over an
active version 1 (standby: version 0) and SIGKILLs itself at a named point; a fresh
SlotManager then recovers. Before the rename of active.json the node must come back on
version 1, after it on version 2, and never on a half-written slot.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from slots_driver import NAME, digest_verify, install_and_switch

from tierlink.node.slots import SlotManager, SlotName, SlotVersions

DRIVER = Path(__file__).with_name("slots_driver.py")

# kill point -> (version recovered, standby version after recovery)
CASES = {
    "clearing": ("1", None),      # standby v0's marker removed, files not yet
    "download": ("1", None),      # half of model.onnx written
    "sealing": ("1", None),       # files + manifest fsynced, no complete marker
    "sealed": ("1", "2"),         # marker written, verify not run: a complete standby
    "verified": ("1", "2"),
    "loading": ("1", "2"),        # the node loads + warms up the session here
    "switch_tmp": ("1", "2"),     # new active.json in its tmp file, not renamed
    "switched": ("2", "1"),
    "none": ("2", "1"),           # no kill: the install completes
}


def prepare(root: Path) -> SlotManager:
    """Version 0 in A (standby), version 1 in B (active)."""
    slots = SlotManager(root, digest_verify)
    install_and_switch(slots, "0")
    install_and_switch(slots, "1")
    return slots


def run_driver(root: Path, kill_at: str) -> int:
    done = subprocess.run([sys.executable, str(DRIVER), str(root), kill_at],
                          capture_output=True, timeout=30, check=False)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr.decode()
    return done.returncode


@pytest.mark.parametrize("kill_at", list(CASES))
def test_kill_at_any_point_leaves_a_good_version(tmp_path: Path, kill_at: str) -> None:
    prepare(tmp_path)
    rc = run_driver(tmp_path, kill_at)
    assert rc == (0 if kill_at == "none" else -signal.SIGKILL)

    slots = SlotManager(tmp_path, digest_verify)  # the restarted node
    files = slots.recover(NAME)
    version, standby = CASES[kill_at]
    assert files is not None and files.version == version
    digest_verify(files)
    assert slots.versions(NAME) == SlotVersions(active_slot=files.slot, active=version,
                                                standby=standby)
    leftovers = [p.name for p in (tmp_path / "slots" / NAME).iterdir() if p.name.endswith("tmp")]
    assert leftovers == []
    other_slot: SlotName = "A" if files.slot == "B" else "B"
    other = slots.slot_dir(NAME, other_slot)
    assert (other / "complete").exists() or not any(other.iterdir())  # complete or empty

    # the killed process's lock died with it: the next install goes through
    install_and_switch(slots, "3")
    assert slots.versions(NAME) == SlotVersions(active_slot=other_slot, active="3",
                                                standby=version)


def flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupted_active_slot_falls_back_to_the_standby(tmp_path: Path) -> None:
    slots = prepare(tmp_path)
    flip_a_bit(slots.slot_dir(NAME, "B") / "model.onnx")
    files = SlotManager(tmp_path, digest_verify).recover(NAME)
    assert files is not None and (files.slot, files.version) == ("A", "0")
    record = slots.active_record(NAME)
    assert record is not None and (record.slot, record.version) == ("A", "0")
    # the damaged slot is the inactive one now: the next install overwrites it
    assert install_and_switch(slots, "2") is not None
    assert slots.versions(NAME) == SlotVersions(active_slot="B", active="2", standby="0")


def test_a_damaged_marker_or_manifest_counts_as_incomplete(tmp_path: Path) -> None:
    slots = prepare(tmp_path)
    (slots.slot_dir(NAME, "B") / "manifest.json").write_text("[1, 2")
    files = slots.recover(NAME)
    assert files is not None and files.version == "0"


def test_both_slots_bad_means_the_bootstrap_model(tmp_path: Path) -> None:
    slots = prepare(tmp_path)
    flip_a_bit(slots.slot_dir(NAME, "A") / "model.onnx")
    flip_a_bit(slots.slot_dir(NAME, "B") / "card.json")
    assert SlotManager(tmp_path, digest_verify).recover(NAME) is None
    # a fresh install still works (into the inactive slot A), and becomes active
    install_and_switch(slots, "2")
    files = slots.recover(NAME)
    assert files is not None and (files.slot, files.version) == ("A", "2")
