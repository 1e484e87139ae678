import shutil

import pytest

from tierlink.demo.fleets import fleet_path
from tierlink.errors import ConfigError
from tierlink.fleet.config import load_fleet
from tierlink.fleet.fleetfile import write_thresholds

EXAMPLE = fleet_path()


def test_thresholds_are_written_and_the_rest_of_the_file_kept(tmp_path):
    path = tmp_path / "fleet.yaml"
    shutil.copy(EXAMPLE, path)
    before = path.read_text()
    write_thresholds(path, {"fmnist-small": 0.812345, "fmnist-x": 0.5}, comment="tuned")
    after = path.read_text()
    config = load_fleet(path)
    assert config.routing.thresholds["fmnist-small"] == 0.8123
    assert config.routing.thresholds["fmnist-x"] == 0.5
    assert "fmnist-medium" in config.routing.thresholds  # untouched entries stay
    # Comments and the other sections survive the round trip.
    assert "# A fleet on one machine" in after and "# tuned" in after
    def lines(text):  # padding inside flow mappings is normalised to one space
        return [" ".join(ln.split()) for ln in text.splitlines() if "thresholds" not in ln]

    assert lines(before) == lines(after)


def test_a_fleet_without_routing_gets_one(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("name: t\nnodes:\n  - {id: d, tier: device, models: [m-small]}\n")
    write_thresholds(path, {"m-small": 0.7})
    assert load_fleet(path).routing.thresholds == {"m-small": 0.7}


def test_an_invalid_result_never_replaces_the_file(tmp_path):
    path = tmp_path / "fleet.yaml"
    shutil.copy(EXAMPLE, path)
    before = path.read_text()
    with pytest.raises(ConfigError):
        write_thresholds(path, {"fmnist-small": 1.5})  # out of range: parse_fleet refuses
    assert path.read_text() == before
    assert not list(tmp_path.glob("*.tmp"))


def test_a_symlinked_fleet_file_is_written_through_the_link(tmp_path):
    target = tmp_path / "real.yaml"
    shutil.copy(EXAMPLE, target)
    link = tmp_path / "fleet.yaml"
    link.symlink_to(target)
    write_thresholds(link, {"fmnist-small": 0.7})
    assert link.is_symlink() and load_fleet(target).routing.thresholds["fmnist-small"] == 0.7


def test_cascade_tune_writes_thresholds_provenance_and_records_in_one_go(tmp_path):
    from tierlink.fleet.fleetfile import write_cascade

    path = tmp_path / "fleet.yaml"
    shutil.copy(EXAMPLE, path)
    records = {"a": {"share": 1.0, "accuracy": 0.9, "threshold": 0.8, "answered": 0.7,
                     "answered_accuracy": 0.95},
               "a>b": {"share": 0.3, "accuracy": 0.6}}
    write_cascade(path, {"a": 0.8}, {"a": "1" * 64, "b": "2" * 64}, records,
                  comment="cascade tune: with 90% confidence")
    config = load_fleet(path)
    assert config.routing.thresholds["a"] == 0.8
    assert config.routing.cascade_tuned_on == {"a": "1" * 64, "b": "2" * 64}
    assert config.routing.cascade_records[("a", "b")].accuracy == 0.6
    assert config.routing.cascade_records[("a",)].answered == 0.7
    text = path.read_text()
    assert "# cascade tune: with 90% confidence" in text and "# A fleet on one machine" in text
    # tuning again replaces the block rather than merging stale records into it
    write_cascade(path, {"a": 0.7}, {"a": "3" * 64}, {"a": {"share": 1.0, "accuracy": 0.9}},
                  comment="again")
    config = load_fleet(path)
    assert set(config.routing.cascade_records) == {("a",)}
    assert config.routing.cascade_tuned_on == {"a": "3" * 64}
