"""A node's identity: enrolled once, kept in its state directory, presented on every call.

``<state_dir>/identity.json`` (mode 0600) holds ``{"node_id", "secret", "control_url",
"enrolled_at"}``. A node that has one never enrolls again — restarts, a new address or a
spent enrollment token change nothing; one that has none enrolls with its spec's
``enroll_token`` (see :mod:`tierlink.control.identity` for the control plane's side).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tierlink.control.client import ControlClient
from tierlink.control.identity import NODE, bearer
from tierlink.errors import ConfigError

IDENTITY_FILE = "identity.json"


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    node_id: str
    secret: str
    control_url: str
    enrolled_at: float

    @property
    def authorization(self) -> str:
        return bearer(NODE, self.secret, self.node_id)


def load_identity(state_dir: Path) -> NodeIdentity | None:
    """The identity kept in ``state_dir``; None when the node never enrolled."""
    path = state_dir / IDENTITY_FILE
    if not path.exists():
        return None
    try:
        return NodeIdentity(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"node identity {path} is unreadable: {exc}",
                          hint="restore it from a backup, or revoke the node and enroll it "
                               "under a new id with a fresh state directory") from exc


def save_identity(state_dir: Path, identity: NodeIdentity) -> None:
    """Write ``identity.json`` atomically, readable by this user only."""
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / (IDENTITY_FILE + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w") as f:
        json.dump(asdict(identity), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state_dir / IDENTITY_FILE)
    dir_fd = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


async def ensure_identity(client: ControlClient, state_dir: Path, node_id: str, tier: str,
                          token: str | None) -> NodeIdentity | None:
    """Load this node's identity or enroll with ``token``; authorizes ``client`` with it.

    None (and ``client`` left unauthenticated) when the node has no identity and no token:
    an open control plane. Raises ConfigError when the state directory belongs to another
    node id, and the control plane's refusal (NotEnrolled-style ControlPlaneError) when
    enrollment fails."""
    identity = load_identity(state_dir)
    if identity is not None and identity.node_id != node_id:
        raise ConfigError(f"state directory {state_dir} belongs to node "
                          f"{identity.node_id!r}, not {node_id!r}",
                          hint="give each node its own state directory")
    if identity is None and token:
        secret = await client.enroll(token, node_id, tier)
        identity = NodeIdentity(node_id, secret, client.base_url, time.time())
        save_identity(state_dir, identity)
    if identity is not None:
        client.authorize(identity.authorization)
    return identity
