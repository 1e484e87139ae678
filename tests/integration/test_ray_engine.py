"""A cloud tier on Ray Serve (`engine: ray`): `tierlink up` starts a Ray cluster, the cloud
node deploys its model there and answers through its own OIP front door (the same answers
as ONNX Runtime in process; a malformed tensor refused before Ray), and stopping the fleet
ends exactly the cluster it started. And a two-node Ray cluster across network namespaces:
the replica runs on the worker in its own namespace. And a version rolled out to a Ray node
is served through Ray, like the version it started with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from tierlink.engines import ray_cluster
from tierlink.fleet.launcher import RunningFleet
from tierlink.models.data import Labelled
from tierlink.models.onnx import OnnxModel
from tierlink.models.runtime import ModelInfo
from tierlink.netns.fabric import Fabric, in_netns
from tierlink.netports import pick_port

from .integration_support import Models, infer, tierlink, wait_for

pytestmark = pytest.mark.integration

FLEET = """
name: itest-ray
seed: 3
zoo: {profile: test}
control: {ttl_s: 3}
routing:
  policy: tierlink
  thresholds: {fmnist-small: 0.99999}
nodes:
  - {id: cloud-1, tier: cloud, models: [fmnist-large], engine: ray, workers: 4,
     ray: {min_replicas: 1, max_replicas: 2, num_cpus: 0.5}}
  - {id: dev-1, tier: device, models: [fmnist-small]}
links:
  - {from: dev-1, to: cloud-1, delay_ms: 2}
"""


def local_logits(models: Models, x: np.ndarray) -> np.ndarray:
    onnx, card = models["fmnist-large"]
    return OnnxModel(onnx, ModelInfo.from_card(card)).infer({"input": x})["logits"]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_cloud_node_serves_through_ray_serve_and_stops_its_cluster(
        start_fleet: Callable[[str], RunningFleet], zoo_models: Models, http: httpx.Client,
        fmnist_test: Labelled, hard_samples: np.ndarray) -> None:
    fleet = start_fleet(FLEET)
    cloud = fleet.node_urls["cloud-1"]
    meta = http.get(f"{cloud}/v2/models/fmnist-large").json()
    assert meta["platform"] == "ray_serve_onnxruntime" and \
        meta["parameters"]["provider"] == "ray_serve"
    engine = http.get(f"{cloud}/tierlink/v1/status").json()["engine"]
    assert engine == {"kind": "ray", "replicas": {"fmnist-large": 1}}

    x = fmnist_test.input[hard_samples[0]: hard_samples[0] + 1]
    routed = infer(http, fleet.node_urls["dev-1"], "fmnist", x,
                   {"tierlink.privacy": "any", "tierlink.deadline_ms": 5000.0})
    assert routed.status == 200 and routed.path == ["dev-1", "cloud-1"], routed.error
    direct = infer(http, cloud, "fmnist-large", fmnist_test.input[:4])
    assert direct.status == 200, direct.error
    np.testing.assert_allclose(direct.outputs["logits"],
                               local_logits(zoo_models, fmnist_test.input[:4]), rtol=1e-4,
                               atol=1e-5)
    bad = infer(http, cloud, "fmnist-large", np.zeros((1, 1, 27, 28), np.float32))
    assert bad.status == 400 and "shape" in bad.error["error"]

    head = fleet.procs["ray-head"].pid
    assert group_alive(head)
    fleet.stop()
    wait_for(lambda: not group_alive(head) or None, 30, "the Ray cluster's processes ending")


ROLLOUT_FLEET = FLEET.replace("name: itest-ray", "name: itest-ray-rollout") + \
    "trusted_keys: [%s]\n"


def test_a_version_rolled_out_to_a_ray_node_is_served_through_ray(
        start_fleet: Callable[[str], RunningFleet], zoo_models: Models, http: httpx.Client,
        fmnist_test: Labelled, tmp_path: Path) -> None:
    key = tmp_path / "publisher.key"
    public = tierlink("model", "keygen", "--out", str(key)).strip().splitlines()[-1]
    fleet = start_fleet(ROLLOUT_FLEET % public)
    token, url, cloud = fleet.admin_token, fleet.control_url, fleet.node_urls["cloud-1"]
    onnx, card = zoo_models["fmnist-large"]
    tierlink("model", "publish", "fmnist-large", str(onnx), "--card", str(card), "--version",
             "2", "--notes", "the same weights, rolled out on Ray", "--key", str(key),
             "--control", url, "--eval-limit", "100", token=token)
    tierlink("rollout", "start", "fmnist-large", "2", "--tier", "cloud", "--stages", "1",
             "--soak", "1s", "--control", url, token=token)

    def on_version_2() -> bool | None:
        meta = http.get(f"{cloud}/v2/models/fmnist-large").json()
        return meta["versions"] == ["2"] or None

    wait_for(on_version_2, 120, "cloud-1 serving fmnist-large version 2")
    meta = http.get(f"{cloud}/v2/models/fmnist-large/versions/2").json()
    assert meta["platform"] == "ray_serve_onnxruntime" and \
        meta["parameters"]["provider"] == "ray_serve"
    answer = infer(http, cloud, "fmnist-large", fmnist_test.input[:4])
    assert answer.status == 200, answer.error
    np.testing.assert_allclose(answer.outputs["logits"],
                               local_logits(zoo_models, fmnist_test.input[:4]), atol=1e-5)


RUNTIMES_FLEET = """
name: itest-ray-runtimes
seed: 3
zoo: {profile: test}
control: {ttl_s: 3}
routing: {policy: tierlink}
nodes:
  - {id: cloud-1, tier: cloud, models: [toy-py, toy-exits, fmnist-exits], engine: ray,
     workers: 2,
     ray: {min_replicas: 1, max_replicas: 1, num_cpus: 0.5}}
