"""The ``tierlink`` command line (typer). Heavy imports happen inside each command."""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.calibration import calibration
from tierlink.cli.cascade import app as cascade_app
from tierlink.cli.chat_router import chat_router_cmd
from tierlink.cli.cost import cost
from tierlink.cli.enroll import app as enroll_app
from tierlink.cli.errors import ADMIN_TOKEN_HELP, admin_headers, fail, fleet_verify
from tierlink.cli.hard_examples import app as hard_examples_app
from tierlink.cli.llm import app as llm_app
from tierlink.cli.model import app as model_app
from tierlink.cli.model_import import catalog_cmd, import_cmd, imported_cmd
from tierlink.cli.models import fleet_models
from tierlink.cli.pki import app as pki_app
from tierlink.cli.policy import policy_app
from tierlink.cli.quantize import quantize
from tierlink.cli.retrain import retrain_cmd
from tierlink.cli.rollout import app as rollout_app
from tierlink.cli.split import app as split_app
from tierlink.cli.split_profile import profile_cmd
from tierlink.cli.trace import app as trace_app
from tierlink.demo.fleets import fleet_path
from tierlink.errors import TierlinkError

app = typer.Typer(help="tierlink: cloud-edge-device collaborative inference.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
zoo_app = typer.Typer(help="Build and inspect the model zoo.", no_args_is_help=True)
app.add_typer(zoo_app, name="zoo")
app.add_typer(hard_examples_app, name="hard-examples")
app.add_typer(cascade_app, name="cascade")
cascade_app.command("chat-router")(chat_router_cmd)
app.add_typer(enroll_app, name="enroll")
app.add_typer(model_app, name="model")
model_app.command("import")(import_cmd)
model_app.command("imported")(imported_cmd)
model_app.command("catalog")(catalog_cmd)
app.add_typer(rollout_app, name="rollout")
zoo_app.command("calibration")(calibration)
app.command()(quantize)
app.command()(cost)
app.command("retrain")(retrain_cmd)
app.add_typer(split_app, name="split")
app.add_typer(llm_app, name="llm")
app.add_typer(policy_app, name="policy")
app.add_typer(trace_app, name="trace")
app.add_typer(pki_app, name="pki")
split_app.command("profile")(profile_cmd)
console = Console(stderr=True)
DEMO_FLEET = fleet_path()  # the demo's fleet file (package data): `demo`'s and `sim`'s default
TRACES_HELP = ("trace every request: start an OTLP receiver for the fleet (<run dir>/"
               "traces.jsonl; `tierlink trace show` reads it)")
OTLP_HELP = "send every node's spans to this OTLP/HTTP collector (e.g. http://host:4318)"
NETNS_HELP = ("each node in a network namespace of its own with its own address (veth pairs, a "
              "bridge), link bandwidth (htb) and loss (iptables) in the kernel; root only")
__all__ = ["app", "fail", "fleet_models"]  # the last: cli/models.py



@zoo_app.command("build")
def zoo_build(profile: str = typer.Option("full", help="full (the real models) or test"),
              task: str = typer.Option("fmnist", help="fmnist (Fashion-MNIST) or mnist"),
              rebuild: bool = typer.Option(False, "--rebuild", "--force",
                                           help="train again, even if cached or shipped"),
              ship: bool = typer.Option(False, "--ship",
                                        help="copy the built models into the ones tierlink "
                                             "ships (developers, after a recipe changes)"),
              as_json: bool = typer.Option(False, "--json", help="print the cards as JSON")) -> None:
    """Train, export and profile a task's models (cached after the first run; the
    Fashion-MNIST families ship with tierlink, checked against this code on first use)."""
    from tierlink.zoo import ensure_zoo

    try:
        zoo = ensure_zoo(task=task, profile=profile, progress=not as_json, force=rebuild)
        if ship:
            from tierlink.zoo.shipped import VARIANTS
            from tierlink.zoo.shipped import ship as ship_models

            names = [n for n in zoo.cards if n in zoo.base_names() or n in VARIANTS]
            where = ship_models(zoo.root, profile, names)
            console.print(f"shipped {', '.join(names)} in {where}")
    except TierlinkError as exc:
        fail(exc)
    _print_cards(zoo, as_json)


@zoo_app.command("list")
def zoo_list(profile: str = typer.Option("full"),
             task: str = typer.Option("fmnist", help="fmnist (Fashion-MNIST) or mnist"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Show the model cards of a built zoo."""
    zoo_build(profile=profile, task=task, rebuild=False, ship=False, as_json=as_json)


def _print_cards(zoo: Any, as_json: bool) -> None:
    from tierlink.zoo.profiles import data_stats

    if as_json:
        print(json.dumps({n: c.to_dict() for n, c in zoo.cards.items()}, indent=2))
        return
    table = Table(title=f"model zoo ({data_stats(zoo.task).title} test split)")
    for col in ("model", "tier", "params", "accuracy", "ms/sample (b1 p50)", "ms/sample (b32)"):
        table.add_column(col)
    for name, c in zoo.cards.items():
        table.add_row(name, c.tier, f"{c.params:,}", f"{100 * c.test_accuracy:.2f}%",
                      f"{c.latency_ms['batch1_p50']:.3f}", f"{c.latency_ms['batch32_per_sample']:.3f}")
    Console().print(table)


@app.command()
def demo(quick: bool = typer.Option(False, "--quick", help="a shorter run (< 3 min)"),
         json_path: Path | None = typer.Option(None, "--json", help="write the report here"),
         fleet_file: Path = typer.Option(DEMO_FLEET, "--fleet"),
         requests: int | None = typer.Option(None, help="requests per run"),
         rate: float | None = typer.Option(None, help="requests per second"),
         chat: bool = typer.Option(False, "--chat", help="then a chat phase on its own fleet "
                                                         "(the demo's chat-fleet.yaml)"),
         log: Path | None = typer.Option(None, "--log", help="write every request and its "
                                         "answer here (JSON lines; `sim --replay` reads it)"),
         seed: int | None = typer.Option(None, help="the workload's seed (default: 7)"),
         etcd_replicas: int | None = typer.Option(
             None, "--etcd-replicas", min=1, help="run the control plane as this many "
             "replicas over a three-member etcd cluster (default: as the fleet file says)"),
         traces: bool = typer.Option(False, "--traces", help=TRACES_HELP),
         otlp_endpoint: str | None = typer.Option(None, "--otlp-endpoint", help=OTLP_HELP),
         netns: bool = typer.Option(False, "--netns", help=NETNS_HELP),
         tls: bool = typer.Option(False, "--tls", help="TLS on every hop (a fleet CA in the "
                                  "run directory; claims bound to senders)"),
         ) -> None:
    """Start a 7-node fleet, drive a mixed workload, compare with cloud-only and device-only."""
    from tierlink.demo.run import run_demo

    try:
        run_demo(fleet_file, quick=quick, json_path=json_path, requests=requests, rate=rate,
                 chat=chat, log_path=log, seed=seed, etcd_replicas=etcd_replicas,
                 traces=traces, otlp_endpoint=otlp_endpoint, netns=netns, tls=tls)
    except TierlinkError as exc:
        fail(exc)


@app.command("plan")
def plan_cmd(inventory: Path = typer.Argument(..., help="use cases and a hardware catalogue"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Place each use case, size it on P95 with headroom, cost it per month; beside the
    all-cloud and all-edge plans."""
    from tierlink.cli.plan import plan_report, print_report

    try:
        print_report(plan_report(inventory), as_json)
    except TierlinkError as exc:
        fail(exc)


@app.command()
def sim(fleet_file: Path = typer.Argument(DEMO_FLEET, help="the fleet YAML (as `up` takes)"),
        scenario: Path | None = typer.Option(None, "--scenario",
                                             help="arrivals, outages, crashes, slowdowns (YAML)"),
        requests: int | None = typer.Option(None, help="requests per run (default: the "
                                                       "demo's 600, or all the scenario makes)"),
        rate: float = typer.Option(25.0, help="mean requests per second"),
        arrivals: str | None = typer.Option(None, help="constant, poisson or diurnal"),
        duration: float | None = typer.Option(None, help="simulated seconds of arrivals"),
        seed: int | None = typer.Option(None, help="default: the fleet file's seed"),
        runs: str = typer.Option("tierlink,static_rules,cloud_only,device_only",
                                 help="the runs, as the demo names them (and bandit)"),
        json_path: Path | None = typer.Option(None, "--json", help="write the report here"),
        png_path: Path | None = typer.Option(None, "--png",
                                             help="plot p95, SLA and tier shares over time"),
        scale: str | None = typer.Option(None, help="DEVICESxEDGESxCLOUDS: the file's nodes "
                                                    "replicated to that size"),
        replay: Path | None = typer.Option(None, help="send the requests of a live run's log "
                                                      "(`demo --log`) at their times"),
        replay_run: str | None = typer.Option(None, help="which run of the log (default: "
                                                         "its first)"),
        http_from: Path | None = typer.Option(None, help="measure the HTTP costs of a request "
                                                         "and a hop from a live run's log"),
        http_warm_up: bool = typer.Option(False, "--http-warm-up", help="... from the "
                                          "log's warm-ups (sent right before each run, not "
                                          "counted) instead of its measured requests"),
        photos: bool = typer.Option(True, help="with the demo's workload, then its photo "
                                               "workload (split plans), as the demo runs it"),
        workers: int = typer.Option(1, min=1, help="local processes the runs are spread "
                                                   "over (each run is independent)"),
        ray_address: str | None = typer.Option(None, "--ray-address", help="spread the "
                                               "runs over this Ray cluster instead"),
        ) -> None:
    """Simulate a fleet on simulated time with the nodes' own policies and dispatcher."""
    from tierlink.cli.sim import run_sim

    try:
        run_sim(fleet_file, scenario_file=scenario, requests=requests, rate=rate,
                arrivals=arrivals, duration_s=duration, seed=seed, runs=runs,
                json_path=json_path, png_path=png_path, scale=scale, replay=replay,
                replay_run=replay_run, http_from=http_from,
                http_warm_up=http_warm_up, photos=photos, workers=workers,
                ray_address=ray_address)
    except TierlinkError as exc:
        fail(exc)


@app.command()
def up(fleet_file: Path = typer.Argument(..., help="the fleet YAML"),
       run_dir: Path | None = typer.Option(None, help="logs and state (default: temp dir)"),
       as_json: bool = typer.Option(False, "--json", help="print the endpoints as JSON"),
       etcd_replicas: int | None = typer.Option(
           None, "--etcd-replicas", min=1, help="run the control plane as this many replicas "
           "over a three-member etcd cluster (default: as the fleet file says)"),
       traces: bool = typer.Option(False, "--traces", help=TRACES_HELP),
       otlp_endpoint: str | None = typer.Option(None, "--otlp-endpoint", help=OTLP_HELP),
       prometheus: bool = typer.Option(False, "--prometheus", help="also start Prometheus "
                                       "scraping every node with deploy/rules loaded"),
       prometheus_port: int = typer.Option(9090, min=0, max=65535,
                                           help="Prometheus's port (0: any free one)"),
       tls: bool = typer.Option(False, "--tls", help="TLS on every hop with a fleet CA made "
                                "in the run directory; claims bound to senders (as the fleet "
                                "file's security: {tls: true})"),
       netns: bool = typer.Option(False, "--netns", help=NETNS_HELP),
       ) -> None:
    """Run a fleet declared in FLEET_FILE until Ctrl-C."""
    from tierlink.fleet.config import load_fleet, on_etcd, with_tls, with_tracing
    from tierlink.fleet.launcher import launch
    from tierlink.fleet.tuning import require_fresh

    try:
        config = with_tls(with_tracing(on_etcd(load_fleet(fleet_file), etcd_replicas), traces,
                                       otlp_endpoint), tls)
        models = fleet_models(config.zoo_profile, config.model_names())
        require_fresh(config, models, fleet_file)
        rd = run_dir or Path(tempfile.mkdtemp(prefix="tierlink-"))
        fleet = launch(config, models, rd, say=lambda m: console.print(f"[dim]{m}[/dim]"),
                       prometheus_port=prometheus_port if prometheus else None, netns=netns)
    except TierlinkError as exc:
        fail(exc)
    with fleet:
        info = {"control": fleet.control_url, "control_replicas": fleet.control_urls,
                "links": fleet.links_url, "nodes": fleet.node_urls,
                "otlp_endpoint": fleet.otlp_endpoint, "prometheus": fleet.prometheus_url,
                "traces_file": str(fleet.traces_file) if fleet.traces_file else None,
                "run_dir": str(rd), "device_cpu_throttle": fleet.cpu_mode,
                "ca": str(fleet.pki.ca_file) if fleet.pki else None,
                "operator_cert": str(fleet.pki.operator.cert) if fleet.pki else None,
                "operator_key": str(fleet.pki.operator.key) if fleet.pki else None}
        print(json.dumps(info, indent=2), flush=True) if as_json else _print_endpoints(info)
        _wait_for_signal(fleet)


def _print_endpoints(info: dict[str, Any]) -> None:
    table = Table(title="fleet up (Ctrl-C to stop)")
    table.add_column("node")
    table.add_column("OIP endpoint")
    for node_id, url in info["nodes"].items():
        table.add_row(node_id, url)
    Console().print(table)
    console.print(f"control plane {info['control']}  ·  links {info['links']}  ·  "
                  f"logs {info['run_dir']}/logs")
    console.print(f"fleet view: {info['control']}/ui (it asks for the operator token)")
    console.print(f"operator token: export TIERLINK_ADMIN_TOKEN=$(cat {info['run_dir']}/"
                  "admin.token)")
    if info.get("ca"):  # TLS: what operator commands verify the fleet with, and present
        console.print(f"TLS: export TIERLINK_CA={info['ca']} TIERLINK_CERT="
                      f"{info['operator_cert']} TIERLINK_KEY={info['operator_key']}")
    if info["prometheus"]:
        console.print(f"prometheus {info['prometheus']} (rules and alerts: "
                      f"{info['prometheus']}/alerts)")
    if info["traces_file"]:
        console.print(f"traces: tierlink trace list -f {info['traces_file']}")
    elif info["otlp_endpoint"]:
        console.print(f"spans go to {info['otlp_endpoint']}")


def _wait_for_signal(fleet: Any) -> None:
    """Until Ctrl-C or SIGTERM (see :func:`_stop_on_signals`), saying which process exits."""
    try:
        while True:
            for name, proc in fleet.procs.items():
                if proc.poll() is not None:
                    console.print(f"[yellow]{name} exited with code {proc.returncode}[/yellow]")
                    fleet.procs.pop(name)
                    break
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass


@app.command()
def node(spec: Path | None = typer.Option(None, help="a node spec JSON (as `up` writes)"),
         node_id: str | None = typer.Option(None, "--id"),
         tier: str = typer.Option("edge"),
         model: list[str] = typer.Option([], help="zoo or imported model name (repeatable)"),
         providers: str = typer.Option("cpu", help="ONNX Runtime execution providers in "
                                                   "order, e.g. cuda,cpu (CPU is the fallback)"),
         port: int = typer.Option(8000),
         grpc_port: int | None = typer.Option(None, help="serve the Open Inference "
                                                         "Protocol's gRPC API on this port "
                                                         "too (0: any free port)"),
         threads: int = typer.Option(1, min=1, help="intra-op threads of each model"),
         batch: list[str] = typer.Option([], help="MODEL=N[:DELAY_MS] batch up to N waiting "
                                                  "requests for MODEL (repeatable)"),
         host: str = typer.Option("127.0.0.1"),
         control: str | None = typer.Option(None, help="control plane URL"),
         upstream: list[str] = typer.Option([], help="ID=URL[@RTT_MS] (repeatable)"),
         profile: str = typer.Option("full", help="zoo profile"),
         trace_file: Path | None = typer.Option(None, help="write spans here (JSON lines)"),
         otlp_endpoint: str | None = typer.Option(None, "--otlp-endpoint", help=OTLP_HELP),
         llm: list[str] = typer.Option([], help="NAME=MODEL a language model to serve over "
                                                "the OpenAI API, e.g. smollm2=smollm2-135m "
                                                "(repeatable)"),
         chat_task: str | None = typer.Option(None, help="serve the first --llm under this "
                                                          "task name too, e.g. chat"),
         llm_int8: bool = typer.Option(False, help="serve the --llm models in INT8 (a "
                                                   "device's own model and draft)"),
         verifier: str | None = typer.Option(None, help="NODE/MODEL: draft the first --llm "
                                                        "for that upstream's model "
                                                        "(speculative decoding)"),
         default_privacy: str = typer.Option("any", help="the privacy level of a request "
                                                         "that names none (local: fail "
                                                         "closed)"),
         ) -> None:
    """Run one node serving OIP v2 (and routing tasks upstream), and the OpenAI API for
    its language models."""
    from tierlink.core.types import Tier
    from tierlink.models.onnx import parse_providers
    from tierlink.node.main import run_node
    from tierlink.node.spec import ModelSource, NodeSpec

    try:
        if spec is not None:
            run_node(NodeSpec.load(spec))
            return
        if not node_id:
            raise typer.BadParameter("give --id (or --spec)")
        models = fleet_models(profile, model) if model else {}
        sources = tuple(ModelSource(m, str(models[m][0]), str(models[m][1])) for m in model)
        llms = tuple(_llm_source(text, llm_int8, verifier if i == 0 else None)
                     for i, text in enumerate(llm))
        tasks = {chat_task: llms[0].name} if chat_task and llms else {}
        run_node(NodeSpec(node_id=node_id, tier=Tier.parse(tier), models=sources, host=host,
                          llms=llms, chat_tasks=tasks,
                          port=port, control_url=control,
                          upstreams=tuple(_upstream(u) for u in upstream),
                          trace_file=str(trace_file) if trace_file else None,
                          otlp_endpoint=otlp_endpoint,
                          default_privacy=default_privacy,
                          providers=parse_providers(providers, "--providers"),
                          grpc_port=grpc_port, threads=threads,
                          batching=dict(_batch(b) for b in batch)))
    except TierlinkError as exc:
        fail(exc)


def _batch(text: str) -> tuple[str, Any]:
    """``MODEL=N[:DELAY_MS]`` as a model's batching settings (checked as the fleet file's)."""
    from tierlink.settings.batching import parse_batching

    name, _, value = text.partition("=")
    size, _, delay = value.partition(":")
    try:
        raw = {"max_batch": int(size), "max_delay_ms": float(delay or 0)}
    except ValueError:
        raise typer.BadParameter(f"--batch {text!r}: expected MODEL=N[:DELAY_MS], e.g. "
                                 "fmnist-large=8:2") from None
    if not name:
        raise typer.BadParameter(f"--batch {text!r}: name the model (MODEL=N)")
    return name, parse_batching({name: raw})[name]


def _llm_source(text: str, int8: bool, verifier: str | None) -> Any:
    from tierlink.llm.source import LMSource

    name, _, path = text.partition("=")
    if not name or not path:
        raise typer.BadParameter(f"--llm {text!r}: expected NAME=MODEL (e.g. smollm2=smollm2-135m)")
    return LMSource(name, path, quantize="int8" if int8 else None, verifier=verifier)


def _upstream(text: str) -> Any:
    from tierlink.node.spec import UpstreamSpec

    node_id, _, rest = text.partition("=")
    url, _, rtt = rest.partition("@")
    if not node_id or not url:
        raise typer.BadParameter(f"--upstream {text!r}: expected ID=URL[@RTT_MS]")
    return UpstreamSpec(node_id, url, rtt_ms=float(rtt) if rtt else 1.0)


@app.command("control")
def control_cmd(port: int = typer.Option(7000), host: str = typer.Option("127.0.0.1"),
                db: Path = typer.Option(Path("tierlink-registry.db")),
                ttl: float = typer.Option(5.0, help="seconds before a silent node expires"),
                admin_token_file: Path | None = typer.Option(
                    None, help="operators' token (created 0600 if absent; default "
                               "<db>.admin-token)"),
                open_registry: bool = typer.Option(
                    False, "--open", help="no credentials (a trusted loopback only)"),
                repo_dir: Path | None = typer.Option(
                    None, help="model repository blobs (default <db>.blobs)"),
                trusted_key: list[str] = typer.Option(
                    [], help="accept model versions signed by this ed25519 public key only "
                             "(repeatable)")) -> None:
    """Run the control plane (fleet registry, model repository, rollouts; SQLite)."""
    from tierlink.control.server import run_control

    try:
        run_control(host, port, db, ttl, admin_token_file=admin_token_file,
                    open_registry=open_registry, repo_dir=repo_dir,
                    trusted_publishers=tuple(trusted_key))
    except TierlinkError as exc:
        fail(exc)


@app.command()
def status(control: str = typer.Argument(..., help="control plane URL"),
           as_json: bool = typer.Option(False, "--json"),
           admin_token: str | None = typer.Option(None, envvar="TIERLINK_ADMIN_TOKEN",
                                                  help=ADMIN_TOKEN_HELP)) -> None:
    """The fleet as the control plane sees it."""
    import httpx

    from tierlink.errors import error_from_dict

    try:
        response = httpx.get(f"{control.rstrip('/')}/v1/nodes", timeout=3.0,
                             headers=admin_headers(admin_token), trust_env=False,
                             verify=fleet_verify())
    except httpx.HTTPError as exc:
        console.print(f"[red]error:[/red] cannot reach the control plane at {control}: {exc}")
        raise typer.Exit(2) from exc
    if response.status_code >= 400:
        fail(error_from_dict(response.json(), response.status_code))
    nodes = response.json()["nodes"]
    if as_json:
        print(json.dumps(nodes, indent=2))
        return
    table = Table(title=f"fleet at {control}")
    for col in ("node", "tier", "models", "queue", "in flight", "age s", "address"):
        table.add_column(col)
    for n in sorted(nodes, key=lambda n: (n["tier"], n["node_id"])):
        table.add_row(n["node_id"], n["tier"], _served(n["models"]),
                      str(n["queue_depth"]), str(n["inflight"]), f"{n.get('age_s', 0):.1f}",
                      n["address"])
    Console().print(table)


def _served(models: list[dict[str, Any]]) -> str:
    """``name@version`` per model, a canary as ``name@1+2(20%)``."""
    by_name: dict[str, list[str]] = {}
    for m in sorted(models, key=lambda m: m.get("role", "active") != "active"):
        weight = float(m.get("weight", 1.0))
        shown = str(m.get("version", "?")) if m.get("role", "active") == "active" \
            else f"{m.get('version', '?')}({weight:.0%})"
        by_name.setdefault(m["name"], []).append(shown)
    return ",".join(f"{name}@{'+'.join(versions)}" for name, versions in by_name.items())


def main() -> None:
    _stop_on_signals()
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM both stop a command the way Ctrl-C does (KeyboardInterrupt: every
    fleet, server and temporary file it holds is released) — also when it was started with
    SIGINT ignored, as a shell starts a background job, which would otherwise leave
    ``tierlink up`` impossible to stop but by SIGKILL and its processes orphaned."""
    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)


if __name__ == "__main__":
    main()
