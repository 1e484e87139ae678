"""A node's identity: enroll once, keep it in the state directory, present it afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tierlink.control.app import create_app
from tierlink.control.client import ControlClient
from tierlink.control.identity import IdentityStore
from tierlink.control.store import SqliteRegistryStore
from tierlink.errors import ConfigError, ControlPlaneError
from tierlink.node.identity import IDENTITY_FILE, ensure_identity, load_identity

ADMIN = "admin-token-0123456789"


def _body(port: int) -> dict:
    return {"node_id": "dev-1", "tier": "device", "address": f"http://127.0.0.1:{port}",
            "started_at": float(port)}


def test_enroll_once_then_restart_with_a_new_address_keeps_the_id(tmp_path: Path):
    db = tmp_path / "r.db"
    registry, identity = SqliteRegistryStore(db), IdentityStore(db, ADMIN)
    token = identity.create_token(0.0, uses=1)
    transport = httpx.ASGITransport(app=create_app(registry, identity=identity))
    state = tmp_path / "state"

    async def scenario() -> None:
        async with ControlClient("http://control", transport=transport) as first:
            enrolled = await ensure_identity(first, state, "dev-1", "device", token)
            assert enrolled is not None
            answer = await first.heartbeat(_body(1001))
            assert answer["generation"] == 1
        assert (state / IDENTITY_FILE).stat().st_mode & 0o777 == 0o600
        # Restart: the token is used up, the identity file is what counts.
        async with ControlClient("http://control", transport=transport) as second:
            again = await ensure_identity(second, state, "dev-1", "device", token)
            assert again == enrolled
            answer = await second.heartbeat(_body(2002))  # a new address and incarnation
            assert answer["node_id"] == "dev-1" and answer["generation"] == 2
            nodes = await second.nodes()
            assert [n["address"] for n in nodes] == ["http://127.0.0.1:2002"]

    try:
        asyncio.run(scenario())
    finally:
        identity.close()
        registry.close()


def test_no_identity_no_token_stays_anonymous_and_is_refused(tmp_path: Path):
    db = tmp_path / "r.db"
    registry, identity = SqliteRegistryStore(db), IdentityStore(db, ADMIN)
    transport = httpx.ASGITransport(app=create_app(registry, identity=identity))

    async def scenario() -> None:
        async with ControlClient("http://control", transport=transport) as client:
            assert await ensure_identity(client, tmp_path / "s", "dev-1", "device", None) is None
            with pytest.raises(ControlPlaneError, match="401"):
                await client.heartbeat(_body(1))
            with pytest.raises(ControlPlaneError, match="unknown or revoked enrollment token"):
                await ensure_identity(client, tmp_path / "s", "dev-1", "device", "z" * 40)
            assert load_identity(tmp_path / "s") is None

    try:
        asyncio.run(scenario())
    finally:
        identity.close()
        registry.close()


def test_a_state_dir_belongs_to_one_node(tmp_path: Path):
    (tmp_path / IDENTITY_FILE).write_text(
        '{"node_id": "dev-1", "secret": "s", "control_url": "x", "enrolled_at": 0}')

    async def scenario() -> None:
        async with ControlClient("http://control") as client:
            with pytest.raises(ConfigError, match="belongs to node 'dev-1'"):
                await ensure_identity(client, tmp_path, "dev-2", "device", None)

    asyncio.run(scenario())
    (tmp_path / IDENTITY_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        load_identity(tmp_path)
