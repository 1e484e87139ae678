import json

import pytest
from typer.testing import CliRunner

from tierlink.cli.main import app

runner = CliRunner()


def test_help_lists_the_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("demo", "up", "node", "control", "status", "zoo"):
        assert command in result.output


def test_up_with_a_bad_fleet_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("nodes: [{id: 'Bad Id', tier: device}]\nlinks: []\n")
    result = runner.invoke(app, ["up", str(bad)])
    assert result.exit_code == 2
    assert "nodes[0].id" in result.output


def test_status_without_a_control_plane_says_so():
    result = runner.invoke(app, ["status", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "cannot reach the control plane" in result.output


def test_zoo_list_json():
    from tierlink.zoo.cache import ensure_zoo

    ensure_zoo(task="fmnist", profile="test", progress=False)  # shared with the integration suite
    result = runner.invoke(app, ["zoo", "list", "--profile", "test", "--json"])
    assert result.exit_code == 0, result.output
    cards = json.loads(result.stdout)
    assert set(cards) == {"fmnist-small", "fmnist-medium", "fmnist-large"}


def test_node_batch_flags_are_the_fleet_files_batching() -> None:
    import typer

    from tierlink.cli.main import _batch
    from tierlink.errors import ConfigError
    from tierlink.settings.batching import BatchSettings

    assert _batch("fmnist-large=8:2") == ("fmnist-large", BatchSettings(8, 2.0))
    assert _batch("m=4") == ("m", BatchSettings(4, 0.0))
    with pytest.raises(typer.BadParameter, match="MODEL=N"):
        _batch("m=eight")
    with pytest.raises(ConfigError, match="max_batch"):
        _batch("m=0")
