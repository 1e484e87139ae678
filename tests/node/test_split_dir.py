"""Where a node keeps the models it cuts for split plans: under its state directory when it
has one (a fleet's run directory: removed with it, even after a kill -9), emptied of what a
killed run left there; a temporary directory otherwise."""

from pathlib import Path

from tierlink.node.splits import _fresh_dir


def test_cut_models_live_under_the_state_dir_and_a_killed_runs_leftovers_go(
        tmp_path: Path) -> None:
    stale = tmp_path / "splits" / "fmnist-large@1"
    stale.mkdir(parents=True)
    (stale / "tail.onnx").write_bytes(b"left by a run killed before it could clean up")
    path = _fresh_dir(tmp_path, "dev-1")
    assert path == tmp_path / "splits" and list(path.iterdir()) == []
    elsewhere = _fresh_dir(None, "dev-1")
    try:
        assert elsewhere.name.startswith("tierlink-dev-1-split-") and elsewhere.is_dir()
    finally:
        elsewhere.rmdir()
