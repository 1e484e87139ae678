"""A fleet with TLS on every hop (`security: {tls: true}`): node certificates from the
control plane at enrollment, mutual TLS between nodes, claims bound to the authenticated
sender — forged origins, unauthenticated peers, forwarded `local` inputs and replayed inbox
items refused and counted — and certificates that rotate under load losing nothing."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled
from tierlink.security.pki import Authority, CertIdentity, write_file
from tierlink.security.tls import TlsFiles, client_context

from .integration_support import infer, metric_sum

pytestmark = pytest.mark.integration

FLEET = """
name: itest-tls
seed: 5
zoo: {profile: test}
control: {ttl_s: 3}
security: {tls: true, cert_ttl_s: CERT_TTL}
routing:
  policy: tierlink
  thresholds: {fmnist-small: 0.99999, fmnist-medium: 0.9}  # the edge answers what it is sure of
nodes:
  - {id: cloud-1, tier: cloud,  models: [fmnist-large]}
  - {id: edge-1,  tier: edge,   models: [fmnist-medium]}
  - {id: dev-1,   tier: device, models: [fmnist-small]}
  - {id: dev-2,   tier: device, models: [fmnist-small]}
links:
  - {from: [dev-1, dev-2], to: edge-1, delay_ms: 2}
  - {from: edge-1, to: cloud-1, delay_ms: 5}
fault_injection: true
"""
ANY = {"tierlink.privacy": "any", "tierlink.deadline_ms": 5000.0}


def node_cert(fleet: RunningFleet, tmp_path: Path, node_id: str, tier: str) -> ssl.SSLContext:
    """A client context presenting a certificate the fleet CA issued for ``node_id`` (what a
    compromised or misbehaving node holds)."""
    assert fleet.pki is not None
    key, issued = Authority.load(fleet.pki.ca_dir).issue_pair(
        CertIdentity("node", node_id, tier), (), time.time(), 600.0)
    write_file(tmp_path / f"{node_id}.key", key, 0o600)
    write_file(tmp_path / f"{node_id}.pem", issued.cert_pem, 0o644)
    return client_context(TlsFiles(fleet.pki.ca_file, tmp_path / f"{node_id}.pem",
                                   tmp_path / f"{node_id}.key"))


@pytest.fixture
def tls_fleet(start_fleet: Callable[[str], RunningFleet]) -> RunningFleet:
    return start_fleet(FLEET.replace("CERT_TTL", "600"))


@pytest.fixture
def clients(tls_fleet: RunningFleet, tmp_path: Path) -> Iterator[dict[str, httpx.Client]]:
    """An operator, an application without a certificate, and nodes dev-1 and dev-2."""
    assert tls_fleet.pki is not None
    verify = {"operator": tls_fleet.verify(),
              "anonymous": tls_fleet.pki.client_context(operator=False),
              "dev-1": node_cert(tls_fleet, tmp_path, "dev-1", "device"),
              "dev-2": node_cert(tls_fleet, tmp_path, "dev-2", "device")}
    made = {who: httpx.Client(verify=v, timeout=10.0, trust_env=False)
            for who, v in verify.items()}
    yield made
    for client in made.values():
        client.close()


def refusals(client: httpx.Client, fleet: RunningFleet, node: str, reason: str) -> float:
    return metric_sum(client, fleet.node_urls[node], "tierlink_peer_refusals_total",
                      reason=reason)


def test_every_hop_runs_tls_with_node_certificates(
        tls_fleet: RunningFleet, clients: dict[str, httpx.Client], fmnist_test: Labelled,
        cloud_samples: np.ndarray) -> None:
    fleet, op = tls_fleet, clients["operator"]
    assert all(url.startswith("https://") for url in
               [fleet.control_url, *fleet.node_urls.values()])
    x = fmnist_test.input[cloud_samples[0]: cloud_samples[0] + 1]
    answer = infer(clients["anonymous"], fleet.node_urls["dev-1"], "fmnist", x, ANY)
    assert answer.status == 200, answer.error
    assert answer.path == ["dev-1", "edge-1", "cloud-1"]  # two node-to-node TLS hops
    for node in fleet.node_urls:
        tls = op.get(f"{fleet.node_urls[node]}/tierlink/v1/status").json()["tls"]
        assert tls["identity"].startswith("urn:tierlink:node:") and tls["identity"].endswith(
            f":{node}") and tls["managed"], tls
    # An operator's command verifies the control plane with the fleet CA (TIERLINK_CA).
    assert fleet.pki is not None
    env = dict(os.environ, TIERLINK_ADMIN_TOKEN=fleet.admin_token,
               TIERLINK_CA=str(fleet.pki.ca_file), TIERLINK_CERT=str(fleet.pki.operator.cert),
               TIERLINK_KEY=str(fleet.pki.operator.key))
    listed = subprocess.run([sys.executable, "-m", "tierlink.cli.main", "enroll", "list",
                             "--control", fleet.control_url, "--json"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0, listed.stderr
    assert {n["node_id"] for n in json.loads(listed.stdout)} == set(fleet.node_urls)
    examples = subprocess.run([sys.executable, "-m", "tierlink.cli.main", "hard-examples",
                               "list", fleet.control_url, "--json"], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
    assert examples.returncode == 0, examples.stderr
    assert isinstance(json.loads(examples.stdout), list)
    with pytest.raises(httpx.HTTPError):  # no plain HTTP anywhere
        httpx.get(fleet.node_urls["edge-1"].replace("https", "http") + "/v2/health/live",
                  timeout=2.0)
    with pytest.raises(httpx.HTTPError):  # nor a certificate from another CA
        rogue = Authority.create("rogue", time.time())
        httpx.get(fleet.node_urls["edge-1"] + "/v2/health/live", verify=rogue_ctx(rogue),
                  timeout=2.0)


def grpc_infer(target: str, ca: Path, x: np.ndarray, params: dict[str, Any],
               pair: tuple[Path, Path] | None = None) -> Any:
    """A routed request through the stock ``tritonclient.grpc`` client over TLS (trusting
    ``ca``, presenting ``pair`` = (certificate, key) where given)."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(
        url=target, ssl=True, root_certificates=str(ca),
        certificate_chain=str(pair[0]) if pair else None,
        private_key=str(pair[1]) if pair else None)
    try:
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("fmnist", [inp], parameters=params, client_timeout=30.0)
    finally:
        client.close()


