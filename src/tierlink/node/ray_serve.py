"""A node's models on Ray Serve (``engine: ray``): one deployment per model, replicas that
autoscale on the requests they hold, fractional CPUs — behind the node's own OIP front door.

The node stays what it is (routing, admission, breakers, metrics, the OIP API); only the
model call moves: :class:`RayServeModel` is a :class:`~tierlink.models.runtime.ModelRuntime`
whose ``infer`` checks the inputs against the model's signature here (a malformed tensor
never reaches Ray) and sends them to the deployment through a Serve handle. Each replica
loads its model through the runtime registry (:mod:`tierlink.models.runtimes`: ONNX, a
user's Python model, any registered format) and answers ``{output name: array}``.

Lifecycle: :class:`RayHost` is the node's engine. On its first model it connects the node
process to the Ray cluster at ``address`` (``tierlink up`` starts one:
tierlink.engines.ray_cluster); it deploys every model version it is given — at start, and
at each install or rollback the node's model manager makes — as an application named
``tierlink-<node>-<model>-v<version>`` and waits until it runs; :meth:`RayHost.close`
deletes exactly those applications and disconnects — never the cluster, which belongs to
whoever started it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from tierlink.errors import ConfigError, RuntimeFailure
from tierlink.models.runtime import ModelInfo, validate_inputs
from tierlink.models.runtimes import LoadSpec
from tierlink.models.tensors import TensorDecl
from tierlink.settings.engine import EngineConfig

log = logging.getLogger("tierlink.node.ray")
CALL_TIMEOUT_S = 30.0
PLATFORM = "ray_serve_onnxruntime"


def replica_class() -> Any:
    """The deployment's class (made when Ray is there: importing this module needs none).
    A replica loads its model through the runtime registry, whatever its format."""
    from ray import serve

    @serve.deployment
    class ModelReplica:
        def __init__(self, spec: LoadSpec) -> None:
            from tierlink.models import runtimes

            self.runtime = runtimes.load(spec)

        def describe(self) -> tuple[ModelInfo, tuple[TensorDecl, ...], tuple[TensorDecl, ...]]:
            return self.runtime.info, tuple(self.runtime.inputs), tuple(self.runtime.outputs)

        def __call__(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(self.runtime.infer(feed))

    return ModelReplica


class RayServeModel:
    """A model version served by a Ray Serve deployment (see the module doc)."""

    platform = PLATFORM
    provider = "ray_serve"
    remote = True  # its calls wait on a replica: never run on the node's event loop

    def __init__(self, info: ModelInfo, inputs: tuple[TensorDecl, ...],
                 outputs: tuple[TensorDecl, ...], handle: Any, app: str) -> None:
        self.info, self.inputs, self.outputs = info, inputs, outputs
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


def app_name(node_id: str, model: str, version: str) -> str:
    return f"tierlink-{node_id}-{model}-v{version}"


class RayHost:
    """The Ray engine of one node: hosts each model version it is given (at node start, and
    at every install or rollback) as its own Serve application on the cluster at
    ``address``, and deletes exactly the applications it made (:meth:`close`)."""

    def __init__(self, node_id: str, address: str, config: EngineConfig) -> None:
        if not address:
            raise ConfigError(f"node {node_id} runs its models on Ray but has no ray_address",
                              hint="tierlink up starts a Ray cluster for engine: ray nodes")
        self.node_id, self.address, self.config = node_id, address, config
        self.served: dict[str, RayServeModel] = {}
        self._replica: Any = None

    def __call__(self, spec: LoadSpec) -> RayServeModel:
        """Deploy the model version ``spec`` describes; blocks until it runs."""
        from ray import serve

        card = spec.read_card()
        name, version = card.name, card.version
        app = app_name(self.node_id, name, version)
        handle = serve.run(self._deployment().options(
            name=name, max_ongoing_requests=self.config.max_ongoing_requests,
            ray_actor_options={"num_cpus": self.config.num_cpus},
            autoscaling_config=_autoscaling(self.config)).bind(spec),
            name=app, route_prefix=None)
        info, inputs, outputs = handle.describe.remote().result(timeout_s=CALL_TIMEOUT_S)
        model = RayServeModel(info, inputs, outputs, handle, app)
        self.served[app] = model
        log.info("%s version %s deployed on Ray Serve as %s (%d..%d replicas of %g CPU)",
                 name, version, app, self.config.min_replicas, self.config.max_replicas,
                 self.config.num_cpus)
        return model

    def close(self) -> None:
        """Delete this node's applications and disconnect (the cluster keeps running)."""
        if self._replica is None:
            return
        import ray
        from ray import serve

        for app in list(self.served):
            try:
                serve.delete(app, _blocking=True)
            except Exception as exc:  # noqa: BLE001 (the cluster may already be gone)
                log.warning("could not delete %s: %s", app, exc)
            del self.served[app]
        ray.shutdown()
        self._replica = None

    def _deployment(self) -> Any:
        if self._replica is None:
            import ray

            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False,
                     ignore_reinit_error=True)
            self._replica = replica_class()
        return self._replica


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
