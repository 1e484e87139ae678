"""Run one node process: load its models, serve OIP over HTTP, heartbeat to the control plane.

``run_node(spec)`` blocks until SIGTERM/SIGINT, then deregisters and shuts down cleanly.
At start the node serves each model's last good version (its A/B slots under
``state_dir``, else the spec's files: see ``node/models.py``); each heartbeat answer's
``desired`` then says which versions to install and serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import ssl
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierlink.models import runtimes as model_runtimes
from tierlink.models.runtime import ModelRuntime
from tierlink.models.runtimes import LoadSpec
from tierlink.node.certificates import NodeTls
from tierlink.node.identity import load_identity
from tierlink.node.models import ArtifactSource, Host, ModelManager, load_version
from tierlink.node.service import NodeService
from tierlink.node.spec import NodeSpec
from tierlink.node.uplink import Uplink, UplinkMetrics, uplink_for_spec
from tierlink.telemetry import tracing
from tierlink.telemetry.metrics import NodeMetrics

if TYPE_CHECKING:
    from tierlink.chat.service import ChatService, VerifierLink

log = logging.getLogger("tierlink.node")


def model_host(spec: NodeSpec) -> Host:
    """The node's engine: its models in this process, or on Ray Serve (``engine: ray``)
    behind this node's front door — for the spec's models and every version installed."""
    engine = spec.engine
    if engine.on_ray:
        from tierlink.node.ray_serve import RayHost

        return RayHost(spec.node_id, spec.ray_address or "", engine)
    if spec.threads == 1:
        return model_runtimes.load
    return lambda load: model_runtimes.load(replace(load, threads=spec.threads))


def load_runtimes(spec: NodeSpec, host: Host = model_runtimes.load) -> dict[str, ModelRuntime]:
    """The runtime of each model in the spec, chosen by its card's format."""
    return {src.name: host(LoadSpec(card=Path(src.card),
                                    model_file=Path(src.onnx) if src.onnx else None,
                                    providers=spec.providers, threads=spec.threads))
            for src in spec.models}


def run_node(spec: NodeSpec, runtimes: dict[str, ModelRuntime] | None = None) -> None:
    """Serve ``spec`` until SIGTERM/SIGINT; ``runtimes`` replace the spec's models (tests)."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {spec.node_id} %(levelname)s "
                                                   "%(name)s: %(message)s")
    # httpx logs every request at INFO: two lines per heartbeat, thousands per run.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    tracing.configure(spec.tracing(), spec.node_id)
    host = model_host(spec)
    try:
        loaded = runtimes if runtimes is not None else load_runtimes(spec, host)
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve_node(spec, loaded, host))
    finally:
        tracing.shutdown()  # spans still batched go out before the process ends
        close = getattr(host, "close", None)
        if close is not None:
            close()  # Ray: this node's applications go; the cluster stays


def _loop_factory() -> Any:
    """uvloop when installed (a dependency; noticeably less CPU per request), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def serve_node(spec: NodeSpec, runtimes: dict[str, ModelRuntime],
                     host: Host = model_runtimes.load) -> None:
    import uvicorn

    from tierlink.control.client import ControlClient, HeartbeatLoop, RegistryCache
    from tierlink.node.app import create_app
    from tierlink.transport.client import OipClient

    spec.advertised(spec.port or 1)  # an address no peer could use is refused before binding
    tls = NodeTls(spec) if spec.tls_ca else None
    # Partial downloads live in the state directory: a restart resumes them.
    control = ControlClient(spec.control_url, tls=tls.client if tls else None,
                            home=spec.node_id,
                            partial_dir=Path(spec.state_dir) / "downloads" if spec.state_dir
                            else None) if spec.control_url else None
    if control is not None:
        await _identify(spec, control)
    if tls is not None:
        await tls.ensure(control)  # the node's certificate (from the control plane)
    models = await open_models(spec, runtimes, control, host)
    cache = RegistryCache(control) if control else None
    metrics = NodeMetrics(spec.tier.label)
    metrics.watch_process()
    # The control client is also where hard examples go (see node/hard_examples.py), and
    # where model versions come from (its repository).
    client_tls = tls.client if tls else None
    service = NodeService(spec, models.active, records=(lambda: cache.nodes) if cache else list,
                          hard_example_sink=control, models=models, metrics=metrics,
                          uplink=_uplink(spec, metrics, client_tls),
                          client=OipClient(tls=client_tls) if client_tls else None)
    chat = _chat_service(spec, metrics, service)
    chat.tls = client_tls
    app = create_app(service, chat=chat)
    app.state.tls = tls
    if cache:
        service.metrics.control_stale.labels(spec.tier.label).set_function(
            lambda: min(cache.stale_s(time.time()), 1e9))
    server = uvicorn.Server(uvicorn.Config(app, host=spec.host, port=spec.port,
                                           log_level="warning", access_log=False,
                                           timeout_keep_alive=30, **_tls_options(tls)))
    serving = asyncio.create_task(server.serve())
    renewing = asyncio.create_task(tls.run(control), name="tls-renewal") \
        if tls is not None and control is not None else None
    beat = HeartbeatLoop(control, None, on_answer=service.apply_answer) if control else None
    watching: asyncio.Task[None] | None = None
    try:
        port = await _wait_started(server, serving)
        address = spec.advertised(port)
        if beat and cache:
            # Register and learn the fleet before saying "ready"; then beat on a fixed rate
            # and watch the view (a change arrives at once; a quiet fleet costs nothing).
            await beat.beat(lambda: service.heartbeat_body(address))
            await cache.refresh()
            service.refresh_view()
            beat.start(lambda: service.heartbeat_body(address), spec.heartbeat_s)
            watching = asyncio.create_task(cache.watch(spec.heartbeat_s), name="view-watch")
        grpc_port = await _start_grpc(spec, service, app)
        app.state.ready = True
        _write_ready(spec, port, grpc_port)
        log.info("node %s (%s) serving on %s://%s:%s, registered as %s", spec.node_id,
                 spec.tier.label, spec.scheme, spec.host, port, address)
        await serving
    finally:
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        if watching is not None:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        if beat:
            await beat.stop(deregister=True)
        if control:
            await control.close()