def test_the_grpc_api_serves_tls_with_the_node_certificate(
        tls_fleet: RunningFleet, fmnist_test: Labelled, cloud_samples: np.ndarray) -> None:
    """The protocol's gRPC API on a fleet with TLS: the stock client trusting the fleet CA is
    answered (its request routed over the nodes' TLS hops); plain gRPC is not served."""
    from tritonclient.utils import InferenceServerException

    fleet = tls_fleet
    assert fleet.pki is not None and set(fleet.node_grpc) == set(fleet.node_urls)
    x = fmnist_test.input[cloud_samples[0]: cloud_samples[0] + 1]
    result = grpc_infer(fleet.node_grpc["dev-1"], fleet.pki.ca_file, x, ANY)
    assert result.as_numpy("probabilities").shape == (1, 10)
    assert result.get_response().parameters["tierlink.served_by"].string_param == "cloud-1"
    plain = pytest.importorskip("tritonclient.grpc").InferenceServerClient(
        url=fleet.node_grpc["dev-1"])
    with pytest.raises(InferenceServerException):
        plain.is_server_live(client_timeout=3.0)
    plain.close()


def rogue_ctx(rogue: Authority) -> ssl.SSLContext:
    """Trusts the fleet's server (no verification) but presents a foreign certificate."""
    import tempfile

    folder = Path(tempfile.mkdtemp())
    key, issued = rogue.issue_pair(CertIdentity("node", "edge-9", "edge"), (), time.time(), 60)
    (folder / "k").write_bytes(key)
    (folder / "c").write_bytes(issued.cert_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.load_cert_chain(str(folder / "c"), str(folder / "k"))
    return ctx


def test_claims_are_bound_to_the_sender(
        tls_fleet: RunningFleet, clients: dict[str, httpx.Client], fmnist_test: Labelled) -> None:
    fleet, edge = tls_fleet, tls_fleet.node_urls["edge-1"]
    x = fmnist_test.input[:1]

    def send(who: str, **params: object) -> tuple[int, str]:
        answer = infer(clients[who], edge, "fmnist", x, {**ANY, **params})
        return answer.status, str(answer.error.get("details", {}).get("reason", ""))

    # An application speaks for the node it calls; a node for itself (and what is below).
    assert send("anonymous")[0] == 200
    assert send("anonymous", **{"tierlink.origin": "dev-1"}) == (403, "forged_origin")
    assert send("dev-1", **{"tierlink.origin": "dev-1"})[0] == 200
    assert send("dev-1")[0] == 200  # no origin named: the sender is the origin
    assert send("dev-1", **{"tierlink.origin": "dev-2"}) == (403, "forged_origin")
    assert send("dev-1", **{"tierlink.origin": "edge-1"}) == (403, "forged_origin")
    assert send("anonymous", **{"tierlink.hops": 1}) == (403, "unauthenticated_peer")
    assert send("dev-1", **{"tierlink.privacy": "local"}) == (403, "local_forwarded")
    op = clients["operator"]
    assert refusals(op, fleet, "edge-1", "forged_origin") == 3
    assert refusals(op, fleet, "edge-1", "unauthenticated_peer") == 1
    assert refusals(op, fleet, "edge-1", "local_forwarded") == 1

    # Peer endpoints: fault injection for operators and nodes, the inbox for nodes only.
    faults = f"{edge}/tierlink/v1/faults"
    assert clients["anonymous"].post(faults, json={"slowdown": 1.0}).status_code == 403
    assert op.post(faults, json={"slowdown": 1.0}).status_code == 200
    item = {"key": "dev-1:tls-1", "kind": "result", "payload": {"answer": 7},
            "created_at": time.time()}
    inbox = f"{edge}/tierlink/v1/inbox"
    assert clients["anonymous"].post(inbox, json={"from": "dev-1", "items": [item]}
                                     ).status_code == 403
    assert clients["dev-2"].post(inbox, json={"from": "dev-1", "items": [item]}
                                 ).status_code == 403  # a batch in another node's name
    first = clients["dev-1"].post(inbox, json={"from": "dev-1", "items": [item]})
    again = clients["dev-1"].post(inbox, json={"from": "dev-1", "items": [item]})
    replay = clients["dev-2"].post(inbox, json={"from": "dev-2", "items": [item]})
    assert [first.json()["acks"][0]["status"], again.json()["acks"][0]["status"]] == \
        ["ok", "duplicate"]  # the sender lost an ack: nothing applied twice
    assert replay.json()["acks"][0]["status"] == "rejected", replay.text
    assert replay.json()["acks"][0]["detail"].startswith("replayed")
    assert refusals(op, fleet, "edge-1", "replayed") == 1
    assert refusals(op, fleet, "edge-1", "unauthenticated_peer") == 3
    assert refusals(op, fleet, "edge-1", "forged_origin") == 4


def test_certificates_rotate_under_load_losing_nothing(
        start_fleet: Callable[[str], RunningFleet], fmnist_test: Labelled,
        hard_samples: np.ndarray) -> None:
    fleet = start_fleet(FLEET.replace("CERT_TTL", "10"))  # renewed every ~6.7 s
    assert fleet.pki is not None
    op = httpx.Client(verify=fleet.verify(), timeout=10.0, trust_env=False)
    first = {n: op.get(f"{u}/tierlink/v1/status").json()["tls"]["serial"]
             for n, u in fleet.node_urls.items()}
    statuses: list[int] = []
    stop = threading.Event()

    def load(entry: str) -> None:
        with httpx.Client(verify=fleet.pki.client_context(operator=False),  # type: ignore[union-attr]
                          timeout=10.0, trust_env=False) as app:
            i = 0
            while not stop.is_set():
                x = fmnist_test.input[hard_samples[i % len(hard_samples)]][None]
                statuses.append(infer(app, fleet.node_urls[entry], "fmnist", x, ANY).status)
                i += 1

    threads = [threading.Thread(target=load, args=(n,)) for n in ("dev-1", "dev-2")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30.0
    try:
        while time.monotonic() < deadline:
            tls = {n: op.get(f"{u}/tierlink/v1/status").json()["tls"]
                   for n, u in fleet.node_urls.items()}
            if all(t["renewals"] >= 2 for t in tls.values()):
                break
            time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
        op.close()
    assert all(t["renewals"] >= 2 and t["serial"] != first[n] for n, t in tls.items()), tls
    assert all(t["renewal_failures"] == 0 for t in tls.values()), tls
    assert len(statuses) > 50 and set(statuses) == {200}, json.dumps(
        {s: statuses.count(s) for s in set(statuses)})


def test_required_client_certificates_turn_away_anonymous_callers(
        start_fleet: Callable[[str], RunningFleet], fmnist_test: Labelled,
        cloud_samples: np.ndarray, tmp_path: Path) -> None:
    """`client_auth: required`: a caller without a fleet certificate fails the handshake at
    every node; an application with one (`tierlink pki issue client APP`) is answered, and
    the nodes still forward to each other (each presents its own)."""
    fleet = start_fleet(FLEET.replace("CERT_TTL", "600").replace(
        "security: {tls: true,", "security: {tls: true, client_auth: required,"))
    assert fleet.pki is not None
    with httpx.Client(verify=fleet.pki.client_context(operator=False), timeout=10.0,
                      trust_env=False) as anonymous:
        for url in fleet.node_urls.values():
            with pytest.raises(httpx.HTTPError):
                anonymous.get(f"{url}/v2/health/live")
    key, issued = Authority.load(fleet.pki.ca_dir).issue_pair(
        CertIdentity("client", "app"), (), time.time(), 600.0)
    write_file(tmp_path / "app.key", key, 0o600)
    write_file(tmp_path / "app.pem", issued.cert_pem, 0o644)
    verify = client_context(TlsFiles(fleet.pki.ca_file, tmp_path / "app.pem",
                                     tmp_path / "app.key"))
    x = fmnist_test.input[cloud_samples[0]: cloud_samples[0] + 1]
    with httpx.Client(verify=verify, timeout=10.0, trust_env=False) as app:
        answer = infer(app, fleet.node_urls["dev-1"], "fmnist", x, ANY)
    assert answer.status == 200, answer.error
    assert answer.path == ["dev-1", "edge-1", "cloud-1"]
    # The gRPC API asks for the certificate as well, and binds the caller's claims to it.
    from tritonclient.utils import InferenceServerException

    grpc_at = fleet.node_grpc["edge-1"]
    with pytest.raises(InferenceServerException):
        grpc_infer(grpc_at, fleet.pki.ca_file, x, ANY)  # no certificate: no handshake
    app_pair = (tmp_path / "app.pem", tmp_path / "app.key")
    served = grpc_infer(grpc_at, fleet.pki.ca_file, x, ANY, app_pair)
    assert served.as_numpy("probabilities").shape == (1, 10)
    node_cert(fleet, tmp_path, "dev-2", "device")  # a device that claims dev-1's input
    with pytest.raises(InferenceServerException) as forged:
        grpc_infer(grpc_at, fleet.pki.ca_file, x, {**ANY, "tierlink.origin": "dev-1"},
                   (tmp_path / "dev-2.pem", tmp_path / "dev-2.key"))
    assert "PERMISSION_DENIED" in str(forged.value.status()), forged.value.message()
    assert "may not relay an input of dev-1" in forged.value.message()
