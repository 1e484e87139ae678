"""Where tierlink keeps what it builds, imports and installs: ``$TIERLINK_HOME``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def tierlink_home(env: Mapping[str, str] | None = None) -> Path:
    """``$TIERLINK_HOME``, default ``~/.cache/tierlink`` (read when called, never at import)."""
    env = os.environ if env is None else env
    home = env.get("TIERLINK_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "tierlink"
