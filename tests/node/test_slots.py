"""A/B slots in-process: install, switch, rollback, refusals, what is on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slots_driver import NAME, digest_verify, fetcher, install_and_switch, manifest

from tierlink.errors import ArtifactRejected, RepositoryError
from tierlink.node.slots import PHASES, SlotManager, SlotVersions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def slots(tmp_path: Path) -> SlotManager:
    return SlotManager(tmp_path, digest_verify, clock=Clock())


def model_dir(slots: SlotManager) -> Path:
    return slots.root / "slots" / NAME


def test_first_install_goes_to_a_and_is_not_active_until_switched(slots: SlotManager) -> None:
    files = slots.install(NAME, "1", manifest("1"), fetcher("1"))
    assert (files.slot, files.version) == ("A", "1")
    assert sorted(p.name for p in files.dir.iterdir()) == [
        "card.json", "complete", "manifest.json", "model.onnx"]
    assert slots.active(NAME) is None
    assert slots.recover(NAME) is None  # never switched: the node serves its bootstrap model
    assert slots.versions(NAME) == SlotVersions(active_slot=None, active=None, standby="1")

    assert slots.switch(NAME, "A") is None
    record = json.loads((model_dir(slots) / "active.json").read_text())
    assert record == {"slot": "A", "version": "1", "switched_at": 1002.0}
    assert slots.versions(NAME) == SlotVersions(active_slot="A", active="1", standby=None)


def test_second_version_goes_to_the_other_slot_and_switch_returns_the_previous(
        slots: SlotManager) -> None:
    install_and_switch(slots, "1")
    previous = install_and_switch(slots, "2")
    assert previous is not None and (previous.slot, previous.version) == ("A", "1")
    active = slots.active(NAME)
    assert active is not None and (active.slot, active.version) == ("B", "2")
    assert slots.versions(NAME) == SlotVersions(active_slot="B", active="2", standby="1")
    # the third version overwrites the standby (A), never the active one
    install_and_switch(slots, "3")
    assert slots.versions(NAME) == SlotVersions(active_slot="A", active="3", standby="2")


def test_rollback_flips_to_the_standby_and_back(slots: SlotManager) -> None:
    install_and_switch(slots, "1")
    install_and_switch(slots, "2")
    back = slots.rollback(NAME)
    assert (back.slot, back.version) == ("A", "1")
    assert slots.versions(NAME).active == "1"
    assert slots.rollback(NAME).version == "2"


def test_rollback_refused_without_a_good_standby(slots: SlotManager) -> None:
    with pytest.raises(RepositoryError, match="no version was ever switched"):
        slots.rollback(NAME)
    install_and_switch(slots, "1")
    with pytest.raises(RepositoryError, match="no complete version"):
        slots.rollback(NAME)
    install_and_switch(slots, "2")
    (slots.slot_dir(NAME, "A") / "model.onnx").write_bytes(b"tampered")
    with pytest.raises(ArtifactRejected, match="model.onnx"):
        slots.rollback(NAME)
    assert slots.versions(NAME).active == "2"


def test_staging_over_the_active_slot_is_refused(slots: SlotManager) -> None:
    install_and_switch(slots, "1")
    with pytest.raises(RepositoryError, match="active slot A") as info:
        slots.stage(NAME, "2", slot="A")
    assert not isinstance(info.value, ArtifactRejected)
    assert slots.recover(NAME) is not None  # files untouched, still verify
    with slots.stage(NAME, "2", slot="B") as staging:  # the explicit inactive slot is fine
        assert staging.slot == "B"


def test_a_second_concurrent_staging_is_refused(slots: SlotManager, tmp_path: Path) -> None:
    install_and_switch(slots, "1")
    other = SlotManager(tmp_path, digest_verify)  # e.g. another process on the same dir
    with slots.stage(NAME, "2"):
        with pytest.raises(RepositoryError, match="busy .*stage version 2"):
            slots.stage(NAME, "3")
        with pytest.raises(RepositoryError, match="cannot stage version 3 concurrently"):
            other.stage(NAME, "3")
        with pytest.raises(RepositoryError, match="busy"):
            other.switch(NAME, "A")
    with other.stage(NAME, "3") as staging:  # released on exit
        assert staging.slot == "B"


def test_other_models_stage_independently(slots: SlotManager) -> None:
    with slots.stage(NAME, "1"), slots.stage("other-model", "1") as staging:
        assert staging.slot == "A"


def test_seal_rejects_files_that_do_not_match_and_leaves_the_slot_unusable(
        slots: SlotManager) -> None:
    install_and_switch(slots, "1")
    with slots.stage(NAME, "2") as staging:
        fetcher("2")(staging.dir)
        (staging.dir / "card.json").write_bytes(b"{}")
        with pytest.raises(ArtifactRejected, match="card.json"):
            staging.seal(manifest("2"))
        assert not (staging.dir / "complete").exists()
        with pytest.raises(RepositoryError, match="being staged"):
            slots.switch(NAME, "B")
    assert slots.versions(NAME) == SlotVersions(active_slot="A", active="1", standby=None)
    assert list(slots.slot_dir(NAME, "B").iterdir()) == []


def test_seal_refuses_a_missing_file(slots: SlotManager) -> None:
    with slots.stage(NAME, "1") as staging:
        (staging.dir / "model.onnx").write_bytes(b"x")
        with pytest.raises(RepositoryError, match="card.json is missing"):
            staging.seal(manifest("1"))


def test_a_failed_download_clears_the_slot_and_releases_the_lock(slots: SlotManager) -> None:
    install_and_switch(slots, "1")

    def broken() -> None:
        raise OSError("connection reset")

    with pytest.raises(OSError, match="reset"):
        slots.install(NAME, "2", manifest("2"), fetcher("2", after_half=broken))
    assert list(slots.slot_dir(NAME, "B").iterdir()) == []
    assert slots.install(NAME, "2", manifest("2"), fetcher("2")).version == "2"


def test_switch_inside_the_staging_after_seal(slots: SlotManager) -> None:
    install_and_switch(slots, "1")
    with slots.stage(NAME, "2") as staging:
        fetcher("2")(staging.dir)
        files = staging.seal(manifest("2"))
        previous = slots.switch(NAME, files.slot)
    assert previous is not None and previous.version == "1"
    assert slots.versions(NAME) == SlotVersions(active_slot="B", active="2", standby="1")


def test_switch_reverifies_the_slot(slots: SlotManager) -> None:
    files = slots.install(NAME, "1", manifest("1"), fetcher("1"))
    files.onnx.unlink()
    with pytest.raises(ArtifactRejected, match="cannot be read"):
        slots.switch(NAME, "A")
    assert slots.active_record(NAME) is None


def test_hook_sees_every_phase_in_order(tmp_path: Path) -> None:
    seen: list[str] = []
    slots = SlotManager(tmp_path, digest_verify, hook=seen.append)
    install_and_switch(slots, "1")
    assert tuple(seen) == PHASES


def test_recover_removes_an_unfinished_staging(slots: SlotManager) -> None:
    install_and_switch(slots, "1")
    bdir = slots.slot_dir(NAME, "B")
    bdir.mkdir()
    (bdir / "model.onnx").write_bytes(b"half")
    (model_dir(slots) / ".active.json.1.2.tmp").write_text("{}")
    files = slots.recover(NAME)
    assert files is not None and files.version == "1"
    assert list(bdir.iterdir()) == []
    assert sorted(p.name for p in model_dir(slots).iterdir()) == [
        ".staging.lock", "A", "B", "active.json"]


def test_unreadable_active_record_counts_as_never_switched(slots: SlotManager) -> None:
    install_and_switch(slots, "1")
    (model_dir(slots) / "active.json").write_text("{not json")
    assert slots.active_record(NAME) is None
    assert slots.recover(NAME) is None


def test_model_names_must_be_safe_path_components(slots: SlotManager) -> None:
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(RepositoryError, match="invalid model name"):
            slots.stage(bad, "1")
    with pytest.raises(RepositoryError, match="invalid version"):
        slots.stage(NAME, "")
