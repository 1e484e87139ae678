"""ModelManager: versions per model on a node -- weighted pick, pins, installs through A/B
slots from a (fake) repository with real signatures and real ONNX graphs, failures,
restarts -- and the node service on top of it (answers per version, heartbeats)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from models_support import NAME, FakeSource, base_runtime, publish, tamper, trusted, winner

from tierlink.control.client import ControlClient, HeartbeatLoop
from tierlink.control.schemas import Heartbeat
from tierlink.core.types import Tier
from tierlink.models.runtime import ModelRuntime
from tierlink.node.app import create_app
from tierlink.node.models import (
    START_CRASH_LIMIT,
    Attempt,
    Desired,
    ModelManager,
    _StateFiles,
    parse_desired,
)
from tierlink.node.service import NodeService
from tierlink.node.slots import SlotManager, SlotVersions
from tierlink.node.spec import NodeSpec
from tierlink.transport import oip


@dataclass
class World:
    """A node's base version 1, a repository with versions 2 and 3, a state directory."""

    tmp: Path
    key: Ed25519PrivateKey
    base: ModelRuntime
    source: FakeSource

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    @property
    def repo(self) -> Path:
        return self.tmp / "repo"

    def manager(self, **kwargs: Any) -> ModelManager:
        kwargs.setdefault("trusted_keys", trusted(self.key))
        kwargs.setdefault("state_dir", self.state)
        return ModelManager({NAME: self.base}, source=self.source, **kwargs)

    def slots(self) -> SlotVersions:
        return SlotManager(self.state, lambda files: None).versions(NAME)


@pytest.fixture
def world(tmp_path: Path) -> World:
    key = Ed25519PrivateKey.generate()
    for version in ("2", "3"):
        publish(tmp_path / "repo", key, version)
    return World(tmp_path, key, base_runtime(tmp_path / "base"), FakeSource(tmp_path / "repo"))


def want(version: str, weight: float = 1.0) -> dict[str, Any]:
    return {NAME: {"version": version, "weight": weight}}


async def converge(mm: ModelManager, desired: Any) -> None:
    await mm.apply_desired(desired)
    await mm.wait_idle()


def served(mm: ModelManager) -> list[tuple[str, str, float]]:
    return [(s.version, s.role, round(s.weight, 6)) for s in mm.served()]


def version_of(rt: ModelRuntime | None) -> str:
    assert rt is not None
    return rt.info.version


def answer(rt: ModelRuntime | None) -> int:
    """The class a runtime picks (each test version has its own)."""
    assert rt is not None
    logits = rt.infer({"input": np.zeros((1, 1, 28, 28), np.float32)})["logits"]
    return int(logits.argmax())


async def started(world: World, *desired: dict[str, Any], **kwargs: Any) -> ModelManager:
    mm = world.manager(**kwargs)
    await mm.recover()
    for d in desired:
        await converge(mm, d)
    return mm


# -- picking a version ----------------------------------------------------------------------


def test_weighted_pick_follows_the_standby_weight(world: World) -> None:
    mm = asyncio.run(started(world, want("2", 0.25)))
    assert served(mm) == [("1", "active", 0.75), ("2", "standby", 0.25)]
    rng = random.Random(7)
    picks = Counter(version_of(mm.pick(NAME, None, rng)) for _ in range(20_000))
    assert abs(picks["2"] / 20_000 - 0.25) < 0.015
    assert set(picks) == {"1", "2"}


def test_a_pinned_request_gets_exactly_its_version_or_nothing(world: World) -> None:
    mm = asyncio.run(started(world, want("2", 0.01)))
    rng = random.Random(0)
    assert answer(mm.pick(NAME, "2", rng)) == winner("2")  # the 1% canary, every time
    assert answer(mm.pick(NAME, "1", rng)) == winner("1")
    assert mm.pick(NAME, "3", rng) is None
    assert mm.pick("other", None, rng) is None
    assert mm.versions(NAME) == ("1", "2")
    assert mm.runtime(NAME) is world.base


# -- installs, switches, rollbacks ----------------------------------------------------------


