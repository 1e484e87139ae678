"""Node identity: enrollment tokens, node credentials, and who may call the control plane.

A node **enrolls** once with a token an operator created (``tierlink enroll token``): the
control plane answers with a secret, the node keeps ``{node_id, secret}`` in its state
directory (``identity.json``, mode 0600) and presents ``Authorization: Bearer
node:<node_id>:<secret>`` on every call afterwards. Its id therefore survives restarts and
address changes (the address is only a field of its heartbeats). An operator presents
``Bearer admin:<token>`` (the control plane's admin token file). Revoking a node makes every
call of it a 401 and drops it from the registry, so no node routes to it any more.

Only hashes are stored (sha256 of the token / secret; both are 256-bit random strings, so a
plain hash is enough — no password stretching needed). Tokens can be limited in uses and
lifetime. Time is injected (``now``) like everywhere in the control plane.

Tables (in the control plane's SQLite file, created if absent, no schema version of their
own — the registry owns ``PRAGMA user_version``)::

    enrollment_tokens(token_sha, created_at, expires_at, uses_left, note, revoked)
    node_credentials(node_id, secret_sha, tier, enrolled_at, revoked_at, token_sha)
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tierlink.errors import ConfigError, NotEnrolled, TierlinkError

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS enrollment_tokens (
        token_sha  TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        expires_at REAL,               -- NULL: never
        uses_left  INTEGER,            -- NULL: unlimited
        note       TEXT NOT NULL DEFAULT '',
        revoked    INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE IF NOT EXISTS node_credentials (
        node_id     TEXT PRIMARY KEY,
        secret_sha  TEXT NOT NULL,
        tier        TEXT NOT NULL,
        enrolled_at REAL NOT NULL,
        revoked_at  REAL,              -- NULL: valid
        token_sha   TEXT NOT NULL
    )""",
)

ADMIN, NODE = "admin", "node"


class AlreadyEnrolled(NotEnrolled):
    """A second enrollment under an id that holds a valid credential (409)."""

    code = "already_enrolled"
    http_status = 409
    hint = ("the node's state directory (identity.json) holds its secret; to replace a lost "
            "one, revoke the node (`tierlink enroll revoke ID`) and enroll under a new id")


