"""Every OpenAPI document a fleet serves (node, control plane, link emulator, chat)
describes the body of every route that takes one -- the OIP inference request included --
so a generated client or a fuzzer learns what to send; and no two operations share an id."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from tierlink.chat.routes import install_chat_routes
from tierlink.chat.service import ChatService
from tierlink.control.app import create_app as control_app
from tierlink.control.identity import IdentityStore
from tierlink.control.store import SqliteRegistryStore
from tierlink.core.types import Tier
from tierlink.netem.server import LinkEmulator, create_control_app
from tierlink.node.app import create_app as node_app
from tierlink.node.inbox_routes import install_inbox_routes
from tierlink.node.service import NodeService
from tierlink.node.spec import NodeSpec
from tierlink.repo.blobs import BlobStore
from tierlink.repo.service import RepositoryService
from tierlink.repo.store import SqliteVersionStore

# Routes that take no body: what they act on is in the path or the query.
BODILESS = {"/v1/nodes/{node_id}/drain", "/v1/credentials/{node_id}/revoke",
            "/tierlink/v1/splits/{name}/open"}


def documents(tmp_path: Path) -> dict[str, dict[str, Any]]:
    db = tmp_path / "control.db"
    registry, identity = SqliteRegistryStore(db), IdentityStore(db, "admin-token-0123456789")
    repo = RepositoryService(SqliteVersionStore(db), BlobStore(tmp_path / "blobs"))
    node = node_app(NodeService(NodeSpec("dev-1", Tier.DEVICE, ()), {}))
    install_inbox_routes(node, None)  # type: ignore[arg-type]  # only its document is read
    chat = FastAPI()
    install_chat_routes(chat, ChatService("dev-1", Tier.DEVICE, {}, {}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI warns of a duplicate operation id
        docs = {"control": control_app(registry, identity=identity, repository=repo).openapi(),
                "node": node.openapi(), "chat": chat.openapi(),
                "link emulator": create_control_app(LinkEmulator([])).openapi()}
    identity.close()
    registry.close()
    return docs


def test_every_route_that_takes_a_body_describes_it(tmp_path: Path) -> None:
    missing = [f"{name}: {method.upper()} {path}"
               for name, doc in documents(tmp_path).items()
               for path, ops in doc["paths"].items() for method, op in ops.items()
               if method in ("post", "put", "patch") and "requestBody" not in op
               and path not in BODILESS]
    assert missing == []


def test_the_inference_request_is_the_oip_one_in_json_and_binary(tmp_path: Path) -> None:
    op = documents(tmp_path)["node"]["paths"]["/v2/models/{name}/infer"]["post"]
    content = op["requestBody"]["content"]
    schema = content["application/json"]["schema"]
    assert schema["required"] == ["inputs"]
    tensor = schema["properties"]["inputs"]["items"]
    assert set(tensor["required"]) == {"name", "shape", "datatype"}
    assert "FP32" in tensor["properties"]["datatype"]["enum"]
    assert content["application/octet-stream"]["schema"]["format"] == "binary"
    batch = documents(tmp_path)["control"]["paths"]["/v1/results"]["post"]["requestBody"]
    assert batch["content"]["application/json"]["schema"]["required"] == ["from", "items"]