def _chat_service(spec: NodeSpec, metrics: NodeMetrics, service: NodeService) -> ChatService:
    """The OpenAI API on this node: its own language models (when it serves any), placed
    over the node's view, and relays to its upstreams' (torch is loaded only with a model)."""
    from tierlink.chat.placing import NodeLink
    from tierlink.chat.service import ChatService
    from tierlink.node.topology import UpstreamURLs
    from tierlink.telemetry.llm_metrics import LLMMetrics

    models = {src.name: model_runtimes.load(LoadSpec(card=Path(src.path) / "card.json",
                                                     options={"source": src}), fmt=src.format)
              for src in spec.llms}  # torch is imported by the first one
    chat = ChatService(spec.node_id, spec.tier, models, dict(spec.chat_tasks),
                       LLMMetrics(spec.tier.label, metrics.registry),
                       verifiers=_verifier_links(spec),
                       upstreams=UpstreamURLs(service.topology.upstreams),
                       node=NodeLink(view=lambda: service.view, links=service.link_views,
                                     healthy=service.breakers.healthy,
                                     features_may_leave=spec.routing.local_features_may_leave),
                       kv_copies=spec.kv_copies, splits=_verifier_links(spec, "split"))
    service.language_models = chat.views
    return chat


def _verifier_links(spec: NodeSpec, role: str = "verifier") -> dict[str, VerifierLink]:
    """Each model's upstream model in ``role``: its verifier (drafting) or the rest of its
    layers (``split``), ``NODE/MODEL`` with NODE one of the upstreams."""
    from tierlink.chat.service import VerifierLink
    from tierlink.core.types import Tier
    from tierlink.errors import ConfigError

    urls = {u.node_id: u.url for u in spec.upstreams}
    links: dict[str, VerifierLink] = {}
    for src in spec.llms:
        named: str | None = getattr(src, role)
        if not named:
            continue
        node, _, model = named.partition("/")
        if node not in urls or not model:
            raise ConfigError(f"llm {src.name}: {role} {named!r} must be NODE/MODEL "
                              f"with NODE one of this node's upstreams ({sorted(urls)})")
        links[src.name] = VerifierLink(node, urls[node], model,
                                       Tier.parse(getattr(src, f"{role}_tier")))
    return links


