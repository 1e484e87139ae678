"""Feature codecs for split computing: the tensor crossing a cut, as compact bytes.

Codecs are named by a spec string ``BASE[:ARG][+zstd]``:

=============  ==============================================================================
``fp32``       identity: the float32 bytes (decoding gives the same bits back)
``fp16``       half precision; values beyond ±65504 are clipped to it (NaN stays NaN)
``int8``       affine 8-bit (uint8 codes), one scale / zero point for the tensor (0 is exact)
``int8c``      affine 8-bit, one scale / zero point per channel (axis 1)
``topk:R``     keep the fraction ``R`` (0 < R <= 1) of largest-magnitude values of each sample
               (axis 0 is the batch); store their flat indices and float32 values
``thr:T``      keep the values with ``|x| >= T``; store indices and float32 values
``...+zstd``   then compress the bytes with zstd (level 3)
=============  ==============================================================================

Wire format (version 1), pickle-free and self-describing::

    b"TLF" | u8 format version | u32 header length (little endian) | JSON header | body

The JSON header (:class:`FeatureHeader`) names the codec and its version, the decoded dtype
(always float32) and shape, the codec's parameters (quantization scale / zero point per
tensor or per channel, sparsity: kept count and index type), whether the body is zstd
compressed, the body's length and CRC-32, and its length before compression. Anything wrong
with a payload — bad magic, unknown format / codec / version, truncation, length or CRC
mismatch, a shape that does not fit the body — raises :class:`~tierlink.errors.CodecError`
(HTTP 400); no numpy, JSON or zstd exception leaks out. Decoding bounds its allocations by
:data:`MAX_ELEMENTS`, whatever the header claims.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tierlink.errors import CodecError

MAGIC = b"TLF"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 1 << 20
MAX_ELEMENTS = 1 << 28  # 1 GiB of float32: the most a payload may decode to
MAX_RANK = 16
ZSTD_LEVEL = 3
FP16_MAX = 65504.0
_MAX_SCALE = float(np.finfo(np.float32).max) / 255  # larger: (q - zero) * scale overflows
_PREFIX = struct.Struct("<3sBI")  # magic, format version, header length
_INDEX_TYPES: dict[str, np.dtype[Any]] = {"u2": np.dtype("<u2"), "u4": np.dtype("<u4")}
DEFAULT_SPECS: tuple[str, ...] = (
    "fp32", "fp32+zstd", "fp16", "fp16+zstd", "int8", "int8+zstd", "int8c", "int8c+zstd",
    "topk:0.1", "topk:0.25+zstd", "thr:0.5+zstd",
)


@dataclass(frozen=True, slots=True)
class FeatureHeader:
    """The JSON header of one payload. ``params`` is codec-specific (see each codec);
    ``payload_len`` / ``crc32`` describe the body as sent, ``raw_len`` before zstd."""

    codec: str
    codec_version: int
    shape: tuple[int, ...]
    params: Mapping[str, Any]
    zstd: bool
    payload_len: int
    crc32: int
    raw_len: int
    dtype: str = "float32"

    @property
    def spec(self) -> str:
        """The codec spec that made this payload, e.g. ``topk:0.25+zstd``."""
        arg = self.params.get("ratio", self.params.get("threshold"))
        base = self.codec if arg is None else f"{self.codec}:{arg!r}"
        return f"{base}+zstd" if self.zstd else base

    @property
    def size(self) -> int:
        """Number of elements of the decoded tensor."""
        return math.prod(self.shape)

    def to_bytes(self) -> bytes:
        doc = {"codec": self.codec, "version": self.codec_version, "dtype": self.dtype,
               "shape": list(self.shape), "params": dict(self.params), "zstd": self.zstd,
               "payload_len": self.payload_len, "crc32": self.crc32,
               "raw_len": self.raw_len}
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> FeatureHeader:
        """Parse and type-check a header; raises ``CodecError`` for anything malformed."""
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise CodecError(f"feature header is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise CodecError("feature header is not a JSON object")
        dtype = _field(doc, "dtype", str)
        if dtype != "float32":
            raise CodecError(f"feature header dtype {dtype!r} is not supported (float32)")
        params = _field(doc, "params", dict)
        return cls(_field(doc, "codec", str), _field(doc, "version", int),
                   _shape(doc.get("shape")), params, _field(doc, "zstd", bool),
                   _field(doc, "payload_len", int), _field(doc, "crc32", int),
                   _field(doc, "raw_len", int), dtype)


def _field(doc: Mapping[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    # bool is an int subclass: an int field must not accept true/false, nor the reverse.
    if value is None or type(value) is not kind:
        raise CodecError(f"feature header field {key!r} is missing or not a "
                         f"{kind.__name__} (got {value!r:.40})")
    return value


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_RANK or not all(
            type(d) is int and d >= 0 for d in value):
        raise CodecError(f"feature header shape {value!r:.60} is not a list of at most "
                         f"{MAX_RANK} non-negative integers")
    if math.prod(value) > MAX_ELEMENTS:
        raise CodecError(f"feature shape {value} holds more than {MAX_ELEMENTS} elements")
    return tuple(value)


class Codec:
    """One feature codec. ``encode`` takes a real-valued array of any shape (converted to
    float32) and returns a self-describing payload; ``decode`` returns float32 of the same
    shape. Subclasses implement ``_pack`` (array -> raw bytes + header params) and the
    class method ``_unpack`` (raw bytes + header -> array), which must validate ``params``
    and the raw length and raise ``CodecError`` for anything inconsistent."""

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    finite_only: ClassVar[bool] = True

    def __init__(self, zstd: bool = False) -> None:
        self.zstd = zstd

    @property
    def spec(self) -> str:
        return f"{self._base_spec()}+zstd" if self.zstd else self._base_spec()

    def __repr__(self) -> str:
        return f"Codec({self.spec!r})"

    def _base_spec(self) -> str:
        return self.name

    def encode(self, x: np.ndarray) -> bytes:
        """The payload of ``x``. Raises ``CodecError`` for non-numeric or oversized arrays,
        and for NaN / infinity in the lossy codecs other than fp16."""
        arr = _as_float32(x, self.finite_only, self.spec)
        raw, params = self._pack(arr)
        body = _compress(raw) if self.zstd else raw
        header = FeatureHeader(self.name, self.version, arr.shape, params, self.zstd,
                               len(body), zlib.crc32(body), len(raw)).to_bytes()
        return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header + body

    def decode(self, payload: bytes) -> np.ndarray:
        """The float32 array of a payload made by this codec (any ``+zstd`` setting)."""
        header, body = read_payload(payload)
        if header.codec != self.name:
            raise CodecError(f"payload was encoded with {header.codec!r}, not {self.name!r}",
                             hint="decode_any() decodes a payload of any codec")
        return _decode(header, body)

    def _pack(self, x: np.ndarray) -> tuple[bytes, dict[str, Any]]:
        raise NotImplementedError

    @classmethod
    def _unpack(cls, raw: bytes, header: FeatureHeader) -> np.ndarray:
        raise NotImplementedError


def decode_any(payload: bytes) -> np.ndarray:
    """Decode a payload of any known codec and version (float32, the encoded shape)."""
    header, body = read_payload(payload)
    return _decode(header, body)


def read_payload(payload: bytes) -> tuple[FeatureHeader, bytes]:
    """Check a payload's framing, header, length and CRC; its header and body bytes."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise CodecError(f"a feature payload is bytes, not {type(payload).__name__}")
    data = bytes(payload)
    if len(data) < _PREFIX.size:
        raise CodecError(f"feature payload is truncated: {len(data)} bytes, shorter than "
                         f"its {_PREFIX.size}-byte prefix")
    magic, fmt, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CodecError(f"not a tierlink feature payload (magic {magic!r}, expected {MAGIC!r})")
    if fmt != FORMAT_VERSION:
        raise CodecError(f"feature payload format version {fmt} is unknown; this build "
                         f"reads version {FORMAT_VERSION}", hint="upgrade tierlink")
    end = _PREFIX.size + header_len
    if header_len > MAX_HEADER_BYTES or end > len(data):
        raise CodecError(f"feature payload is truncated or corrupt: header of {header_len} "
                         f"bytes, {len(data) - _PREFIX.size} bytes follow the prefix")
    header = FeatureHeader.from_bytes(data[_PREFIX.size:end])
    body = data[end:]
    if len(body) != header.payload_len:
        raise CodecError(f"feature payload body is {len(body)} bytes, its header says "
                         f"{header.payload_len} ({'truncated' if len(body) < header.payload_len else 'trailing bytes'})")
    if zlib.crc32(body) != header.crc32:
        raise CodecError("feature payload body fails its CRC-32 check (corrupted in transit)")
    return header, body


