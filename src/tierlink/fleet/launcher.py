"""Start a fleet on one machine as real processes: control plane, link emulator, nodes.

A fleet whose control section says ``store: etcd`` gets an etcd cluster of
``etcd_members`` first and ``replicas`` control-plane processes over it (``control``,
``control-1``, ...); nodes are given every replica's URL.

``launch(config, zoo_models, run_dir)`` returns a ``RunningFleet``; ``stop()`` (or leaving the
``with`` block, or Ctrl-C) ends every process it started, by pid, and removes its cgroups.
Device nodes run under a real CPU quota (cgroup) when the fleet gives them ``cpu_quota``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Self

import httpx

from tierlink.errors import TierlinkError
from tierlink.fleet.config import FleetConfig, LinkConfig, NodeConfig
from tierlink.fleet.netns_fleet import (
    close_fabric,
    command,
    node_host,
    open_fabric,
    record,
    shape_links,
)
from tierlink.fleet.ray_fleet import HEAD, start_ray, stop_ray
from tierlink.fleet.security import FleetPki, prepare_pki
from tierlink.fleet.topology import fleet_labels, upstream_rule
from tierlink.netports import pick_port
from tierlink.node.spec import ModelSource, NodeSpec, UpstreamSpec

HOST = "127.0.0.1"
Say = Callable[[str], None]


class LaunchError(TierlinkError):
    code = "launch_error"
    hint = "see the process logs in the run directory"


@dataclass
class RunningFleet:
    config: FleetConfig
    run_dir: Path
    control_url: str = ""  # the first replica: where operators' calls go
    control_urls: list[str] = field(default_factory=list)  # every replica, for the nodes
    links_url: str = ""
    node_urls: dict[str, str] = field(default_factory=dict)
    node_grpc: dict[str, str] = field(default_factory=dict)  # host:port of each gRPC API
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    throttles: list[Any] = field(default_factory=list)
    cpu_mode: str = "none"
    admin_token: str = ""  # operators' credential (also in run_dir/admin.token)
    enroll_token: str = ""  # the token this fleet's nodes enroll with
    routing_revision: int = 0  # the control plane's revision of the file's routing section
    etcd: Any = None  # the EtcdCluster this fleet started, if its control plane uses one
    models: dict[str, tuple[Path, Path]] = field(default_factory=dict)  # name: (onnx, card)
    otlp_endpoint: str | None = None  # where the nodes send spans (the fleet's receiver?)
    traces_file: Path | None = None  # what the fleet's own receiver writes (tracing.collect)
    prometheus_url: str | None = None  # the Prometheus that scrapes this fleet, if started
    pki: FleetPki | None = None  # the fleet CA and the launcher's pairs (security.tls)
    host: str = HOST  # where the root namespace's processes listen (netns: the bridge)
    fabric: Any = None  # the namespaces of a fleet on kernel networking (netns.Fabric)
    reaper: subprocess.Popen[bytes] | None = None  # cleans up if this process dies (netns)
    ray_address: str | None = None  # the Ray head of engine: ray nodes (fleet/ray_fleet.py)

    @property
    def scheme(self) -> str:
        return "https" if self.pki else "http"

    def verify(self) -> ssl.SSLContext | bool:
        """What a caller of this fleet passes as httpx's ``verify`` (an operator's
        context on a fleet with TLS)."""
        return self.pki.client_context() if self.pki else True

    @property
    def admin_headers(self) -> dict[str, str]:
        """Headers for an operator's call to the control plane."""
        return {"authorization": f"Bearer admin:{self.admin_token}"}

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate every process this fleet started (nodes first, then the links, the
        control plane, etcd), then clean cgroups."""
        # The trace receiver goes last: a node flushes its spans as it stops.
        controls = [n for n in self.procs if _is_control(n)]
        order = [n for n in self.procs
                 if n not in ("links", TRACES, HEAD) and not _is_control(n)]
        order += ["links", *controls, TRACES]
        for name in order:
            proc = self.procs.get(name)
            if proc and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for name in order:
            proc = self.procs.get(name)
            if proc is None:
                continue
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        stop_ray(self)  # after the nodes deleted their deployments
        for throttle in self.throttles:
            throttle.close()
        self.throttles.clear()
        if self.etcd is not None:
            self.etcd.stop()
        close_fabric(self)

    def kill(self, node_id: str) -> None:
        """kill -9 one node (fault injection)."""
        proc = self.procs[node_id]
        proc.kill()
        proc.wait(5)

    def restart_node(self, node_id: str, timeout_s: float = 60.0) -> None:
        """Start a stopped (or killed) node again from its spec file: same id, port and
        state directory, so it keeps its identity, model slots and outbox. Blocks until it
        is ready."""
        proc = self.procs[node_id]
        if proc.poll() is None:
            raise LaunchError(f"node {node_id} is still running", hint="kill or stop it first")
        ready = self.run_dir / f"{node_id}.ready"
        ready.unlink(missing_ok=True)
        proc = _spawn(self, node_id, ["-m", "tierlink.node.main", "--spec",
                                      str(self.run_dir / f"{node_id}.json")])
        node = next(n for n in self.config.nodes if n.node_id == node_id)
        if node.cpu_quota:
            from tierlink.netem.cgroup import CpuThrottle

            throttle = CpuThrottle.create(f"{self.run_dir.name}-{node_id}-r{proc.pid}",
                                          node.cpu_quota)
            throttle.add(proc.pid)
            self.throttles.append(throttle)
        self.note_ready(node_id, _wait_file(ready, proc, f"node {node_id}", timeout_s))

    def restart_control(self, down_s: float = 0.0, timeout_s: float = 30.0,
                        replica: int = 0) -> None:
        """Stop a control-plane replica (SIGTERM), wait ``down_s``, start it again on the
        same port and database (nodes keep their address and credentials)."""
        proc = self.procs[_control_name(replica)]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        time.sleep(down_s)
        port = int(self.control_urls[replica].rsplit(":", 1)[1])
        _start_replica(self, replica, timeout_s, port=port)

    def add_node(self, node: NodeConfig, timeout_s: float = 60.0) -> str:
        """Start one more node while the fleet runs (it enrolls with the fleet's token and
        registers; peers whose rule it matches take it up from the registry, no link
        emulated to it). Returns its URL once it is ready."""
        if any(n.node_id == node.node_id for n in self.config.nodes):
            raise LaunchError(f"the fleet already has a node {node.node_id}")
        if self.fabric is not None:
            raise LaunchError("adding a node to a fleet on namespaces is not supported yet",
                              hint="declare it in the fleet file")
        _check_models(replace(self.config, nodes=(node,)), self.models)
        self.config = replace(self.config, nodes=(*self.config.nodes, node))
        port = pick_port(HOST)
        _start_nodes(self, {node.node_id: port}, {}, self.models, only=(node,))
        self.note_ready(node.node_id, _wait_file(self.run_dir / f"{node.node_id}.ready",
                                                 self.procs[node.node_id],
                                                 f"node {node.node_id}", timeout_s))
        if self.prometheus_url:  # Prometheus picks the new target up from the file
            from tierlink.fleet import prometheus

            prometheus.write_targets(self.run_dir / "prometheus" / "targets.json",
                                     self.node_urls, self.control_urls)
        return self.node_urls[node.node_id]

    def note_ready(self, node_id: str, ready: dict[str, Any]) -> None:
        """What a node's ready file says of it: where its gRPC API listens."""
        if ready.get("grpc_port"):
            self.node_grpc[node_id] = f"{node_host(self, node_id)}:{ready['grpc_port']}"

    def kill_control(self, replica: int = 0) -> None:
        """kill -9 one control-plane replica (fault injection)."""
        proc = self.procs[_control_name(replica)]
        proc.kill()
        proc.wait(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch(config: FleetConfig, models: dict[str, tuple[Path, Path]], run_dir: Path,
           say: Say = lambda _: None, ready_timeout_s: float = 60.0,
           prometheus_port: int | None = None, netns: bool = False) -> RunningFleet:
    """Start everything; ``models`` maps a model name to its (onnx, card) paths.
    ``prometheus_port``: also a Prometheus scraping the fleet with its rules (0: a free
    port; None: none). ``netns``: each node in a network namespace of its own, links
    shaped by the kernel (fleet/netns_fleet.py; root only)."""
    _check_models(config, models)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    for stale in run_dir.glob("*.ready"):  # a reused run directory must not fool the waits
        stale.unlink()
    fleet = RunningFleet(config, run_dir, models=dict(models))
    try:
        if netns:
            open_fabric(fleet)
            say(f"{len(config.nodes)} network namespaces on {fleet.host}/"
                f"{fleet.fabric.plan.prefix_len} (fabric {fleet.fabric.plan.tag})")
        fleet.pki = prepare_pki(config.security, run_dir, (fleet.host, HOST, "localhost"))
        _start_traces(fleet, ready_timeout_s)
        _start_control(fleet, ready_timeout_s)
        say(f"control plane at {', '.join(fleet.control_urls)}"
            + (f" (etcd: {len(fleet.etcd.members)} members)" if fleet.etcd else ""))
        start_ray(fleet, ready_timeout_s)
        ports = {n.node_id: pick_port(HOST) for n in config.nodes}
        link_ports = _start_links(fleet, ports, ready_timeout_s)
        shape_links(fleet, link_ports)
        say(f"{len(link_ports)} emulated links up"
            + (" (bandwidth and loss in the kernel)" if fleet.fabric else ""))
        _start_nodes(fleet, ports, link_ports, models)
        _wait_nodes(fleet, ports, ready_timeout_s)
        say(f"{len(config.nodes)} nodes ready (device CPU: {fleet.cpu_mode})")
        _wait_views(fleet, ready_timeout_s)
        if prometheus_port is not None:
            _start_prometheus(fleet, prometheus_port)
            say(f"prometheus at {fleet.prometheus_url} scraping the fleet, rules loaded")
    except BaseException:
        fleet.stop()
        raise
    return fleet


def _check_models(config: FleetConfig, models: dict[str, tuple[Path, Path]]) -> None:
    for node in config.nodes:
        for name in (*node.models, *node.heads):
            if name not in models:
                raise LaunchError(f"node {node.node_id} wants model {name!r}, which neither "
                                  f"the zoo nor the model store has",
                                  hint=f"available: {sorted(models)}; import your own with "
                                       "`tierlink model import`")


def _spawn(fleet: RunningFleet, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    log = open(fleet.run_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (owned by child)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(command(fleet, name, [sys.executable, *args]), stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    log.close()
    fleet.procs[name] = proc
    record(fleet)  # what the reaper ends if this process dies (netns)
    return proc


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str, timeout_s: float) -> Any:
    """The JSON a process writes when it is ready; a file seen half written (its writer not
    done yet) is read again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            with contextlib.suppress(ValueError):
                return json.loads(path.read_text())
        if proc.poll() is not None:
            raise LaunchError(f"{what} exited with code {proc.returncode} before it was ready")
        time.sleep(0.05)
    raise LaunchError(f"{what} was not ready after {timeout_s:.0f} s")


TRACES = "otlp-receiver"


def _start_prometheus(fleet: RunningFleet, port: int) -> None:
    from tierlink.fleet import prometheus

    port = port or pick_port(HOST)
    fleet.procs["prometheus"] = prometheus.start(
        fleet.run_dir, fleet.host, port, fleet.node_urls, fleet.control_urls,
        fleet.run_dir / "logs" / "prometheus.log",
        tls=fleet.pki.operator if fleet.pki else None)
    fleet.prometheus_url = f"http://{fleet.host}:{port}"


def _start_traces(fleet: RunningFleet, timeout_s: float) -> None:
    """Where the nodes' spans go: the fleet file's collector, or (``collect``) a receiver
    of this fleet's own writing ``<run dir>/traces.jsonl``."""
    tracing = fleet.config.tracing
    fleet.otlp_endpoint = tracing.settings.otlp_endpoint
    if not tracing.collect:
        return
    ready, fleet.traces_file = fleet.run_dir / "otlp.ready", fleet.run_dir / "traces.jsonl"
    proc = _spawn(fleet, TRACES, ["-m", "tierlink.telemetry.otlp_receiver", "--host", fleet.host,
                                  "--port", "0", "--out", str(fleet.traces_file),
                                  "--ready-file", str(ready)])
    fleet.otlp_endpoint = str(_wait_file(ready, proc, "OTLP receiver", timeout_s)["endpoint"])


def _start_control(fleet: RunningFleet, timeout_s: float) -> None:
    """The control plane: one SQLite process, or an etcd cluster and its replicas."""
    cfg = fleet.config
    if cfg.control_store == "etcd":
        from tierlink.etcd.cluster import EtcdCluster

        fleet.etcd = EtcdCluster(fleet.run_dir / "etcd", size=cfg.etcd_members).start()
    fleet.control_urls = [""] * cfg.control_replicas
    for replica in range(cfg.control_replicas):
        port = cfg.control_port + replica if cfg.control_port else 0
        _start_replica(fleet, replica, timeout_s, port=port)
    fleet.enroll_token = _enrollment_token(fleet)
    fleet.routing_revision = _routing_revision(fleet)


def _start_replica(fleet: RunningFleet, replica: int, timeout_s: float, port: int) -> None:
    name = _control_name(replica)
    ready = fleet.run_dir / f"{name}.ready"
    token_file = fleet.run_dir / "admin.token"
    db = fleet.run_dir / ("registry.db" if replica == 0 else f"registry-{replica}.db")
    shared = [] if fleet.etcd is None else [
        "--etcd", ",".join(fleet.etcd.endpoints),
        "--repo-dir", str(fleet.run_dir / "registry.db.blobs")]
    proc = _spawn(fleet, name, [
        "-m", "tierlink.control.server", "--host", fleet.host, "--port", str(port),
        "--db", str(db), "--ttl", str(fleet.config.control_ttl_s),
        "--ready-file", str(ready), "--admin-token-file", str(token_file), *shared,
        *_control_tls(fleet),
        *(arg for key in fleet.config.trusted_keys for arg in ("--trusted-key", key))])
    info = _wait_file(ready, proc, f"control plane {name}", timeout_s)
    fleet.control_urls[replica] = f"{fleet.scheme}://{fleet.host}:{info['port']}"
    fleet.control_url = fleet.control_urls[0]
    fleet.admin_token = token_file.read_text().strip()


def _control_tls(fleet: RunningFleet) -> list[str]:
    pki = fleet.pki
    if pki is None:
        return []
    return ["--tls-cert", str(pki.control.cert), "--tls-key", str(pki.control.key),
            "--tls-ca", str(pki.ca_dir), "--cert-ttl", str(pki.cert_ttl_s)]


def _control_name(replica: int) -> str:
    return "control" if replica == 0 else f"control-{replica}"


def _is_control(name: str) -> bool:
    return name == "control" or name.startswith("control-")


def _enrollment_token(fleet: RunningFleet) -> str:
    """One token for this fleet's nodes (any number of uses: nodes added later use it too)."""
    return str(_as_operator(fleet, "POST", "/v1/enrollment-tokens",
                            {"note": f"fleet {fleet.config.name}"}, "token",
                            "create an enrollment token"))


def _routing_revision(fleet: RunningFleet) -> int:
    """The fleet file's routing section as the control plane's revision that the nodes
    start on (``tierlink policy apply`` changes it live from there)."""
    body = {"routing": fleet.config.routing.to_dict(), "note": "tierlink up", "start": True}
    return int(_as_operator(fleet, "PUT", "/v1/routing", body, "revision",
                            "store the fleet's routing revision"))


def _as_operator(fleet: RunningFleet, method: str, path: str, body: dict[str, Any],
                 key: str, what: str) -> Any:
    """The ``key`` of the control plane's answer to one call with the operators' token;
    ``LaunchError`` saying ``what`` could not be done otherwise."""
    try:
        response = httpx.request(method, f"{fleet.control_url}{path}", json=body,
                                 headers=fleet.admin_headers, timeout=10.0,
                                 trust_env=False, verify=fleet.verify())
        response.raise_for_status()
        return response.json()[key]
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
        raise LaunchError(f"could not {what}: {exc}") from exc


def _link_spec(fleet: RunningFleet, link: LinkConfig, ports: dict[str, int]) -> dict[str, Any]:
    kernel = fleet.fabric is not None  # bandwidth and loss are shaped there (netns)
    return {"name": link.name, "listen_host": fleet.host, "listen_port": 0,
            "target_host": node_host(fleet, link.dst), "target_port": ports[link.dst],
            "delay_ms": link.delay_ms, "jitter_ms": link.jitter_ms,
            "bandwidth_mbit": None if kernel else link.bandwidth_mbit,
            "loss": 0.0 if kernel else link.loss}


def _start_links(fleet: RunningFleet, ports: dict[str, int], timeout_s: float) -> dict[str, int]:
    if not fleet.config.links:
        return {}
    spec_file = fleet.run_dir / "links.json"
    spec_file.write_text(json.dumps([_link_spec(fleet, l, ports) for l in fleet.config.links],
                                    indent=2))
    ready = fleet.run_dir / "links.ready"
    proc = _spawn(fleet, "links", ["-m", "tierlink.netem.server", "--spec", str(spec_file),
                                   "--control-port", "0", "--ready-file", str(ready)])
    info = _wait_file(ready, proc, "link emulator", timeout_s)
    fleet.links_url = str(info["control_url"])
    return {name: int(link["listen_port"]) for name, link in info["links"].items()}


def _node_spec(fleet: RunningFleet, node: NodeConfig, port: int, link_ports: dict[str, int],
               models: dict[str, tuple[Path, Path]]) -> NodeSpec:
    cfg = fleet.config
    upstreams = tuple(
        UpstreamSpec(l.dst, f"{fleet.scheme}://{fleet.host}:{link_ports[l.name]}",
                     rtt_ms=l.rtt_ms,
                     bandwidth_mbit=l.bandwidth_mbit or 10_000.0, loss=l.loss)
        for l in cfg.links_from(node.node_id))
    sources = tuple(ModelSource(m, str(models[m][0]), str(models[m][1])) for m in node.models)
    heads = tuple(ModelSource(m, str(models[m][0]), str(models[m][1])) for m in node.heads)
    tier, match = upstream_rule(cfg, node)
    labels = fleet_labels(cfg).get(node.node_id, dict(node.labels))
    return NodeSpec(node_id=node.node_id, tier=node.tier, models=sources, heads=heads,
                    labels=labels, upstream_tier=tier, upstream_match=match,
                    default_privacy=node.default_privacy,
                    device_state_file=node.device_state_file,
                    host=node_host(fleet, node.node_id), port=port,
                    advertise_url=node.advertise_url,
                    control_url=",".join(fleet.control_urls), upstreams=upstreams,
                    routing=cfg.routing, routing_revision=fleet.routing_revision,
                    workers=node.workers, max_queue=node.max_queue, threads=node.threads,
                    escalation_queue=node.escalation_queue,
                    seed=cfg.seed + zlib.crc32(node.node_id.encode()) % 1000,
                    ready_file=str(fleet.run_dir / f"{node.node_id}.ready"),
                    hard_examples=cfg.hard_examples,
                    state_dir=str(fleet.run_dir / "state" / node.node_id),
                    enroll_token=fleet.enroll_token, trusted_keys=cfg.trusted_keys,
                    fault_injection=cfg.fault_injection, providers=node.providers,
                    otlp_endpoint=fleet.otlp_endpoint,
                    otlp_protocol=cfg.tracing.settings.protocol,
                    trace_sample_ratio=cfg.tracing.settings.sample_ratio,
                    engine=node.engine,
                    ray_address=fleet.ray_address if node.engine.on_ray else None,
                    tls_ca=str(fleet.pki.ca_file) if fleet.pki else None,
                    tls_client_auth=fleet.pki.client_auth if fleet.pki else "optional",
                    llms=node.chat.models if node.chat else (),
                    chat_tasks=node.chat.tasks() if node.chat else {},
                    kv_copies=node.chat.kv_copies if node.chat else False,
                    grpc_port=0,
                    batching={m: b for m, b in cfg.batching.items() if m in node.models})


def _start_nodes(fleet: RunningFleet, ports: dict[str, int], link_ports: dict[str, int],
                 models: dict[str, tuple[Path, Path]],
                 only: tuple[NodeConfig, ...] | None = None) -> None:
    from tierlink.netem.cgroup import CpuThrottle

    for node in fleet.config.nodes if only is None else only:
        spec = _node_spec(fleet, node, ports[node.node_id], link_ports, models)
        spec_file = fleet.run_dir / f"{node.node_id}.json"
        spec_file.write_text(spec.to_json())
        proc = _spawn(fleet, node.node_id, ["-m", "tierlink.node.main", "--spec", str(spec_file)])
        fleet.node_urls[node.node_id] = \
            f"{fleet.scheme}://{node_host(fleet, node.node_id)}:{ports[node.node_id]}"
        if node.cpu_quota:
            throttle = CpuThrottle.create(f"{fleet.run_dir.name}-{node.node_id}", node.cpu_quota)
            throttle.add(proc.pid)
            fleet.throttles.append(throttle)
            fleet.cpu_mode = throttle.mode
            record(fleet)


def _wait_nodes(fleet: RunningFleet, ports: dict[str, int], timeout_s: float) -> None:
    for node in fleet.config.nodes:
        fleet.note_ready(node.node_id, _wait_file(
            fleet.run_dir / f"{node.node_id}.ready", fleet.procs[node.node_id],
            f"node {node.node_id}", timeout_s))


def _wait_views(fleet: RunningFleet, timeout_s: float) -> None:
    """Every node sees every node it links to (so the first requests route as planned)."""
    deadline = time.monotonic() + timeout_s
    pending = {n.node_id: {l.dst for l in fleet.config.links_from(n.node_id)}
               for n in fleet.config.nodes}
    with httpx.Client(timeout=2.0, verify=fleet.verify()) as client:
        while pending and time.monotonic() < deadline:
            for node_id in list(pending):
                try:
                    status = client.get(f"{fleet.node_urls[node_id]}/tierlink/v1/status").json()
                except httpx.HTTPError:
                    continue
                if pending[node_id] <= set(status["view_nodes"]) & set(status["links"]):
                    del pending[node_id]
            time.sleep(0.1)
    if pending:
        raise LaunchError(f"nodes did not learn their upstreams in time: {sorted(pending)}")
