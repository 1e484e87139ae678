"""Helpers for the TLS tests: a fleet CA in a folder and the pairs it issues."""

from __future__ import annotations

import time
from pathlib import Path

from tierlink.security.pki import Authority, CertIdentity, write_file
from tierlink.security.tls import TlsFiles


class Pki:
    def __init__(self, root: Path) -> None:
        self.root, self.ca = root, Authority.create("test", time.time())
        self.ca.save(root / "ca")

    def pair(self, identity: CertIdentity, name: str, ca: Authority | None = None) -> TlsFiles:
        key, issued = (ca or self.ca).issue_pair(identity, ("127.0.0.1",), time.time(), 600)
        write_file(self.root / f"{name}.key", key, 0o600)
        write_file(self.root / f"{name}.pem", issued.cert_pem, 0o644)
        return TlsFiles(self.root / "ca" / "ca.pem", self.root / f"{name}.pem",
                        self.root / f"{name}.key")

    @property
    def trust_only(self) -> TlsFiles:
        return TlsFiles(self.root / "ca" / "ca.pem")
