"""A node's models on Ray Serve (``engine: ray``): one deployment per model, replicas that
autoscale on the requests they hold, fractional CPUs — behind the node's own OIP front door.

The node stays what it is (routing, admission, breakers, metrics, the OIP API); only the
model call moves: :class:`RayServeModel` is a :class:`~tierlink.node.runtime.ModelRuntime`
whose ``infer`` checks the inputs against the model's signature here (a malformed tensor
never reaches Ray) and sends them to the deployment through a Serve handle. Each replica
holds one ONNX Runtime session (one thread) and answers ``{output name: array}``.

Lifecycle: :func:`deploy` connects the node process to the Ray cluster at ``address``
(``tierlink up`` starts one: tierlink.engines.ray_cluster), deploys every model as an application
named ``tierlink-<node>-<model>`` and waits until they run; :func:`undeploy` deletes exactly
those applications and disconnects — never the cluster, which belongs to whoever started it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.errors import ConfigError, RuntimeFailure
from tierlink.models.tensors import TensorDecl
from tierlink.node.runtime import ModelInfo, validate_inputs
from tierlink.settings.engine import EngineConfig

log = logging.getLogger("tierlink.node.ray")
CALL_TIMEOUT_S = 30.0
PLATFORM = "ray_serve_onnxruntime"


@dataclass(frozen=True, slots=True)
class Signature:
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]


def signature(path: Path) -> Signature:
    """A model's inputs and outputs, read from the ONNX graph (no session here: the
    replicas hold those)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}

    def spec(value: Any) -> TensorDecl:
        t = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
        return TensorDecl(value.name, _OIP_TYPES.get(t.elem_type, "BYTES"), shape)

    return Signature(tuple(spec(v) for v in graph.input if v.name not in initializers),
                     tuple(spec(v) for v in graph.output))


# onnx.TensorProto element types -> OIP datatypes
_OIP_TYPES = {1: "FP32", 2: "UINT8", 3: "INT8", 6: "INT32", 7: "INT64", 9: "BOOL",
              10: "FP16", 11: "FP64"}


def replica_class() -> Any:
    """The deployment's class (made when Ray is there: importing this module needs none)."""
    from ray import serve

    @serve.deployment
    class OnnxReplica:
        def __init__(self, path: str) -> None:
            from tierlink.models.onnx import open_session

            self.session = open_session(Path(path), ("CPUExecutionProvider",), 1).session
            self.names = [o.name for o in self.session.get_outputs()]

        def __call__(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(self.names, self.session.run(None, feed), strict=True))

    return OnnxReplica


class RayServeModel:
    """A model served by a Ray Serve deployment (see the module doc)."""

    platform = PLATFORM
    provider = "ray_serve"
    remote = True  # its calls wait on a replica: never run on the node's event loop

    def __init__(self, info: ModelInfo, sig: Signature, handle: Any, app: str) -> None:
        self.info, self.inputs, self.outputs = info, sig.inputs, sig.outputs
        self.app = app
        self._handle = handle

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = validate_inputs(self.info.name, self.inputs, inputs)
        try:
            answer = self._handle.remote(feed).result(timeout_s=CALL_TIMEOUT_S)
        except Exception as exc:  # Ray's errors become ours at this boundary
            raise RuntimeFailure(f"{self.info.name} on Ray Serve failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
        return {spec.name: np.asarray(answer[spec.name]) for spec in self.outputs}


def app_name(node_id: str, model: str) -> str:
    return f"tierlink-{node_id}-{model}"


def deploy(node_id: str, models: dict[str, tuple[Path, ModelInfo]], address: str,
           config: EngineConfig) -> dict[str, RayServeModel]:
    """Deploy ``models`` (name: (onnx, info)) on the cluster at ``address``; blocks until
    every deployment runs."""
    if not address:
        raise ConfigError(f"node {node_id} runs its models on Ray but has no ray_address",
                          hint="tierlink up starts a Ray cluster for engine: ray nodes")
    import ray
    from ray import serve

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False,
             ignore_reinit_error=True)
    replica = replica_class()
    served = {}
    for name, (path, info) in models.items():
        app = app_name(node_id, name)
        handle = serve.run(replica.options(
            name=name, max_ongoing_requests=config.max_ongoing_requests,
            ray_actor_options={"num_cpus": config.num_cpus},
            autoscaling_config=_autoscaling(config)).bind(str(path)),
            name=app, route_prefix=None)
        served[name] = RayServeModel(info, signature(path), handle, app)
        log.info("%s deployed on Ray Serve as %s (%d..%d replicas of %g CPU)", name, app,
                 config.min_replicas, config.max_replicas, config.num_cpus)
    return served


def _autoscaling(config: EngineConfig) -> dict[str, Any]:
    return {"min_replicas": config.min_replicas, "max_replicas": config.max_replicas,
            "target_ongoing_requests": config.target_ongoing_requests,
            "upscale_delay_s": config.upscale_delay_s,
            "downscale_delay_s": config.downscale_delay_s,
            "metrics_interval_s": 0.5, "look_back_period_s": 2.0}


def replicas(model: Any) -> int:
    """How many replicas of ``model`` (a :class:`RayServeModel`) run now (status)."""
    from ray import serve

    status = serve.status().applications.get(model.app)
    if status is None:
        return 0
    deployment = status.deployments.get(model.info.name)
    if deployment is None:
        return 0
    return sum(n for state, n in deployment.replica_states.items()
               if str(getattr(state, "value", state)) == "RUNNING")


def undeploy(served: dict[str, RayServeModel]) -> None:
    """Delete this node's applications and disconnect (the cluster keeps running)."""
    if not served:
        return
    import ray
    from ray import serve

    for model in served.values():
        try:
            serve.delete(model.app, _blocking=True)
        except Exception as exc:  # noqa: BLE001 (the cluster may already be gone)
            log.warning("could not delete %s: %s", model.app, exc)
    ray.shutdown()