def _decode(header: FeatureHeader, body: bytes) -> np.ndarray:
    cls = _CODECS.get(header.codec)
    if cls is None:
        raise CodecError(f"unknown feature codec {header.codec!r}; this build knows "
                         f"{', '.join(_CODECS)}", hint="upgrade tierlink")
    if header.codec_version != cls.version:
        raise CodecError(f"codec {header.codec!r} version {header.codec_version} is unknown; "
                         f"this build reads version {cls.version}", hint="upgrade tierlink")
    raw = _decompress(body, header.raw_len) if header.zstd else body
    if len(raw) != header.raw_len:
        raise CodecError(f"feature payload holds {len(raw)} raw bytes, its header says "
                         f"{header.raw_len}")
    return cls._unpack(raw, header)


def _as_float32(x: Any, finite_only: bool, spec: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub":
        raise CodecError(f"codec {spec} encodes real numbers, not {arr.dtype}")
    if arr.size > MAX_ELEMENTS or arr.ndim > MAX_RANK:
        raise CodecError(f"tensor {arr.shape} is too large to encode "
                         f"(at most {MAX_ELEMENTS} elements, rank {MAX_RANK})")
    arr = np.asarray(arr, dtype=np.float32, order="C")  # (ascontiguousarray makes 0-d 1-d)
    if finite_only and not np.isfinite(arr).all():
        raise CodecError(f"codec {spec} cannot encode NaN or infinity",
                         hint="use fp32 or fp16 for tensors with non-finite values")
    return arr


def _compress(raw: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(raw)


def _decompress(body: bytes, expected: int) -> bytes:
    """Decompress at most ``expected + 1`` bytes, whatever the frame claims (no bombs)."""
    import zstandard

    if not 0 <= expected <= 8 * MAX_ELEMENTS:
        raise CodecError(f"feature header raw_len {expected} is out of range")
    try:
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            chunks, size = [], 0
            while size <= expected:
                chunk = reader.read(expected + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except zstandard.ZstdError as exc:
        raise CodecError(f"feature payload is not valid zstd data: {exc}") from exc
    return b"".join(chunks)


def _expect_len(raw: bytes, expected: int, codec: str) -> None:
    if len(raw) != expected:
        raise CodecError(f"{codec} payload of shape-derived size {expected} bytes holds "
                         f"{len(raw)} bytes: shape and body disagree")


class Fp32Codec(Codec):
    """Identity: float32 little endian. Bit-exact."""

    name = "fp32"
    finite_only = False

    def _pack(self, x: np.ndarray) -> tuple[bytes, dict[str, Any]]:
        return x.astype("<f4", copy=False).tobytes(), {}

    @classmethod
    def _unpack(cls, raw: bytes, header: FeatureHeader) -> np.ndarray:
        _expect_len(raw, 4 * header.size, cls.name)
        return np.frombuffer(raw, "<f4").astype(np.float32).reshape(header.shape)


class Fp16Codec(Codec):
    """Half precision, round to nearest; finite values beyond ±65504 are clipped."""

    name = "fp16"
    finite_only = False

    def _pack(self, x: np.ndarray) -> tuple[bytes, dict[str, Any]]:
        clipped = np.clip(x, -FP16_MAX, FP16_MAX)  # NaN stays NaN, inf becomes ±65504
        return clipped.astype("<f2").tobytes(), {}

    @classmethod
    def _unpack(cls, raw: bytes, header: FeatureHeader) -> np.ndarray:
        _expect_len(raw, 2 * header.size, cls.name)
        return np.frombuffer(raw, "<f2").astype(np.float32).reshape(header.shape)


class Int8Codec(Codec):
    """Affine 8-bit: ``q = clip(round(x / scale) + zero_point, 0, 255)``, decoded as
    ``(q - zero_point) * scale`` in float32. The range always contains 0, so zeros (ReLU
    features are mostly zeros) decode exactly; the error is at most ``scale / 2``.
    Params: ``scale`` (float32) and ``zero_point`` (uint8), each base64 of its little-endian
    values: one value, or one per channel of axis 1 (compact and exact, where JSON numbers
    would cost ~20 bytes a channel)."""

    name = "int8"

    def _pack(self, x: np.ndarray) -> tuple[bytes, dict[str, Any]]:
        lo = np.minimum(_reduce(x, np.min, self.name), 0.0)  # (C,) or (1,)
        hi = np.maximum(_reduce(x, np.max, self.name), 0.0)
        with np.errstate(over="ignore"):  # an overflowing range is refused just below
            scale = ((hi - lo) / np.float32(255.0)).astype(np.float32)
        scale[scale == 0] = 1.0  # an all-zero channel: any scale decodes it exactly
        if not (scale <= _MAX_SCALE).all():  # hi - lo overflowed float32
            raise CodecError(f"{self.spec} cannot encode values spanning more than float32's "
                             "range", hint="use fp32")
        zero = np.clip(np.rint(-lo / scale), 0, 255).astype(np.float32)
        b_scale, b_zero = _broadcast(scale, x.ndim, self.name), _broadcast(zero, x.ndim, self.name)
        q = np.clip(np.rint(x / b_scale) + b_zero, 0, 255).astype(np.uint8)
        return q.tobytes(), {"scale": _b64(scale.astype("<f4")),
                             "zero_point": _b64(zero.astype(np.uint8))}

    @classmethod
    def _unpack(cls, raw: bytes, header: FeatureHeader) -> np.ndarray:
        _expect_len(raw, header.size, cls.name)
        channels = _channels(header.shape, cls.name)
        scale = _b64_array(header.params, "scale", np.dtype("<f4"), channels)
        zero = _b64_array(header.params, "zero_point", np.dtype(np.uint8), channels)
        if not ((scale > 0) & (scale <= _MAX_SCALE)).all():
            raise CodecError(f"{cls.name} header has a scale outside (0, {_MAX_SCALE:.3g}]")
        rank = len(header.shape)
        q = np.frombuffer(raw, np.uint8).reshape(header.shape).astype(np.float32)
        return (q - _broadcast(zero, rank, cls.name)) * _broadcast(scale, rank, cls.name)


class Int8ChannelCodec(Int8Codec):
    """Affine 8-bit with one scale / zero point per channel (axis 1; rank >= 2). Meant for
    convolution features (N, C, H, W): on a flat (N, F) vector every feature is a channel,
    and its 5 bytes of parameters make the payload larger than fp32 — use ``int8`` there."""

    name = "int8c"


def _channels(shape: tuple[int, ...], codec: str) -> int:
    """How many scales a tensor of ``shape`` has under ``codec``."""
    if codec != "int8c":
        return 1
    if len(shape) < 2:
        raise CodecError(f"int8c quantizes per channel (axis 1): rank-{len(shape)} tensors "
                         "have no channel axis", hint="use int8 (per tensor)")
    return shape[1]


def _reduce(x: np.ndarray, op: Any, codec: str) -> np.ndarray:
    """``op`` (min / max) over the tensor (shape (1,)) or over every axis but 1 ((C,))."""
    channels = _channels(x.shape, codec)
    if codec == "int8":
        return np.array([op(x) if x.size else 0.0], np.float32)
    per_channel = np.moveaxis(x, 1, 0).reshape(channels, -1)  # (C, everything else)
    if per_channel.shape[1] == 0:
        return np.zeros(channels, np.float32)
    return op(per_channel, axis=1).astype(np.float32)


def _broadcast(values: np.ndarray, rank: int, codec: str) -> np.ndarray:
    """Per-channel values (C,) as (1, C, 1, ...) for a rank-``rank`` tensor."""
    if codec == "int8":
        return values.reshape(())
    shape = [1] * rank
    shape[1] = -1
    return values.reshape(shape)


def _b64(values: np.ndarray) -> str:
    return base64.b64encode(values.tobytes()).decode("ascii")


def _b64_array(params: Mapping[str, Any], key: str, dtype: np.dtype[Any],
               length: int) -> np.ndarray:
    """Param ``key``: base64 of ``length`` little-endian ``dtype`` values, as float32."""
    value = params.get(key)
    try:
        raw = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
    except ValueError:  # binascii.Error
        raw = b""
    if len(raw) != length * dtype.itemsize:
        raise CodecError(f"feature header param {key!r} must be base64 of {length} "
                         f"{dtype.name} values")
    return np.frombuffer(raw, dtype).astype(np.float32)


class _SparseCodec(Codec):
    """Shared layout of the sparse codecs: ``nnz`` flat indices (``index`` type u2 or u4,
    strictly increasing) then ``nnz`` float32 values; every other element decodes to 0."""

    def _pack(self, x: np.ndarray) -> tuple[bytes, dict[str, Any]]:
        flat = x.reshape(-1)
        idx = self._keep(x)  # sorted flat indices
        itype = "u2" if flat.size <= 1 << 16 else "u4"
        raw = idx.astype(_INDEX_TYPES[itype]).tobytes() + flat[idx].astype("<f4").tobytes()
        return raw, {**self._params(), "nnz": int(idx.size), "index": itype}

    def _keep(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _unpack(cls, raw: bytes, header: FeatureHeader) -> np.ndarray:
        nnz, itype = header.params.get("nnz"), header.params.get("index")
        if type(nnz) is not int or not 0 <= nnz <= header.size or not isinstance(
                itype, str) or itype not in _INDEX_TYPES:
            raise CodecError(f"{cls.name} header needs nnz (0..{header.size}) and index "
                             f"(u2 or u4), got nnz={nnz!r:.20}, index={itype!r:.20}")
        isize = _INDEX_TYPES[itype].itemsize
        _expect_len(raw, nnz * (isize + 4), cls.name)
        idx = np.frombuffer(raw, _INDEX_TYPES[itype], count=nnz).astype(np.int64)
        if nnz and (idx[-1] >= header.size or (np.diff(idx) <= 0).any()):
            raise CodecError(f"{cls.name} payload indices are not increasing within the "
                             f"{header.size} elements of shape {list(header.shape)}")
        out = np.zeros(header.size, np.float32)
        out[idx] = np.frombuffer(raw, "<f4", count=nnz, offset=nnz * isize)
        return out.reshape(header.shape)


class TopKCodec(_SparseCodec):
    """Keep the ``ratio`` share (at least one value) of the largest-magnitude values of each
    sample (axis 0 is the batch; a scalar is one sample)."""

    name = "topk"

    def __init__(self, ratio: float, zstd: bool = False) -> None:
        super().__init__(zstd)
        self.ratio = ratio

    def _base_spec(self) -> str:
        return f"topk:{self.ratio!r}"

    def _params(self) -> dict[str, Any]:
        return {"ratio": self.ratio}

    def _keep(self, x: np.ndarray) -> np.ndarray:
        if x.size == 0:
            return np.zeros(0, np.int64)
        rows = x.reshape(x.shape[0] if x.ndim else 1, -1)  # (B, per sample)
        per = rows.shape[1]
        k = min(per, max(1, math.ceil(self.ratio * per)))
        cols = np.argpartition(-np.abs(rows), k - 1, axis=1)[:, :k]  # (B, k), unordered
        return np.sort((cols + per * np.arange(rows.shape[0])[:, None]).reshape(-1))


class ThresholdCodec(_SparseCodec):
    """Keep the values with ``|x| >= threshold``."""

    name = "thr"

    def __init__(self, threshold: float, zstd: bool = False) -> None:
        super().__init__(zstd)
        self.threshold = threshold

    def _base_spec(self) -> str:
        return f"thr:{self.threshold!r}"

    def _params(self) -> dict[str, Any]:
        return {"threshold": self.threshold}

    def _keep(self, x: np.ndarray) -> np.ndarray:
        return np.flatnonzero(np.abs(x.reshape(-1)) >= self.threshold)


_CODECS: dict[str, type[Codec]] = {
    cls.name: cls for cls in (Fp32Codec, Fp16Codec, Int8Codec, Int8ChannelCodec, TopKCodec,
                              ThresholdCodec)
}
CODEC_NAMES: tuple[str, ...] = tuple(_CODECS)


@dataclass(frozen=True, slots=True)
class _Spec:
    base: str
    arg: float | None = None
    zstd: bool = False


def get_codec(spec: str) -> Codec:
    """The codec named by ``spec`` (``fp32``, ``int8+zstd``, ``topk:0.25`` ...). Raises
    ``CodecError`` for an unknown codec or suffix, or a missing or out-of-range argument."""
    parsed = _parse_spec(spec)
    if parsed.base in ("topk", "thr"):
        arg = _arg(parsed, spec)
        return TopKCodec(arg, parsed.zstd) if parsed.base == "topk" else \
            ThresholdCodec(arg, parsed.zstd)
    if parsed.arg is not None:
        raise CodecError(f"codec {parsed.base!r} takes no argument (in {spec!r})")
    return _CODECS[parsed.base](parsed.zstd)


def _parse_spec(spec: str) -> _Spec:
    if not isinstance(spec, str) or not spec:
        raise CodecError(f"a codec spec is a non-empty string, got {spec!r}")
    base, *suffixes = spec.split("+")
    if any(s != "zstd" for s in suffixes) or len(suffixes) > 1:
        raise CodecError(f"codec spec {spec!r}: the only suffix is a single '+zstd'")
    name, sep, arg_text = base.partition(":")
    if name not in _CODECS:
        raise CodecError(f"unknown codec {name!r} in spec {spec!r}; known: "
                         f"{', '.join(CODEC_NAMES)}")
    arg = None
    if sep:
        try:
            arg = float(arg_text)
        except ValueError:
            raise CodecError(f"codec spec {spec!r}: {arg_text!r} is not a number") from None
    return _Spec(name, arg, bool(suffixes))


def _arg(parsed: _Spec, spec: str) -> float:
    arg = parsed.arg
    if arg is None or not math.isfinite(arg):
        raise CodecError(f"codec {parsed.base!r} needs a finite argument: "
                         f"{'topk:R' if parsed.base == 'topk' else 'thr:T'} (in {spec!r})")
    if parsed.base == "topk" and not 0 < arg <= 1:
        raise CodecError(f"topk ratio must be in (0, 1], got {arg} (in {spec!r})")
    if parsed.base == "thr" and arg < 0:
        raise CodecError(f"thr threshold must be >= 0, got {arg} (in {spec!r})")
    return arg