def _tls_options(tls: NodeTls | None) -> dict[str, Any]:
    """uvicorn's options for a node with TLS: its server context (reloaded in place at
    each renewal) and the protocol that tells the app who the peer is."""
    if tls is None:
        return {}
    from tierlink.security.asgi_tls import TlsHttpProtocol

    context = tls.server
    return {"http": TlsHttpProtocol, "ssl_context_factory": lambda _config, _default: context}


def _uplink(spec: NodeSpec, metrics: NodeMetrics,
            tls: ssl.SSLContext | None = None) -> Uplink | None:
    """The node's store-and-forward uplink (None without a ``state_dir``); its calls to the
    control plane carry the node's identity."""
    identity = load_identity(Path(spec.state_dir)) if spec.state_dir else None
    return uplink_for_spec(spec, authorization=identity.authorization if identity else None,
                           metrics=UplinkMetrics(spec.tier.label, metrics.registry),
                           tls=tls)


async def open_models(spec: NodeSpec, runtimes: dict[str, ModelRuntime],
                      source: ArtifactSource | None,
                      host: Host = model_runtimes.load) -> ModelManager:
    """The manager of the node's model versions, recovered: each model serves its last
    good version (a slot under ``spec.state_dir``, else the spec's files in ``runtimes``);
    versions are installed from ``source``, must be signed by ``spec.trusted_keys`` and are
    hosted like the spec's models (``host``: in process, or Ray Serve)."""
    models = ModelManager(runtimes, state_dir=Path(spec.state_dir) if spec.state_dir else None,
                          trusted_keys=spec.trusted_keys, source=source,
                          load=functools.partial(load_version, host=host,
                                                 providers=spec.providers))
    await models.recover()
    return models


async def _identify(spec: NodeSpec, control: Any) -> None:
    """Load or enroll this node's identity (see node/identity.py) before any other call."""
    from tierlink.errors import ConfigError
    from tierlink.node.identity import ensure_identity

    if spec.state_dir is None:
        if spec.enroll_token:
            raise ConfigError("a node with an enroll_token needs a state_dir to keep its "
                              "identity in", hint="set state_dir in the node spec")
        return
    from tierlink.errors import ControlPlaneError

    state_dir = Path(spec.state_dir)
    attempt = 0
    while True:
        try:
            identity = await ensure_identity(control, state_dir, spec.node_id,
                                             spec.tier.label, spec.enroll_token)
        except ControlPlaneError as exc:
            if exc.details.get("status") is not None:
                raise  # refused (bad token, revoked id): retrying cannot help
            if attempt == 0:
                log.warning("cannot enroll yet (%s); retrying every 2 s", exc)
            attempt += 1
            await asyncio.sleep(2.0)
            continue
        if identity is not None:
            log.info("node %s identified (enrolled %s)", identity.node_id,
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(identity.enrolled_at)))
        return


async def _wait_started(server: Any, serving: asyncio.Task[None]) -> int:
    while not server.started:
        if serving.done():
            serving.result()  # re-raise why it could not start (e.g. port in use)
            raise RuntimeError("HTTP server stopped before it started")
        await asyncio.sleep(0.01)
    return int(server.servers[0].sockets[0].getsockname()[1])


async def _start_grpc(spec: NodeSpec, service: NodeService, app: Any) -> int | None:
    """The gRPC API beside REST (node/grpc_api.py), stopped before the service; its port."""
    if spec.grpc_port is None:
        return None
    from tierlink.node.grpc_api import GrpcApi, serve_grpc

    api = GrpcApi(service, app.state.overload, app.state.peers, lambda: bool(app.state.ready))
    tls = app.state.tls
    server, port = await serve_grpc(api, spec.host, spec.grpc_port,
                                    tls.grpc_credentials() if tls is not None else None)

    async def close() -> None:
        await server.stop(grace=2.0)

    app.state.closing.append(close)
    log.info("node %s: OIP gRPC on %s:%s", spec.node_id, spec.host, port)
    return port


def _write_ready(spec: NodeSpec, port: int, grpc_port: int | None = None) -> None:
    if spec.ready_file:
        tmp = Path(spec.ready_file + ".tmp")
        tmp.write_text(json.dumps({"node_id": spec.node_id, "port": port,
                                   "grpc_port": grpc_port}))
        tmp.replace(spec.ready_file)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="run one tierlink node from a spec file")
    parser.add_argument("--spec", required=True)
    args = parser.parse_args()
    run_node(NodeSpec.load(args.spec))


if __name__ == "__main__":
    main()