def test_install_canary_promote_and_roll_back(world: World) -> None:
    async def scenario() -> None:
        mm = await started(world)
        await converge(mm, want("2", 0.1))  # downloaded, verified, loaded, warmed up: standby
        assert served(mm) == [("1", "active", 0.9), ("2", "standby", 0.1)]
        assert world.slots() == SlotVersions(active_slot=None, active=None, standby="2")
        assert mm.active[NAME] is world.base

        await converge(mm, want("2"))  # promoted: the standby's slot becomes active
        assert served(mm) == [("2", "active", 1.0)]
        assert answer(mm.active[NAME]) == winner("2")
        assert world.slots() == SlotVersions(active_slot="A", active="2", standby=None)

        await converge(mm, want("3", 0.5))
        await converge(mm, want("3"))
        assert served(mm) == [("3", "active", 1.0)]
        assert world.slots() == SlotVersions(active_slot="B", active="3", standby="2")
        assert world.source.downloads == 2

        await converge(mm, want("2"))  # rollback: switch back, nothing downloaded
        assert served(mm) == [("2", "active", 1.0)] and world.source.downloads == 2
        assert world.slots().active == "2"

        await converge(mm, want("1"))  # back to the base version (the spec's files)
        assert served(mm) == [("1", "active", 1.0)] and mm.active[NAME] is world.base
        assert dict(mm.installs) == {(NAME, "ok"): 3} and mm.failures() == {}

    asyncio.run(scenario())


def test_the_base_version_can_be_a_canary_and_the_active_version_stays(world: World) -> None:
    async def scenario() -> None:
        mm = await started(world, want("2"))
        await mm.apply_desired(want("1", 0.3))  # memory only: no background work
        assert served(mm) == [("2", "active", 0.7), ("1", "standby", 0.3)]
        await mm.apply_desired(want("1", 0.6))
        assert served(mm) == [("2", "active", 0.4), ("1", "standby", 0.6)]
        await converge(mm, want("1"))
        assert served(mm) == [("1", "active", 1.0)]

    asyncio.run(scenario())


def test_rolling_back_to_the_base_survives_a_restart_until_the_next_switch(
        world: World) -> None:
    async def scenario() -> None:
        mm = await started(world, want("2"), want("3"), want("1"))
        assert world.slots().active == "3"  # on disk, yet pinned to the base
        again = await started(world)
        assert served(again) == [("1", "active", 1.0)] and again.active[NAME] is world.base

        await converge(again, want("3"))  # loaded from its slot, switched: the pin is stale
        assert world.source.downloads == 2
        after = await started(world)
        assert served(after) == [("3", "active", 1.0)]
        del mm

    asyncio.run(scenario())


def test_a_version_installed_while_desired_moved_on_is_not_served(world: World) -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        download = world.source.download_version

        async def slow(signed: Any, dest: Path) -> None:
            await gate.wait()
            await download(signed, dest)

        world.source.download_version = slow  # type: ignore[method-assign]
        mm = await started(world)
        await mm.apply_desired(want("2"))
        await mm.apply_desired(want("2"))  # the install in progress is not restarted
        while mm.busy is None:
            await asyncio.sleep(0.001)
        await mm.apply_desired(want("1"))  # rolled back before the install finished
        gate.set()
        await mm.wait_idle()
        assert served(mm) == [("1", "active", 1.0)]
        assert world.source.downloads == 1 and world.source.manifests == 1
        assert world.slots() == SlotVersions(active_slot=None, active=None, standby="2")

    asyncio.run(scenario())


# -- failures -------------------------------------------------------------------------------


def test_a_tampered_artifact_is_refused_reported_and_not_retried(world: World) -> None:
    tamper(world.repo / "2" / "model.onnx")

    async def scenario() -> None:
        mm = await started(world, want("2", 0.1))
        assert served(mm) == [("1", "active", 1.0)]  # the node keeps serving
        failure = mm.failures()[NAME]["2"]
        assert failure.startswith("artifact_rejected:") and "does not match" in failure
        assert world.slots() == SlotVersions(active_slot=None, active=None, standby=None)

        await converge(mm, want("2", 0.1))  # asked again: not retried
        await converge(mm, want("2", 0.2))
        assert world.source.downloads == 1 and mm.installs[(NAME, "rejected")] == 1

        restarted = await started(world)  # failures survive a restart...
        assert restarted.failures() == mm.failures()
        await converge(mm, want("1"))  # ...until desired stops asking for the version
        assert mm.failures() == {}
        assert json.loads((world.state / "models" / "failures.json").read_text()) == {}

    asyncio.run(scenario())


@pytest.mark.parametrize("keys", ["another key", "none"])
def test_a_version_not_signed_by_a_trusted_key_is_refused(world: World, keys: str) -> None:
    trust = trusted(Ed25519PrivateKey.generate()) if keys == "another key" else ()
    mm = asyncio.run(started(world, want("2"), trusted_keys=trust))
    assert served(mm) == [("1", "active", 1.0)]
    assert mm.failures()[NAME]["2"].startswith("artifact_rejected:")


def test_a_version_that_does_not_fit_the_served_model_is_refused(world: World) -> None:
    publish(world.repo, world.key, "4", task="other-task")
    mm = asyncio.run(started(world, want("4", 0.5)))
    assert served(mm) == [("1", "active", 1.0)]
    assert "is for task 'other-task'" in mm.failures()[NAME]["4"]
    assert world.slots().standby == "4"  # sealed and verified, but never served


