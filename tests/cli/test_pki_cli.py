"""`tierlink pki init | issue | show` on the command line."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from typer.testing import CliRunner

from tierlink.cli.main import app

runner = CliRunner()


def test_init_issue_show(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    assert runner.invoke(app, ["pki", "init", str(ca)]).exit_code == 0
    assert stat.S_IMODE((ca / "ca.key").stat().st_mode) == 0o600
    again = runner.invoke(app, ["pki", "init", str(ca)])
    # The terminal may wrap the message anywhere (the path's length varies): join the lines.
    assert again.exit_code != 0 and "already holds a CA" in " ".join(again.output.split())
    out = tmp_path / "control-1"
    made = runner.invoke(app, ["pki", "issue", "control", "control-1", "--ca", str(ca),
                               "--out", str(out), "--host", "127.0.0.1"])
    assert made.exit_code == 0, made.output
    shown = runner.invoke(app, ["pki", "show", str(out) + ".pem", "--json"])
    assert json.loads(shown.stdout)["identity"] == "urn:tierlink:control:control-1"
    node = runner.invoke(app, ["pki", "issue", "node", "dev-1", "--ca", str(ca),
                               "--out", str(tmp_path / "n")])
    assert node.exit_code != 0 and "enrollment" in node.output
