"""kill -9 at any point of a model install leaves the node serving its last good version.

Each case starts a node's model manager in a subprocess (``models_driver.py``) that is
asked to make a version active and SIGKILLs itself at a named point of the install
(download, seal, verify, load, switch). A fresh manager then recovers, as the restarted node
would: before the switch it serves the old version, after it the new one; a kill while
loading records the version as failed (it is never retried while the control plane keeps
asking for it); otherwise asking again completes the install.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from models_support import NAME, FakeSource, base_runtime, publish, trusted

from tierlink.node.models import ModelManager

DRIVER = Path(__file__).with_name("models_driver.py")

# kill point -> (version served after the restart, whether version 3 is a failure now)
OVER_A_SLOT = {  # version 2 active in slot A; the driver installs version 3
    "download": ("2", False),     # half of model.onnx written
    "clearing": ("2", False),     # the inactive slot's marker removed, not its files
    "downloaded": ("2", False),   # both files written, not sealed
    "sealing": ("2", False),      # files + manifest fsynced, no complete marker
    "sealed": ("2", False),       # complete marker, not verified
    "verified": ("2", False),
    "loading": ("2", True),       # attempt marker written: the load "crashed" the node
    "loaded": ("2", False),       # loaded and warmed up, marker removed, not switched
    "switch_tmp": ("2", False),   # new active.json in its tmp file, not renamed
    "switched": ("3", False),
    "none": ("3", False),         # no kill: the install completes
}


def prepare(tmp: Path) -> ModelManager:
    """Base version 1; versions 2 and 3 in the repository; 2 installed and active."""
    key = Ed25519PrivateKey.generate()
    (tmp / "trusted.txt").write_text(trusted(key)[0])
    for version in ("2", "3"):
        publish(tmp / "repo", key, version)
    return manager(tmp)


def manager(tmp: Path) -> ModelManager:
    return ModelManager({NAME: base_runtime(tmp / "base")}, state_dir=tmp / "state",
                        trusted_keys=((tmp / "trusted.txt").read_text().strip(),),
                        source=FakeSource(tmp / "repo"))


async def restart(tmp: Path, version: str | None = None) -> ModelManager:
    """A fresh manager recovered from disk (asked for ``version`` afterwards, if given)."""
    models = manager(tmp)
    await models.recover()
    if version is not None:
        await models.apply_desired({NAME: {"version": version, "weight": 1.0}})
        await models.wait_idle()
    return models


def run_driver(tmp: Path, kill_at: str, version: str) -> int:
    done = subprocess.run([sys.executable, str(DRIVER), str(tmp), kill_at, version],
                          capture_output=True, timeout=120, check=False)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr.decode()[-2000:]
    return done.returncode


@pytest.mark.parametrize("kill_at", list(OVER_A_SLOT))
def test_kill_during_an_install_leaves_the_last_good_version(tmp_path: Path,
                                                             kill_at: str) -> None:
    models = prepare(tmp_path)

    async def install_2() -> None:
        await models.recover()
        await models.apply_desired({NAME: {"version": "2", "weight": 1.0}})
        await models.wait_idle()
        assert models.active[NAME].info.version == "2"

    asyncio.run(install_2())
    rc = run_driver(tmp_path, kill_at, "3")
    assert rc == (0 if kill_at == "none" else -signal.SIGKILL)

    version, failed = OVER_A_SLOT[kill_at]
    after = asyncio.run(restart(tmp_path))
    assert after.active[NAME].info.version == version
    assert ("3" in after.failures().get(NAME, {})) == failed
    assert not list((tmp_path / "state").rglob("*.tmp")) and \
        not list((tmp_path / "state").rglob("*.part"))

    # The control plane keeps asking for version 3: a crashed load is not retried, any
    # other interrupted install completes.
    again = asyncio.run(restart(tmp_path, "3"))
    assert again.active[NAME].info.version == ("2" if failed else "3")


@pytest.mark.parametrize("kill_at, version", [("loading", "1"), ("switch_tmp", "1"),
                                              ("switched", "2")])
def test_kill_during_the_first_install_over_the_base_version(tmp_path: Path, kill_at: str,
                                                             version: str) -> None:
    prepare(tmp_path)
    assert run_driver(tmp_path, kill_at, "2") == -signal.SIGKILL
    after = asyncio.run(restart(tmp_path))
    assert after.active[NAME].info.version == version
    assert ("2" in after.failures().get(NAME, {})) == (kill_at == "loading")