class AdminRequired(NotEnrolled):
    code = "admin_required"
    http_status = 403
    hint = "send Authorization: Bearer admin:<token> (the control plane's --admin-token-file)"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a control-plane call."""

    kind: str  # ADMIN | NODE
    node_id: str | None = None


@dataclass(frozen=True, slots=True)
class Credential:
    node_id: str
    tier: str
    enrolled_at: float
    revoked_at: float | None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


def new_secret() -> str:
    """A 256-bit random string, URL-safe."""
    return secrets.token_urlsafe(32)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def bearer(kind: str, secret: str, node_id: str | None = None) -> str:
    """The ``Authorization`` header value for a node or an operator."""
    return f"Bearer node:{node_id}:{secret}" if kind == NODE else f"Bearer admin:{secret}"


def parse_bearer(header: str | None) -> tuple[str, str | None, str]:
    """``(kind, node_id, secret)`` from an ``Authorization`` header; NotEnrolled if absent
    or malformed."""
    if not header or not header.startswith("Bearer "):
        raise NotEnrolled("this control plane needs credentials: no 'Authorization: Bearer "
                          "...' header")
    value = header[len("Bearer "):].strip()
    kind, _, rest = value.partition(":")
    if kind == ADMIN and rest:
        return ADMIN, None, rest
    if kind == NODE:
        node_id, sep, secret = rest.rpartition(":")
        if sep and node_id and secret:
            return NODE, node_id, secret
    raise NotEnrolled("malformed Authorization header: expected 'Bearer node:<id>:<secret>' "
                      "or 'Bearer admin:<token>'")


class Identity(Protocol):
    """Where tokens and credentials live: :class:`IdentityStore` (SQLite) or
    :class:`~tierlink.control.etcd_identity.EtcdIdentityStore` (shared by replicas)."""

    def create_token(self, now: float, *, ttl_s: float | None = None, uses: int | None = None,
                     note: str = "") -> str: ...

    def revoke(self, node_id: str, now: float) -> bool: ...

    def credentials(self) -> list[Credential]: ...

    def enroll(self, token: str, node_id: str, tier: str, now: float) -> str: ...

    def authenticate(self, header: str | None) -> Caller: ...

    def close(self) -> None: ...


class IdentityStore:
    """Tokens and credentials in SQLite (WAL), thread-safe. ``admin_token`` (plain text,
    compared in constant time) authorises operators."""

    def __init__(self, path: str | Path, admin_token: str) -> None:
        if len(admin_token) < 16:
            raise ConfigError("the admin token must be at least 16 characters",
                              hint="let `tierlink control` create one (--admin-token-file)")
        self.path = str(path)
        self._admin_sha = sha(admin_token)
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(self.path, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA busy_timeout=2000")
            with self._conn:
                for statement in _SCHEMA:
                    self._conn.execute(statement)
        except sqlite3.Error as exc:
            raise TierlinkError(f"cannot open the identity tables in {self.path}: {exc}",
                                hint="check the --db path and its permissions") from exc

    # -- operators -------------------------------------------------------------------------

    def create_token(self, now: float, *, ttl_s: float | None = None, uses: int | None = None,
                     note: str = "") -> str:
        """A new enrollment token (shown once; only its hash is kept)."""
        if uses is not None and uses < 1:
            raise ConfigError(f"token uses must be >= 1, got {uses}")
        token = new_secret()
        expires = None if ttl_s is None else now + ttl_s
        with self._lock, self._conn:
            self._conn.execute(
                "INSERT INTO enrollment_tokens (token_sha, created_at, expires_at, uses_left,"
                " note) VALUES (?, ?, ?, ?, ?)", (sha(token), now, expires, uses, note))
        return token

    def revoke(self, node_id: str, now: float) -> bool:
        """Revoke a node's credential; False when it was not enrolled (or already revoked)."""
        with self._lock, self._conn:
            cursor = self._conn.execute(
                "UPDATE node_credentials SET revoked_at = ? WHERE node_id = ?"
                " AND revoked_at IS NULL", (now, node_id))
        return cursor.rowcount > 0

    def credentials(self) -> list[Credential]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT node_id, tier, enrolled_at, revoked_at FROM node_credentials"
                " ORDER BY node_id").fetchall()
        return [Credential(*row) for row in rows]

    # -- nodes -----------------------------------------------------------------------------

    def enroll(self, token: str, node_id: str, tier: str, now: float) -> str:
        """Spend one use of ``token`` and return a new secret for ``node_id``."""
        if not node_id or ":" in node_id:
            raise NotEnrolled(f"invalid node id {node_id!r} (empty or containing ':')",
                              hint="pick another node id")
        secret = new_secret()
        with self._lock, self._conn:
            self._spend(token, now)
            row = self._conn.execute("SELECT revoked_at FROM node_credentials WHERE"
                                     " node_id = ?", (node_id,)).fetchone()
            if row is not None:
                if row[0] is None:
                    raise AlreadyEnrolled(f"node {node_id!r} is already enrolled")
                raise NotEnrolled(f"node {node_id!r} was revoked; a revoked id cannot enroll "
                                  "again", hint="enroll the machine under a new node id")
            self._conn.execute(
                "INSERT INTO node_credentials (node_id, secret_sha, tier, enrolled_at,"
                " token_sha) VALUES (?, ?, ?, ?, ?)",
                (node_id, sha(secret), tier, now, sha(token)))
        return secret

    def _spend(self, token: str, now: float) -> None:
        row = self._conn.execute(
            "SELECT expires_at, uses_left, revoked FROM enrollment_tokens WHERE token_sha = ?",
            (sha(token),)).fetchone()
        if row is None or row[2]:
            raise NotEnrolled("unknown or revoked enrollment token")
        expires_at, uses_left, _ = row
        if expires_at is not None and now > expires_at:
            raise NotEnrolled("the enrollment token has expired",
                              hint="create a new one with `tierlink enroll token`")
        if uses_left is not None:
            if uses_left < 1:
                raise NotEnrolled("the enrollment token has been used up",
                                  hint="create a new one with `tierlink enroll token`")
            self._conn.execute("UPDATE enrollment_tokens SET uses_left = uses_left - 1"
                               " WHERE token_sha = ?", (sha(token),))

    # -- every call ------------------------------------------------------------------------

    def authenticate(self, header: str | None) -> Caller:
        """Who sent this ``Authorization`` header; NotEnrolled (401) otherwise."""
        return identify(header, self._admin_sha, self._credential)

    def _credential(self, node_id: str) -> tuple[str, float | None] | None:
        with self._lock:
            row = self._conn.execute("SELECT secret_sha, revoked_at FROM node_credentials"
                                     " WHERE node_id = ?", (node_id,)).fetchone()
        return None if row is None else (row[0], row[1])

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def identify(header: str | None, admin_sha: str,
             credential: Callable[[str], tuple[str, float | None] | None]) -> Caller:
    """Who sent this ``Authorization`` header, whichever store holds the credentials:
    ``credential(node_id)`` gives ``(secret_sha, revoked_at)`` or None. NotEnrolled (401)
    for a wrong admin token, an unknown node, a wrong secret or a revoked node."""
    kind, node_id, secret = parse_bearer(header)
    if kind == ADMIN:
        if not hmac.compare_digest(sha(secret), admin_sha):
            raise NotEnrolled("wrong admin token")
        return Caller(ADMIN)
    assert node_id is not None
    stored = credential(node_id)
    if stored is None or not hmac.compare_digest(stored[0], sha(secret)):
        raise NotEnrolled(f"node {node_id!r} is not enrolled (unknown id or wrong secret)")
    if stored[1] is not None:
        raise NotEnrolled(f"node {node_id!r} has been revoked",
                          hint="an operator revoked this node; enroll it under a new id")
    return Caller(NODE, node_id)


