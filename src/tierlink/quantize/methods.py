"""Turn one FP32 ONNX file into a lower-precision one with ONNX Runtime's tooling.

:func:`quantize_model` is the one entry point; each precision has a short function below.
ONNX Runtime's quantization modules are imported inside them (seconds of import time, and
``onnxruntime.quantization`` is not needed to serve models). Their untyped errors become a
:class:`~tierlink.errors.QuantizationError` here, with ``raise ... from exc``.

INT4 weight-only is written by hand (numpy) as ONNX Runtime's ``MatMulNBits`` contrib op:
its own ``MatMulNBitsQuantizer`` needs the ``onnx_ir`` package, which tierlink does not
depend on. Our dense layers export as ``Gemm``; each eligible one becomes ``MatMulNBits``
(+ ``Add`` for the bias).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.errors import QuantizationError
from tierlink.quantize.settings import QuantSettings

LAYER_OPS = ("Conv", "Gemm", "MatMul")  # what sensitivity and mixed precision act on
CALIB_BATCH = 64


@dataclass(frozen=True, slots=True)
class QuantResult:
    """What :func:`quantize_model` did: ``quantized``: the layers (node names) now in
    lower precision; ``kept``: layers left in FP32 (excluded, or not eligible)."""

    path: Path
    precision: str
    quantized: tuple[str, ...]
    kept: tuple[str, ...]


def model_layers(path: Path) -> tuple[tuple[str, str], ...]:
    """(node name, op type) of every Conv / Gemm / MatMul of the model, in graph order."""
    model = _load(path)
    return tuple((n.name, n.op_type) for n in model.graph.node if n.op_type in LAYER_OPS)


def quantize_model(src: Path, dst: Path, settings: QuantSettings,
                   calib_images: np.ndarray | None = None, *,
                   calibration_cache: Path | None = None) -> QuantResult:
    """Write ``src`` at ``settings.precision`` to ``dst``.

    ``calib_images`` (N, 1, 28, 28) float32: the calibration split; static INT8 and mixed
    use the first ``settings.calib_size`` of them (never the test split). A
    ``calibration_cache`` file keeps the activation ranges between calls with the same
    images and method (the sensitivity scan quantizes a model many times).
    Raises ``QuantizationError`` when the precision cannot apply to this model.
    """
    src, dst = Path(src), Path(dst)
    layers = model_layers(src)
    unknown = sorted(set(settings.exclude) - {name for name, _ in layers})
    if unknown:
        raise QuantizationError(f"cannot exclude {unknown}: {src.name} has no such layer",
                                hint=f"its layers are {[n for n, _ in layers]}")
    if settings.precision in ("int8-static", "mixed"):
        _static(src, dst, settings, calib_images, calibration_cache)
    elif settings.precision == "int8-dynamic":
        _dynamic(src, dst, settings)
    elif settings.precision == "fp16":
        _fp16(src, dst, settings)
    else:
        int4 = _int4_weight(src, dst, settings)
        return QuantResult(dst, settings.precision, int4,
                           tuple(n for n, _ in layers if n not in int4))
    kept = tuple(n for n, _ in layers if n in settings.exclude)
    return QuantResult(dst, settings.precision,
                       tuple(n for n, _ in layers if n not in kept), kept)


def _load(path: Path) -> Any:
    import onnx

    try:
        return onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, OSError ...
        raise QuantizationError(f"cannot read ONNX model {path}: {exc}") from exc


def _calibration_reader(images: np.ndarray, input_name: str) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        """Feeds the calibration images in batches of ``CALIB_BATCH``."""

        def __init__(self) -> None:
            self._batches: Iterator[np.ndarray] = (
                images[i:i + CALIB_BATCH] for i in range(0, len(images), CALIB_BATCH))

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self._batches, None)
            return None if batch is None else {input_name: batch}

    return Reader()


def _types(settings: QuantSettings) -> tuple[Any, Any]:
    from onnxruntime.quantization import QuantType

    kinds = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    return kinds[settings.activation_type], kinds[settings.weight_type]


def _static(src: Path, dst: Path, settings: QuantSettings, calib_images: np.ndarray | None,
            cache: Path | None) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    if calib_images is None or len(calib_images) == 0:
        raise QuantizationError("static INT8 needs calibration images",
                                hint="pass images of the calibration split")
    images = np.ascontiguousarray(  # token ids and other integer inputs keep their dtype
        calib_images[:settings.calib_size],
        dtype=np.float32 if calib_images.dtype.kind == "f" else calib_images.dtype)
    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[settings.calibration]
    activation, weight = _types(settings)
    with tempfile.TemporaryDirectory(prefix="tierlink-quant-") as tmp:
        pre = _preprocess(src, Path(tmp) / "pre.onnx")
        reader = _calibration_reader(images, _input_name(pre))
        try:
            quantize_static(str(pre), str(dst), reader, quant_format=QuantFormat.QDQ,
                            per_channel=settings.per_channel, activation_type=activation,
                            weight_type=weight, nodes_to_exclude=list(settings.exclude),
                            calibrate_method=method, calibration_cache_path=cache)
        except Exception as exc:  # onnxruntime.quantization raises bare errors
            raise QuantizationError(f"static INT8 quantization of {src.name} failed: {exc}",
                                    hint="try --calibration minmax or exclude the layer "
                                         "named in the message") from exc


def _dynamic(src: Path, dst: Path, settings: QuantSettings) -> None:
    from onnxruntime.quantization import quantize_dynamic

    _, weight = _types(settings)
    with tempfile.TemporaryDirectory(prefix="tierlink-quant-") as tmp:
        pre = _preprocess(src, Path(tmp) / "pre.onnx")
        try:
            quantize_dynamic(str(pre), str(dst), per_channel=settings.per_channel,
                             weight_type=weight, nodes_to_exclude=list(settings.exclude))
        except Exception as exc:
            raise QuantizationError(f"dynamic INT8 quantization of {src.name} failed: "
                                    f"{exc}") from exc


def _fp16(src: Path, dst: Path, settings: QuantSettings) -> None:
    """FP16 weights and ops with FP32 inputs/outputs (``keep_io_types``): a client sends the
    same tensors. On x86 CPUs ONNX Runtime runs most FP16 ops through inserted casts, so
    this mostly halves the file."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    try:
        half = convert_float_to_float16(_load(src), keep_io_types=True,
                                        node_block_list=list(settings.exclude) or None)
        onnx.save(half, str(dst))
    except Exception as exc:
        raise QuantizationError(f"FP16 conversion of {src.name} failed: {exc}") from exc


