"""Tokens and credentials on etcd, so every control-plane replica authenticates every node.

Keys (under ``prefix``, default ``/tierlink/identity/``), JSON values, hashes only (as in
:class:`~tierlink.control.identity.IdentityStore`)::

    tokens/<sha256 of the token>        {created_at, expires_at, uses_left, note, revoked}
    credentials/<node id>               {secret_sha, tier, enrolled_at, revoked_at, token_sha}

Credentials are read on every call, so each replica mirrors them in memory through a watch
(a revocation reaches every replica within milliseconds); a node that enrolled at another
replica a moment ago is read from etcd once. An enrollment spends one use of its token and
writes the credential in one transaction: two replicas cannot both spend the last use, and
two enrollments under one id cannot both win.
"""

from __future__ import annotations

import json
from typing import Any

from tierlink.control.identity import (
    AlreadyEnrolled,
    Caller,
    Credential,
    identify,
    new_secret,
    sha,
)
from tierlink.errors import ConfigError, ControlPlaneError, NotEnrolled
from tierlink.etcd.client import Compare, Etcd, KeyValue, Op
from tierlink.etcd.mirror import Mirror

DEFAULT_PREFIX = "/tierlink/identity/"


class EtcdIdentityStore:
    """:class:`~tierlink.control.identity.Identity` on etcd; ``start()`` before use."""

    def __init__(self, etcd: Etcd, admin_token: str, *, prefix: str = DEFAULT_PREFIX) -> None:
        if len(admin_token) < 16:
            raise ConfigError("the admin token must be at least 16 characters",
                              hint="let `tierlink control` create one (--admin-token-file)")
        self.etcd = etcd
        self._admin_sha = sha(admin_token)
        self._tokens = prefix + "tokens/"
        self._credentials = Mirror(etcd, prefix + "credentials/")

    def start(self) -> EtcdIdentityStore:
        self._credentials.start()
        return self

    # -- operators -------------------------------------------------------------------------

    def create_token(self, now: float, *, ttl_s: float | None = None, uses: int | None = None,
                     note: str = "") -> str:
        if uses is not None and uses < 1:
            raise ConfigError(f"token uses must be >= 1, got {uses}")
        token = new_secret()
        self.etcd.put(self._tokens + sha(token), _dump({
            "created_at": now, "expires_at": None if ttl_s is None else now + ttl_s,
            "uses_left": uses, "note": note, "revoked": False}))
        return token

    def revoke(self, node_id: str, now: float) -> bool:
        for _ in range(5):
            kv = self._credential_kv(node_id)
            if kv is None:
                return False
            stored = json.loads(kv.value)
            if stored.get("revoked_at") is not None:
                return False
            stored["revoked_at"] = now
            held, revision = self.etcd.txn(
                [Compare(kv.key, "mod", kv.mod_revision)], [Op("put", kv.key, _dump(stored))])
            if held:
                self._credentials.note(KeyValue(kv.key, _dump(stored), revision))
                return True
        raise ControlPlaneError(f"could not revoke {node_id}: its credential kept changing",
                                hint="retry")

    def credentials(self) -> list[Credential]:
        out = []
        for node_id, kv in self._credentials.items():
            stored = json.loads(kv.value)
            out.append(Credential(node_id, stored["tier"], stored["enrolled_at"],
                                  stored.get("revoked_at")))
        return out

    # -- nodes -----------------------------------------------------------------------------

    def enroll(self, token: str, node_id: str, tier: str, now: float) -> str:
        if not node_id or ":" in node_id:
            raise NotEnrolled(f"invalid node id {node_id!r} (empty or containing ':')",
                              hint="pick another node id")
        secret = new_secret()
        key = self._credentials.prefix + node_id
        for _ in range(5):
            token_kv = self.etcd.get(self._tokens + sha(token))
            spent = _spend(token_kv, now)
            existing = self.etcd.get(key)
            if existing is not None:
                if json.loads(existing.value).get("revoked_at") is None:
                    raise AlreadyEnrolled(f"node {node_id!r} is already enrolled")
                raise NotEnrolled(f"node {node_id!r} was revoked; a revoked id cannot enroll "
                                  "again", hint="enroll the machine under a new node id")
            assert token_kv is not None
            credential = _dump({"secret_sha": sha(secret), "tier": tier, "enrolled_at": now,
                                "revoked_at": None, "token_sha": sha(token)})
            ops = [Op("put", key, credential)]
            if spent is not None:
                ops.append(Op("put", token_kv.key, spent))
            held, revision = self.etcd.txn(
                [Compare(token_kv.key, "mod", token_kv.mod_revision),
                 Compare(key, "version", 0)], ops)
            if held:
                self._credentials.note(KeyValue(key, credential, revision))
                return secret
        raise ControlPlaneError(f"could not enroll {node_id}: the token kept changing",
                                hint="retry the enrollment")

    # -- every call ------------------------------------------------------------------------

    def authenticate(self, header: str | None) -> Caller:
        return identify(header, self._admin_sha, self._credential)

    def _credential(self, node_id: str) -> tuple[str, float | None] | None:
        kv = self._credential_kv(node_id)
        if kv is None:
            return None
        stored = json.loads(kv.value)
        return stored["secret_sha"], stored.get("revoked_at")

    def close(self) -> None:
        self._credentials.close()

    def _credential_kv(self, node_id: str) -> KeyValue | None:
        """From the mirror; from etcd when the mirror has not heard of it yet."""
        kv = self._credentials.get(node_id)
        if kv is None:
            kv = self.etcd.get(self._credentials.prefix + node_id)
            if kv is not None:
                self._credentials.note(kv)
        return kv


def _spend(token_kv: KeyValue | None, now: float) -> bytes | None:
    """The token's value after one use (None: unlimited, nothing to write); NotEnrolled
    when it cannot be used."""
    if token_kv is None:
        raise NotEnrolled("unknown or revoked enrollment token")
    stored = json.loads(token_kv.value)
    if stored.get("revoked"):
        raise NotEnrolled("unknown or revoked enrollment token")
    if stored.get("expires_at") is not None and now > stored["expires_at"]:
        raise NotEnrolled("the enrollment token has expired",
                          hint="create a new one with `tierlink enroll token`")
    uses = stored.get("uses_left")
    if uses is None:
        return None
    if uses < 1:
        raise NotEnrolled("the enrollment token has been used up",
                          hint="create a new one with `tierlink enroll token`")
    stored["uses_left"] = uses - 1
    return _dump(stored)


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