"""


def test_a_python_model_and_a_multi_exit_model_are_served_through_ray(
        zoo_models: Models, http: httpx.Client, fmnist_test: Labelled, tmp_path: Path) -> None:
    """Ray hosts whatever runtime a card's format names: a user's Python model, a user's
    imported multi-exit model and the zoo's multi-exit net answer through the cloud node's
    front door as they do in process."""
    import byo_support as byo
    from tierlink.models import runtimes
    from tierlink.models.runtimes import LoadSpec
    from tierlink.modelstore.importer import ImportRequest, import_model
    from tierlink.modelstore.store import ModelStore
    from tierlink.zoo.exits import ensure_exits

    from .integration_support import running_fleet

    store = ModelStore(tmp_path / "store")
    x, y = byo.classification_data()
    data = byo.save_npz(tmp_path / "d.npz", x=x, y=y)
    import_model(ImportRequest("toy-py", byo.python_classifier(tmp_path / "src"), "toy",
                               "cloud", data), store)
    import_model(ImportRequest("toy-exits", byo.multi_exit(tmp_path / "segments"), "toy",
                               "cloud", data, model_format="multi-exit"), store)
    exits = ensure_exits("test", root=tmp_path / "exits-zoo")
    models = {"toy-py": store.paths("toy-py"), "toy-exits": store.paths("toy-exits"),
              "fmnist-exits": (exits.whole_path, exits.card_path)}
    with running_fleet(RUNTIMES_FLEET, tmp_path / "fleet", models) as fleet:
        cloud = fleet.node_urls["cloud-1"]
        engine = http.get(f"{cloud}/tierlink/v1/status").json()["engine"]
        assert engine == {"kind": "ray",
                          "replicas": {"toy-py": 1, "toy-exits": 1, "fmnist-exits": 1}}
        features = byo.features(6, seed=3)
        toy = infer(http, cloud, "toy-py", features, input_name="x")
        assert toy.status == 200, toy.error
        np.testing.assert_allclose(toy.outputs["logits"], features @ byo.W_CLS + byo.B_CLS,
                                   rtol=1e-5, atol=1e-6)
        toy_exits = infer(http, cloud, "toy-exits", features, input_name="x")
        assert toy_exits.status == 200, toy_exits.error
        np.testing.assert_array_equal(np.exp(toy_exits.outputs["logits"]).argmax(axis=1),
                                      (features @ byo.W_CLS + byo.B_CLS).argmax(axis=1))
        assert set(toy_exits.outputs["exit"].tolist()) <= {0, 1}
        images = fmnist_test.input[:8]
        answered = infer(http, cloud, "fmnist-exits", images)
        assert answered.status == 200, answered.error
    local = runtimes.load(LoadSpec(card=exits.card_path)).infer({"input": images})
    np.testing.assert_array_equal(answered.outputs["exit"], local["exit"])
    np.testing.assert_allclose(answered.outputs["logits"], local["logits"], atol=1e-5)


DRIVER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import numpy as np
    import ray
    from tierlink.models.runtimes import LoadSpec
    from tierlink.node.ray_serve import RayHost
    from tierlink.settings.engine import EngineConfig

    address, onnx, card = sys.argv[1:4]
    ray.init(address=address, log_to_driver=False)
    deadline = time.monotonic() + 60
    while sum(n["Alive"] for n in ray.nodes()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    nodes = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
    host = RayHost("cloud-ns", address, EngineConfig(kind="ray", min_replicas=1,
                                                     max_replicas=1, num_cpus=0.5))
    served = host(LoadSpec(card=Path(card), model_file=Path(onnx)))
    x = np.load(sys.argv[4])
    logits = served.infer({"input": x})["logits"]
    host.close()
    print(json.dumps({"nodes": nodes, "logits": logits.tolist()}))
""")


def test_a_two_node_ray_cluster_across_namespaces(zoo_models: Models, tmp_path: Path,
                                                 fmnist_test: Labelled) -> None:
    fabric = Fabric.create(["ray-worker"])
    gateway, worker_host = fabric.plan.gateway, fabric.plan.host("ray-worker")
    port = pick_port(gateway)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # The head has no CPUs: the replica can only run on the worker in the namespace.
        head = ray_cluster.start(ray_cluster.head_command(gateway, port, 0),
                                 tmp_path / "head.log")
        procs.append(head)
        ray_cluster.wait_listening(gateway, port, head)
        procs.append(ray_cluster.start(in_netns(worker_host, ray_cluster.worker_command(
            f"{gateway}:{port}", worker_host.address, 1)), tmp_path / "worker.log"))
        x = fmnist_test.input[:2]
        np.save(tmp_path / "x.npy", x)
        onnx, card = zoo_models["fmnist-large"]
        out = subprocess.run([sys.executable, "-c", DRIVER, f"{gateway}:{port}", str(onnx),
                              str(card), str(tmp_path / "x.npy")], capture_output=True,
                             text=True, timeout=180, env=ray_cluster.ray_env(), check=False)
        assert out.returncode == 0, out.stderr[-3000:]
        answer = json.loads(out.stdout.strip().splitlines()[-1])
        assert answer["nodes"] == sorted([gateway, worker_host.address])
        np.testing.assert_allclose(np.array(answer["logits"]), local_logits(zoo_models, x),
                                   rtol=1e-4, atol=1e-5)
    finally:
        for proc in reversed(procs):
            ray_cluster.stop(proc)
        fabric.destroy()
    assert not any(group_alive(p.pid) for p in procs)
