"""A real Prometheus for a running fleet (`tierlink up --prometheus`).

It scrapes every node and control-plane replica through file-based service discovery
(``<run dir>/prometheus/targets.json``, rewritten when a node joins), with the recording
and alerting rules of ``deploy/rules/`` loaded, so `tierlink:*` series and alerts are
there to query and the dashboard in ``deploy/grafana-dashboard.json`` has data.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from tierlink.errors import ConfigError, TierlinkError
from tierlink.security.tls import TlsFiles

RULES = Path(__file__).resolve().parents[3] / "deploy" / "rules" / "tierlink.rules.yml"
SCRAPE_S = 2.0
INSTALL_HINT = "install it (apt-get install prometheus) or run without --prometheus"


class PrometheusError(TierlinkError):
    code = "prometheus_error"
    hint = "see <run dir>/logs/prometheus.log"


def binary() -> str:
    found = shutil.which("prometheus") or next(
        (p for p in ("/usr/bin/prometheus", "/usr/local/bin/prometheus") if Path(p).is_file()),
        None)
    if found is None:
        raise ConfigError("--prometheus needs the prometheus server, which is not installed",
                          hint=INSTALL_HINT)
    return found


def config_text(targets_file: Path, rules: Path | None, scrape_s: float = SCRAPE_S,
                tls: TlsFiles | None = None) -> str:
    """``tls``: the fleet runs TLS; Prometheus scrapes over HTTPS, verifying the fleet CA
    and presenting these (an operator's) certificate and key."""
    rule_files = f'rule_files: ["{rules}"]\n' if rules is not None else ""
    https = "" if tls is None else (
        "    scheme: https\n"
        f"    tls_config: {{ca_file: \"{tls.ca}\", cert_file: \"{tls.cert}\", "
        f"key_file: \"{tls.key}\"}}\n")
    return (f"# written by tierlink up --prometheus; targets follow the fleet\n"
            f"global: {{scrape_interval: {scrape_s:g}s, scrape_timeout: {scrape_s:g}s, "
            f"evaluation_interval: {scrape_s:g}s}}\n"
            f"{rule_files}"
            "scrape_configs:\n"
            "  - job_name: tierlink\n"
            f"    file_sd_configs: [{{files: [\"{targets_file}\"], refresh_interval: 5s}}]\n"
            f"{https}")


def write_targets(path: Path, nodes: Mapping[str, str], controls: Sequence[str]) -> None:
    """The file_sd targets: each node (labelled with its id) and each control replica."""
    groups = [{"targets": [_address(url)],
               "labels": {"node": node_id, "role": "node"}} for node_id, url in nodes.items()]
    groups += [{"targets": [_address(url)],
                "labels": {"node": f"control-{i}", "role": "control"}}
               for i, url in enumerate(controls) if url]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=1))
    tmp.replace(path)  # Prometheus never reads half a file


def _address(url: str) -> str:
    return url.removeprefix("http://").removeprefix("https://")


def start(run_dir: Path, host: str, port: int, nodes: Mapping[str, str],
          controls: Sequence[str], log: Path, scrape_s: float = SCRAPE_S,
          tls: TlsFiles | None = None) -> subprocess.Popen[bytes]:
    """Prometheus on ``host:port`` for this fleet; returns once it answers ready."""
    exe = binary()
    home = run_dir / "prometheus"
    home.mkdir(exist_ok=True)
    targets = home / "targets.json"
    write_targets(targets, nodes, controls)
    config = home / "prometheus.yml"
    config.write_text(config_text(targets, RULES if RULES.is_file() else None, scrape_s, tls))
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={home / 'tsdb'}",
             f"--web.listen-address={host}:{port}", "--log.level=warn"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    _wait_ready(f"http://{host}:{port}", proc, log)
    return proc


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path,
                timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PrometheusError(f"prometheus exited with code {proc.returncode}: "
                                  f"{log.read_text(errors='replace')[-500:]}")
        try:
            if httpx.get(f"{url}/-/ready", timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise PrometheusError(f"prometheus at {url} was not ready after {timeout_s:.0f} s")