def admin_only(caller: Caller) -> None:
    if caller.kind != ADMIN:
        raise AdminRequired(f"node {caller.node_id!r} may not call an operator endpoint")


def same_node(caller: Caller, node_id: str) -> None:
    """A node may act only as itself (operators may act for any node)."""
    if caller.kind == NODE and caller.node_id != node_id:
        raise AdminRequired(f"node {caller.node_id!r} may not act as node {node_id!r}")


def load_or_create_admin_token(path: Path) -> str:
    """The admin token in ``path``, created (mode 0600) when the file does not exist."""
    if path.exists():
        token = path.read_text().strip()
        if len(token) < 16:
            raise ConfigError(f"admin token file {path} holds fewer than 16 characters",
                              hint="delete it to let the control plane create a new one")
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = new_secret()
    fd = _create_private(path)
    with open(fd, "w") as f:
        f.write(token + "\n")
    return token


def _create_private(path: Path) -> int:
    import os

    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)


OPEN, ANY, ADMIN_ONLY, SELF = "open", "any", "admin", "self"
# /ui: the fleet view's page, which carries no data (it asks for the operator token).
_OPEN_PATHS = ("/healthz", "/metrics", "/v1/enroll", "/docs", "/openapi.json", "/ui", "/ui/")
_ADMIN_PREFIXES = ("/v1/enrollment-tokens", "/v1/credentials", "/v1/rollouts", "/v1/fleet")
_ADMIN_WRITES = ("/v1/blobs", "/v1/models", "/v1/routing")


def access_rule(method: str, path: str) -> tuple[str, str | None]:
    """Who may call ``method path``: ``(OPEN | ANY | ADMIN_ONLY | SELF, node_id)``.

    Reads of the registry and the repository: any enrolled node or an operator. Publishing,
    rollouts, tokens, credentials, hard-example and result reads: operators. A node's heartbeat and
    deregistration: that node (or an operator)."""
    if path in _OPEN_PATHS:
        return OPEN, None
    if path.startswith(_ADMIN_PREFIXES):
        return ADMIN_ONLY, None
    if path.startswith(_ADMIN_WRITES) and method not in ("GET", "HEAD"):
        return ADMIN_ONLY, None
    if path.startswith(("/v1/hard-examples", "/v1/results")) and method == "GET":
        return ADMIN_ONLY, None  # user inputs and answers: for operators, not other nodes
    parts = path.strip("/").split("/")
    if parts[:2] == ["v1", "nodes"] and parts[3:] == ["drain"]:
        return ADMIN_ONLY, None
    if len(parts) >= 3 and parts[:2] == ["v1", "nodes"] and (
            method == "DELETE" or parts[3:] == ["heartbeat"]):
        return SELF, parts[2]
    return ANY, None


def authorize(store: Identity, method: str, path: str, header: str | None) -> Caller | None:
    """Check one call against :func:`access_rule`; None for open paths. Raises NotEnrolled
    (401) or AdminRequired (403)."""
    rule, node_id = access_rule(method, path)
    if rule == OPEN:
        return None
    caller = store.authenticate(header)
    if rule == ADMIN_ONLY:
        admin_only(caller)
    elif rule == SELF and node_id is not None:
        same_node(caller, node_id)
    return caller
