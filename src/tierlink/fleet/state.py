"""What of a running fleet (fleet/launcher.py's ``RunningFleet``) the launcher's helpers
— namespaces (netns_fleet.py), the Ray head (ray_fleet.py) — read and set: a Protocol,
so they need not import the launcher that imports them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Protocol

from tierlink.fleet.config import FleetConfig


class FleetState(Protocol):
    config: FleetConfig
    run_dir: Path
    procs: dict[str, subprocess.Popen[bytes]]
    throttles: list[Any]
    host: str  # where the root namespace's processes listen
    fabric: Any  # tierlink.netns.fabric.Fabric, or None
    reaper: subprocess.Popen[bytes] | None
    ray_address: str | None
