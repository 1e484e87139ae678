"""How a variant is made: the precision and its knobs, validated once, frozen.

Precisions and the name suffix of the variant each makes::

    int8-static   <parent>-int8      QDQ INT8 weights + activations, ranges from calibration
    int8-dynamic  <parent>-int8dyn   INT8 weights, activation ranges computed per call
    fp16          <parent>-fp16      FP16 weights and compute, FP32 inputs/outputs
    int4-weight   <parent>-int4w     4-bit block-quantized weights of the dense (Gemm) layers
    mixed         <parent>-mixed     static INT8 with the most sensitive layers kept in FP32
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from tierlink.errors import QuantizationError

PRECISIONS: tuple[str, ...] = ("int8-static", "int8-dynamic", "fp16", "int4-weight", "mixed")
SUFFIXES: dict[str, str] = {"int8-static": "int8", "int8-dynamic": "int8dyn", "fp16": "fp16",
                            "int4-weight": "int4w", "mixed": "mixed"}
CALIBRATION_METHODS: tuple[str, ...] = ("minmax", "entropy", "percentile")
INT8_TYPES: tuple[str, ...] = ("int8", "uint8")
DEFAULT_BUDGET_PT = 0.5


@dataclass(frozen=True, slots=True)
class QuantSettings:
    """One quantization recipe.

    ``calibration`` / ``calib_size``: how activation ranges are found for static INT8 and
    how many calibration-split images feed it. ``activation_type`` / ``weight_type``:
    ``int8`` (signed, S8S8: the fastest on x86 at batch 1 here) or ``uint8``.
    ``per_channel``: one weight scale per output channel; ``choose_granularity``: for static
    INT8 and mixed, also try one scale per tensor and keep whichever is more accurate on
    the calibration split (accuracy-aware, as Intel Neural Compressor tunes; a tie keeps
    ``per_channel``). ``exclude``: node names kept in
    FP32. ``block_size``: weights per scale for ``int4-weight`` (a power of two >= 16).
    ``budget_pt``: for ``mixed``, the largest accuracy drop (points, calibration split)
    the search accepts; also the accuracy side of a variant's verdict.
    """

    precision: str = "int8-static"
    calibration: str = "minmax"
    calib_size: int = 512
    per_channel: bool = True
    choose_granularity: bool = True
    activation_type: str = "int8"
    weight_type: str = "int8"
    exclude: tuple[str, ...] = ()
    block_size: int = 32
    budget_pt: float = DEFAULT_BUDGET_PT

    def __post_init__(self) -> None:
        _choice("precision", self.precision, PRECISIONS)
        _choice("calibration", self.calibration, CALIBRATION_METHODS)
        _choice("activation_type", self.activation_type, INT8_TYPES)
        _choice("weight_type", self.weight_type, INT8_TYPES)
        if not 1 <= self.calib_size <= 100_000:
            raise QuantizationError(f"calib_size is {self.calib_size}; it must be 1..100000",
                                    hint="use a few hundred calibration images, e.g. 512")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise QuantizationError(f"block_size is {self.block_size}; it must be a power "
                                    f"of two >= 16", hint="use 32 (the default)")
        if not 0.0 <= self.budget_pt <= 100.0:
            raise QuantizationError(f"budget_pt is {self.budget_pt}; it must be 0..100 points")

    @property
    def suffix(self) -> str:
        """The variant-name suffix of this precision (``int8``, ``mixed``, ...)."""
        return SUFFIXES[self.precision]

    def with_exclude(self, exclude: tuple[str, ...]) -> QuantSettings:
        return replace(self, exclude=tuple(exclude))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["exclude"] = list(self.exclude)
        return data


def _choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise QuantizationError(f"{field} is {value!r}; expected one of {', '.join(allowed)}",
                                hint=f"pick a {field} from: {', '.join(allowed)}")


def precision_for(name: str) -> str:
    """The precision of a CLI name or variant suffix: ``int8`` -> ``int8-static``, ``mixed``
    -> ``mixed``; a full precision name passes through. ``QuantizationError`` otherwise."""
    if name in PRECISIONS:
        return name
    by_suffix = {v: k for k, v in SUFFIXES.items()}
    if name in by_suffix:
        return by_suffix[name]
    raise QuantizationError(f"unknown precision {name!r}",
                            hint=f"use one of {', '.join(SUFFIXES.values())}")
