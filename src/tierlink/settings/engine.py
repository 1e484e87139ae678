"""How a node runs its models: ONNX Runtime in the node process (the default), or Ray Serve
(``engine: ray``, cloud tiers): one deployment per model whose replicas scale with the
requests in flight.

    nodes:
      - id: cloud-1
        tier: cloud
        models: [fmnist-large]
        engine: ray
        ray: {min_replicas: 1, max_replicas: 2, num_cpus: 0.5, target_ongoing_requests: 2}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tierlink.errors import ConfigError
from tierlink.settings.fields import as_float, as_int, as_mapping, known

ENGINES = ("onnxruntime", "ray")
_RAY_KEYS = ("min_replicas", "max_replicas", "num_cpus", "target_ongoing_requests",
             "max_ongoing_requests", "upscale_delay_s", "downscale_delay_s")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # onnxruntime: the models run in the node's process; ray: each model is a Ray Serve
    # deployment on the cluster `tierlink up` starts (tuned with `ray:`)
    kind: str = "onnxruntime"
    min_replicas: int = 1  # per model: the autoscaler never goes below this many replicas
    max_replicas: int = 2  # per model: the most it scales to (left out: 2, or min_replicas)
    num_cpus: float = 0.5  # per replica: fractional, so replicas fit a small machine
    target_ongoing_requests: float = 2.0  # per replica: the autoscaler's target
    max_ongoing_requests: int = 100  # per replica (Serve's default collapses on 2 cores)
    upscale_delay_s: float = 1.0  # seconds the load must call for more replicas before one is added
    downscale_delay_s: float = 30.0  # seconds it must call for fewer before one is removed

    @property
    def on_ray(self) -> bool:
        return self.kind == "ray"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fleet_keys(self) -> dict[str, Any]:
        """A node's ``engine:`` (and ``ray:``) keys in the fleet file."""
        if not self.on_ray:
            return {"engine": self.kind}
        ray = {k: v for k, v in asdict(self).items() if k != "kind"}
        return {"engine": self.kind, "ray": ray}


def parse_engine(kind: Any, ray: Any, where: str) -> EngineConfig:
    if kind not in ENGINES:
        raise ConfigError(f"{where}.engine must be one of {ENGINES}, got {kind!r}")
    data = as_mapping(ray or {}, f"{where}.ray")
    for key in data:
        known(str(key), _RAY_KEYS, f"{where}.ray")
    if data and kind != "ray":
        raise ConfigError(f"{where}.ray is set but {where}.engine is {kind!r}",
                          hint="add engine: ray")
    low = as_int(data.get("min_replicas", 1), f"{where}.ray.min_replicas", 1)
    config = EngineConfig(
        kind=str(kind), min_replicas=low,
        max_replicas=as_int(data.get("max_replicas", max(2, low)), f"{where}.ray.max_replicas",
                            low),
        num_cpus=as_float(data.get("num_cpus", 0.5), f"{where}.ray.num_cpus", 0.01, 64.0),
        target_ongoing_requests=as_float(data.get("target_ongoing_requests", 2.0),
                                         f"{where}.ray.target_ongoing_requests", 0.1),
        max_ongoing_requests=as_int(data.get("max_ongoing_requests", 100),
                                    f"{where}.ray.max_ongoing_requests", 1),
        upscale_delay_s=as_float(data.get("upscale_delay_s", 1.0),
                                 f"{where}.ray.upscale_delay_s", 0.0),
        downscale_delay_s=as_float(data.get("downscale_delay_s", 30.0),
                                   f"{where}.ray.downscale_delay_s", 0.0))
    return config


def engine_from_dict(data: dict[str, Any] | None) -> EngineConfig:
    return EngineConfig(**data) if data else EngineConfig()