def _preprocess(src: Path, dst: Path) -> Path:
    """Shape inference + graph cleanup ONNX Runtime recommends before quantizing."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(src), str(dst))
    except Exception:  # noqa: BLE001 -- symbolic shape inference fails on some graphs
        try:  # (e.g. integer token ids through Mod/Gather): ONNX's own inference is enough
            quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)
        except Exception as exc:
            raise QuantizationError(f"cannot pre-process {src.name} for quantization: "
                                    f"{exc}") from exc
    return dst


def _input_name(path: Path) -> str:
    return str(_load(path).graph.input[0].name)


# ---------------------------------------------------------------- INT4 weight-only


def _int4_weight(src: Path, dst: Path, settings: QuantSettings) -> tuple[str, ...]:
    """Replace every eligible Gemm (constant 2-D weight, no transA, alpha = beta = 1) by
    ``MatMulNBits`` (4 bits, ``block_size`` weights per scale, asymmetric) + ``Add``.
    Returns the converted layers; ``QuantizationError`` when none is eligible."""
    import onnx

    model = _load(src)
    weights = {t.name: t for t in model.graph.initializer}
    done: list[str] = []
    nodes = []
    for node in model.graph.node:
        if node.name in settings.exclude or not _int4_eligible(node, weights):
            nodes.append(node)
            continue
        nodes.extend(_matmul_nbits(model, node, weights, settings.block_size))
        done.append(node.name)
    if not done:
        raise QuantizationError(f"{src.name} has no dense (Gemm/MatMul) layer INT4 weight-only "
                                f"quantization can apply to",
                                hint="use int8-static for convolutional layers")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    _drop_unused_initializers(model)
    onnx.save(model, str(dst))
    return tuple(done)


def _int4_eligible(node: Any, weights: dict[str, Any]) -> bool:
    from onnx import helper

    if node.op_type != "Gemm" or len(node.input) < 2 or node.input[1] not in weights:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        return False
    bias_ok = len(node.input) < 3 or not node.input[2] or node.input[2] in weights
    return bias_ok and len(weights[node.input[1]].dims) == 2


def _matmul_nbits(model: Any, node: Any, weights: dict[str, Any], block: int) -> list[Any]:
    from onnx import helper, numpy_helper

    trans_b = next((helper.get_attribute_value(a) for a in node.attribute
                    if a.name == "transB"), 0)
    w = numpy_helper.to_array(weights[node.input[1]]).astype(np.float32)
    w_nk = w if trans_b else w.T  # (N, K): MatMulNBits stores B transposed
    packed, scales, zeros = pack_int4(w_nk, block)
    n, k = w_nk.shape
    base = node.name.strip("/").replace("/", "_") or node.output[0]
    inits = {f"{base}_q4": packed, f"{base}_scales": scales, f"{base}_zp": zeros}
    model.graph.initializer.extend(numpy_helper.from_array(v, k_) for k_, v in inits.items())
    has_bias = len(node.input) > 2 and bool(node.input[2])
    out = f"{node.output[0]}_matmul" if has_bias else node.output[0]
    nodes = [helper.make_node("MatMulNBits", [node.input[0], *inits], [out], name=node.name,
                              domain="com.microsoft", K=k, N=n, bits=4, block_size=block)]
    if has_bias:
        nodes.append(helper.make_node("Add", [out, node.input[2]], [node.output[0]],
                                      name=f"{node.name}_bias"))
    return nodes


def pack_int4(w_nk: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block-wise asymmetric 4-bit quantization of ``w_nk`` (N, K) in ``MatMulNBits``
    layout: packed (N, n_blocks, block / 2) uint8, two values per byte, low nibble first;
    scales (N * n_blocks,) float32; zero points (N * ceil(n_blocks / 2),) uint8, packed
    the same way. K is zero-padded to a whole number of blocks."""
    n, k = w_nk.shape
    n_blocks = -(-k // block)
    padded = np.zeros((n, n_blocks * block), np.float32)
    padded[:, :k] = w_nk
    blocks = padded.reshape(n, n_blocks, block)                    # (N, nb, block)
    lo = np.minimum(blocks.min(axis=2), 0.0)                        # (N, nb)
    hi = np.maximum(blocks.max(axis=2), 0.0)
    scale = np.where(hi > lo, (hi - lo) / 15.0, 1.0).astype(np.float32)
    zp = np.clip(np.round(-lo / scale), 0, 15).astype(np.uint8)    # (N, nb)
    q = np.clip(np.round(blocks / scale[..., None]) + zp[..., None], 0, 15).astype(np.uint8)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)  # (N, nb, block/2)
    zp_even = np.zeros((n, n_blocks + n_blocks % 2), np.uint8)
    zp_even[:, :n_blocks] = zp
    zp_packed = (zp_even[:, 0::2] | (zp_even[:, 1::2] << 4)).reshape(-1)
    return packed, scale.reshape(-1), zp_packed.astype(np.uint8)


def _drop_unused_initializers(model: Any) -> None:
    used = {name for node in model.graph.node for name in node.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