def test_an_unknown_version_is_a_failure(world: World) -> None:
    mm = asyncio.run(started(world, want("9")))
    assert mm.failures()[NAME]["9"].startswith("repository_error:")
    assert mm.installs[(NAME, "failed")] == 1


def test_a_load_that_killed_the_process_is_recorded_and_never_retried(world: World) -> None:
    async def scenario() -> None:
        await started(world, want("2"))
        # What a kill -9 while loading version 3 leaves (test_models_crash.py does it for real).
        _StateFiles(world.state).mark_attempt(NAME, Attempt("3"))
        mm = await started(world, want("3"))
        assert served(mm) == [("2", "active", 1.0)]
        assert "died while loading version 3" in mm.failures()[NAME]["3"]
        assert world.source.downloads == 1 and mm.installs[(NAME, "crashed")] == 1
        assert not (world.state / "models" / f"{NAME}.attempt").exists()

    asyncio.run(scenario())


def test_a_version_that_kills_every_start_is_given_up_after_the_limit(world: World) -> None:
    async def scenario() -> None:
        await started(world, want("2"))
        files = _StateFiles(world.state)
        files.mark_attempt(NAME, Attempt("2", "start", 0))  # one start died loading it
        mm = await started(world)
        assert served(mm) == [("2", "active", 1.0)] and mm.failures() == {}

        files.mark_attempt(NAME, Attempt("2", "start", START_CRASH_LIMIT - 2))
        files.mark_attempt(NAME, Attempt("2", "start", START_CRASH_LIMIT - 1))
        mm = await started(world)  # the limit reached: the base, pinned
        assert served(mm) == [("1", "active", 1.0)]
        assert "died 2 times in a row" in mm.failures()[NAME]["2"]
        assert served(await started(world)) == [("1", "active", 1.0)]

    asyncio.run(scenario())


def test_an_unreachable_repository_is_retried_later_not_failed(world: World) -> None:
    now = [0.0]

    async def scenario() -> None:
        world.source.down = True
        mm = await started(world, want("2"), clock=lambda: now[0], retry_s=5.0)
        await converge(mm, want("2"))  # within retry_s: not asked again
        assert mm.failures() == {} and mm.installs[(NAME, "unreachable")] == 1
        world.source.down = False
        now[0] = 6.0
        await converge(mm, want("2"))
        assert served(mm) == [("2", "active", 1.0)]

    asyncio.run(scenario())


def test_without_a_state_dir_versions_are_reported_as_not_installable(world: World) -> None:
    mm = asyncio.run(started(world, want("2", 0.5), state_dir=None))
    assert served(mm) == [("1", "active", 1.0)]
    assert "no state_dir" in mm.failures()[NAME]["2"]


