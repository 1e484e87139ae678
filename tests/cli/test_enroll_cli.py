"""``tierlink enroll token|list|revoke`` against a real control plane process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from tierlink.cli.main import app


def test_token_list_revoke(tmp_path: Path):
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierlink.control.server", "--port", "0", "--db",
         str(tmp_path / "r.db"), "--ready-file", str(ready), "--admin-token-file",
         str(tmp_path / "admin.token")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        url = f"http://127.0.0.1:{json.loads(ready.read_text())['port']}"
        admin = (tmp_path / "admin.token").read_text().strip()
        runner = CliRunner()
        env = {"TIERLINK_ADMIN_TOKEN": admin}

        refused = runner.invoke(app, ["enroll", "token", "--control", url],
                                env={"TIERLINK_ADMIN_TOKEN": "x" * 20})
        assert refused.exit_code == 2 and "wrong admin token" in refused.output

        made = runner.invoke(app, ["enroll", "token", "--control", url, "--uses", "1"], env=env)
        assert made.exit_code == 0, made.output
        token = made.output.strip()
        enrolled = httpx.post(f"{url}/v1/enroll", json={"token": token, "node_id": "dev-1",
                                                        "tier": "device"})
        assert enrolled.status_code == 200

        listed = runner.invoke(app, ["enroll", "list", "--control", url, "--json"], env=env)
        assert [n["node_id"] for n in json.loads(listed.output)] == ["dev-1"]
        assert runner.invoke(app, ["enroll", "revoke", "dev-1", "--control", url],
                             env=env).exit_code == 0
        again = runner.invoke(app, ["enroll", "revoke", "dev-1", "--control", url], env=env)
        assert again.exit_code == 2 and "already revoked" in again.output
        status = runner.invoke(app, ["status", url], env={})
        assert status.exit_code == 2 and "needs credentials" in status.output
        assert runner.invoke(app, ["status", url, "--json"], env=env).exit_code == 0
    finally:
        proc.terminate()
        proc.wait(10)
