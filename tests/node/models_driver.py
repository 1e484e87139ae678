"""The crash driver of test_models_crash.py, run as a subprocess::

    python models_driver.py TMP KILL_AT VERSION

A node's model manager (base version 1 from ``TMP/base``, state in ``TMP/state``, the fake
repository ``TMP/repo``, trusted key in ``TMP/trusted.txt``) recovers, is asked to serve
``VERSION`` as its active version, and SIGKILLs itself at ``KILL_AT``: a phase of
:data:`tierlink.node.slots.PHASES` or :data:`tierlink.node.models.PHASES`, ``download``
(half of model.onnx written) or ``none`` (runs to the end, prints the version it serves and
exits 0).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from models_support import NAME, FakeSource, base_runtime

from tierlink.node.models import ModelManager


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def main(tmp: Path, kill_at: str, version: str) -> None:
    installing = False  # the kill is for the install, not for loading the active version

    def hook(phase: str) -> None:
        if installing and phase == kill_at:
            _die()

    source = FakeSource(tmp / "repo", mid_download=_die if kill_at == "download" else None)
    models = ModelManager({NAME: base_runtime(tmp / "base")}, state_dir=tmp / "state",
                          trusted_keys=((tmp / "trusted.txt").read_text().strip(),),
                          source=source, hook=hook)
    await models.recover()
    installing = True
    await models.apply_desired({NAME: {"version": version, "weight": 1.0}})
    await models.wait_idle()
    print(models.active[NAME].info.version, models.failures())


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
