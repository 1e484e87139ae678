"""Node certificates from the fleet CA: ``POST /v1/certificate``.

A node that proved who it is (its bearer credential, from enrollment) sends a CSR and gets
a certificate naming *that* node and the tier it enrolled as — never a name from the CSR,
which only contributes its public key and the addresses the node serves on. Nodes call it
right after enrollment and again before their certificate expires (rotation without a
restart: see node/certificates.py). Certificates are short-lived (``cert_ttl_s``, a day by
default): a revoked node can no longer renew, and its last certificate runs out.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from tierlink.control.identity import NODE, Caller, Identity
from tierlink.errors import NotEnrolled
from tierlink.security.pki import Authority, CertIdentity

log = logging.getLogger(__name__)


class CertificateIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    csr: str = Field(min_length=64, max_length=16_384, description="PEM CSR (EC P-256)")


def install_certificate_routes(app: FastAPI, identity: Identity, authority: Authority,
                               clock: Any, cert_ttl_s: float) -> None:
    @app.post("/v1/certificate")
    async def certificate(body: CertificateIn, request: Request) -> dict[str, Any]:
        caller: Caller | None = getattr(request.state, "caller", None)
        if caller is None or caller.kind != NODE or caller.node_id is None:
            raise NotEnrolled("only an enrolled node gets a node certificate",
                              hint="present the node's credential (Bearer node:ID:SECRET); "
                                   "operators issue others with `tierlink pki issue`")
        tier = await asyncio.to_thread(_tier_of, identity, caller.node_id)
        who = CertIdentity("node", caller.node_id, tier)
        issued = authority.sign_csr(body.csr.encode(), who, clock(), cert_ttl_s)
        log.info("certificate %x issued to %s", issued.serial, who)
        return {"certificate": issued.cert_pem.decode(), "ca": authority.cert_pem.decode(),
                "serial": format(issued.serial, "x"), "not_after": issued.not_after}


def _tier_of(identity: Identity, node_id: str) -> str:
    for credential in identity.credentials():
        if credential.node_id == node_id and not credential.revoked:
            return credential.tier
    raise NotEnrolled(f"node {node_id!r} holds no valid credential")