def test_malformed_desired_entries_are_ignored_and_logged_once(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tierlink.node.models")
    bad = {NAME: {"version": "../x", "weight": 1}, "other": {"version": "2", "weight": 1}}

    async def scenario() -> None:
        mm = await started(world)
        for _ in range(3):
            await converge(mm, bad)
        await converge(mm, ["not", "a", "mapping"])
        assert served(mm) == [("1", "active", 1.0)] and world.source.manifests == 0

    asyncio.run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3 and any("'../x'" in m for m in messages)
    assert parse_desired({NAME: {"version": "2", "weight": 7}}) == ({NAME: Desired("2", 1.0)},
                                                                     [])


# -- restarts -------------------------------------------------------------------------------


def test_a_restart_serves_the_last_good_version(world: World) -> None:
    async def scenario() -> None:
        await started(world, want("2", 0.5), want("2"))
        mm = await started(world)
        assert served(mm) == [("2", "active", 1.0)]
        assert answer(mm.active[NAME]) == winner("2")
        path = getattr(mm.active[NAME], "path", None)
        assert path is not None and path.parent == world.state / "slots" / NAME / "A"

    asyncio.run(scenario())


def test_a_damaged_active_slot_falls_back_to_the_other_then_to_the_base(
        world: World) -> None:
    async def scenario() -> None:
        await started(world, want("2"), want("3"))
        tamper(world.state / "slots" / NAME / "B" / "model.onnx")
        mm = await started(world)
        assert served(mm) == [("2", "active", 1.0)]
        tamper(world.state / "slots" / NAME / "A" / "model.onnx")
        mm = await started(world)
        assert served(mm) == [("1", "active", 1.0)]

    asyncio.run(scenario())


# -- the node service on top ----------------------------------------------------------------


def _infer(client: TestClient, model: str, params: dict[str, Any] | None = None
           ) -> httpx.Response:
    body, headers = oip.encode_infer_request({"input": np.zeros((1, 1, 28, 28), np.float32)},
                                             params, None)
    return client.post(f"/v2/models/{model}/infer", content=body, headers=headers)


def _params(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    return oip.decode_infer_response(resp.content, oip.parse_header_length(
        resp.headers.get("inference-header-content-length"))).parameters


def test_the_node_answers_per_version_and_reports_every_version(world: World) -> None:
    mm = asyncio.run(started(world, want("2", 0.5)))
    service = NodeService(NodeSpec("dev-1", Tier.DEVICE, ()), mm.active, models=mm)
    with TestClient(create_app(service, ready=True)) as client:
        pinned = _params(_infer(client, "t", {"tierlink.version": "2"}))
        assert pinned["tierlink.model_version"] == "2" and pinned["tierlink.model"] == NAME
        direct = _infer(client, "m/versions/1")
        assert _params(direct)["tierlink.model_version"] == "1"
        missing = _infer(client, "t", {"tierlink.version": "7"})
        # a version nobody serves is the caller's mistake: 404, naming what is served
        assert missing.status_code == 404 and "'7'" in missing.json()["error"]
        assert "['1', '2']" in missing.json()["hint"]
        seen = Counter(_params(_infer(client, "t"))["tierlink.model_version"]
                       for _ in range(60))
        assert set(seen) == {"1", "2"}

        body = service.heartbeat_body("http://127.0.0.1:1")
        Heartbeat.model_validate(body)
        roles = [(m["version"], m["role"], m["weight"]) for m in body["models"]]
        assert roles == [("1", "active", 0.5), ("2", "standby", 0.5)]
        requests = {m["version"]: m["stats"]["requests"] for m in body["models"]}
        assert requests == {"1": seen["1"], "2": seen["2"] + 1}
        assert body["install_failures"] == {}
        assert client.get("/v2/models/m").json()["versions"] == ["1", "2"]
        metrics = client.get("/metrics").text
        assert 'tierlink_model_installs_total{model="m",outcome="ok",tier="device"} 1.0' \
            in metrics


def test_heartbeat_answers_reach_the_manager(world: World) -> None:
    mm = world.manager()
    service = NodeService(NodeSpec("dev-1", Tier.DEVICE, ()), mm.active, models=mm)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"node_id": "dev-1", "generation": 1,
                                         "desired": want("2", 0.5)})

    async def scenario() -> None:
        await mm.recover()
        client = ControlClient("http://control.test", transport=httpx.MockTransport(handler))
        loop = HeartbeatLoop(client, on_answer=service.apply_answer)
        assert await loop.beat(lambda: service.heartbeat_body("http://127.0.0.1:1"))
        await mm.wait_idle()
        assert served(mm) == [("1", "active", 0.5), ("2", "standby", 0.5)]
        assert service.me().models[0].versions == ("1", "2")
        await client.close()
        await service.stop()

    asyncio.run(scenario())


def test_versions_come_from_the_control_planes_repository(world: World) -> None:
    """The real repository routes and ControlClient as the source: unknown version, then
    an install of a published one (blobs fetched and checked, signature verified)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    from tierlink.errors import TierlinkError
    from tierlink.repo.blobs import BlobStore
    from tierlink.repo.client import RepositoryClient
    from tierlink.repo.manifest import SignedManifest
    from tierlink.repo.routes import install_repository_routes
    from tierlink.repo.service import RepositoryService
    from tierlink.repo.store import SqliteVersionStore

    app = FastAPI()

    @app.exception_handler(TierlinkError)
    async def tierlink_error(_request: Request, exc: TierlinkError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)

    root = world.tmp / "control"
    root.mkdir()
    install_repository_routes(app, RepositoryService(
        SqliteVersionStore(root / "control.db"), BlobStore(root / "blobs"),
        trusted(world.key), lambda: 1.0))
    with TestClient(app) as http:
        publisher = RepositoryClient("http://control.test", http=http)
        for name in ("model.onnx", "card.json"):
            publisher.upload_blob(world.repo / "2" / name)
        publisher.publish(SignedManifest.from_dict(
            json.loads((world.repo / "2" / "signed.json").read_text())))

    async def scenario() -> None:
        control = ControlClient("http://control.test", transport=httpx.ASGITransport(app=app))
        mm = ModelManager({NAME: world.base}, state_dir=world.state,
                          trusted_keys=trusted(world.key), source=control)
        await mm.recover()
        await converge(mm, want("3"))  # not published
        assert mm.failures()[NAME]["3"].startswith("repository_error:")
        await converge(mm, want("2"))
        assert served(mm) == [("2", "active", 1.0)] and mm.failures() == {}
        assert answer(mm.active[NAME]) == winner("2")
        await control.close()

    asyncio.run(scenario())
