"""A node's certificate keeper: it gets a certificate when it has none, keeps a usable one
across restarts, renews at two thirds of its life into the same contexts, and keeps the
old certificate while renewals fail."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tierlink.core.types import Tier
from tierlink.errors import ControlPlaneError
from tierlink.node.certificates import NodeTls
from tierlink.node.spec import NodeSpec
from tierlink.security.pki import Authority, CertIdentity


class Source:
    """The control plane's certificate route, over a real CA."""

    def __init__(self, ca: Authority, ttl_s: float) -> None:
        self.ca, self.ttl_s, self.calls, self.down = ca, ttl_s, 0, False

    async def certificate(self, csr: bytes) -> dict[str, Any]:
        self.calls += 1
        if self.down:
            raise ControlPlaneError("control plane unreachable")
        issued = self.ca.sign_csr(csr, CertIdentity("node", "dev-1", "device"), time.time(),
                                  self.ttl_s)
        return {"certificate": issued.cert_pem.decode()}


async def until(check: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.05)


def spec(tmp_path: Path) -> NodeSpec:
    ca = Authority.create("t", time.time())
    ca.save(tmp_path / "ca")
    return NodeSpec(node_id="dev-1", tier=Tier.DEVICE, models=(),
                    control_url="https://127.0.0.1:9", state_dir=str(tmp_path / "state"),
                    tls_ca=str(tmp_path / "ca" / "ca.pem"))


def test_a_node_gets_a_certificate_once_and_keeps_it_across_restarts(tmp_path: Path) -> None:
    s = spec(tmp_path)
    source = Source(Authority.load(tmp_path / "ca"), 3600.0)
    first = NodeTls(s)
    asyncio.run(first.ensure(source))
    assert source.calls == 1 and first.facts["identity"] == "urn:tierlink:node:device:dev-1"
    again = NodeTls(s)
    asyncio.run(again.ensure(source))  # a restart: the kept certificate is still good
    assert source.calls == 1 and again.facts["serial"] == first.facts["serial"]
    assert again.server is not None


def test_certificates_renew_into_the_same_contexts(tmp_path: Path) -> None:
    s = spec(tmp_path)
    source = Source(Authority.load(tmp_path / "ca"), 1.5)
    keeper = NodeTls(s)

    async def main() -> None:
        await keeper.ensure(source)
        server, client, serial = keeper.server, keeper.client, keeper.facts["serial"]
        task = asyncio.create_task(keeper.run(source))
        await until(lambda: keeper.renewals >= 1)  # at ~1.1 s (2/3 of 1.65 s)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert keeper.renewals >= 1 and keeper.facts["serial"] != serial
        assert keeper.server is server and keeper.client is client  # reloaded in place
    asyncio.run(main())


def test_a_failed_renewal_keeps_the_old_certificate_and_retries(tmp_path: Path) -> None:
    s = spec(tmp_path)
    source = Source(Authority.load(tmp_path / "ca"), 1.5)
    keeper = NodeTls(s)

    async def main() -> None:
        await keeper.ensure(source)
        serial = keeper.facts["serial"]
        source.down = True
        task = asyncio.create_task(keeper.run(source))
        await until(lambda: keeper.failures >= 1)
        assert keeper.facts["serial"] == serial and keeper.renewals == 0
        source.down = False
        await until(lambda: keeper.renewals >= 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert keeper.renewals >= 1 and keeper.facts["serial"] != serial
    asyncio.run(main())
