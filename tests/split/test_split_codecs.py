"""Feature codecs: round trips within each codec's error bound, spec parsing, and malformed
payloads that must raise ``CodecError`` (never another exception)."""

from __future__ import annotations

import base64
import json
import math
import struct
import zlib

import numpy as np
import pytest

from tierlink.errors import CodecError, SplitError
from tierlink.split.codecs import (
    DEFAULT_SPECS,
    FP16_MAX,
    MAGIC,
    MAX_ELEMENTS,
    decode_any,
    get_codec,
    read_payload,
)

SHAPES = [(1, 16, 14, 14), (3, 8, 5, 5), (2, 10), (4,), (), (0, 3)]


def _relu_features(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """ReLU-like features: about half exact zeros."""
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    return np.maximum(x, 0) * np.float32(3.0)


def _frame(header: dict, body: bytes, *, fmt: int = 1, magic: bytes = MAGIC) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<3sBI", magic, fmt, len(raw)) + raw + body


def _header(payload: bytes) -> dict:
    (length,) = struct.unpack_from("<I", payload, 4)
    return json.loads(payload[8:8 + length])


def _body(payload: bytes) -> bytes:
    (length,) = struct.unpack_from("<I", payload, 4)
    return payload[8 + length:]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("spec", ["fp32", "fp32+zstd"])
def test_fp32_is_bit_exact(spec, shape):
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    if x.size:
        x.reshape(-1)[0] = np.nan
    y = get_codec(spec).decode(get_codec(spec).encode(x))
    assert y.dtype == np.float32 and y.shape == x.shape
    assert y.tobytes() == x.tobytes()


@pytest.mark.parametrize("shape", SHAPES)
def test_fp16_within_half_precision(shape):
    x = _relu_features(shape) - 1.0
    y = decode_any(get_codec("fp16").encode(x))
    assert y.shape == x.shape
    assert np.allclose(y, x, rtol=2.0 ** -11, atol=2.0 ** -24)


def test_fp16_clips_out_of_range_values_and_keeps_nan():
    x = np.array([1e6, -1e6, np.inf, np.nan, 1.0], np.float32)
    y = decode_any(get_codec("fp16+zstd").encode(x))
    assert y[:3].tolist() == [FP16_MAX, -FP16_MAX, FP16_MAX]
    assert np.isnan(y[3]) and y[4] == 1.0


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("spec", ["int8", "int8+zstd"])
def test_int8_per_tensor_error_is_at_most_half_a_step(spec, shape):
    x = _relu_features(shape) - 0.7
    payload = get_codec(spec).encode(x)
    header, _ = read_payload(payload)
    (scale,) = np.frombuffer(base64.b64decode(header.params["scale"]), "<f4")
    y = decode_any(payload)
    assert y.shape == x.shape
    if x.size:
        assert np.abs(y - x).max() <= scale / 2 * (1 + 1e-5) + 1e-7


def test_int8_decodes_zeros_exactly():
    x = _relu_features((2, 8, 6, 6))
    for spec in ("int8", "int8c"):
        y = decode_any(get_codec(spec).encode(x))
        assert (y[x == 0] == 0).all(), spec


@pytest.mark.parametrize("spec", ["int8c", "int8c+zstd"])
def test_int8_per_channel_has_one_scale_per_channel(spec):
    x = _relu_features((3, 6, 4, 4)) * np.arange(1, 7, dtype=np.float32)[None, :, None, None]
    x[:, 2] = 0.0  # an all-zero channel
    payload = get_codec(spec).encode(x)
    header, _ = read_payload(payload)
    scales = np.frombuffer(base64.b64decode(header.params["scale"]), "<f4")
    assert scales.shape == (6,)
    y = decode_any(payload)
    err = np.abs(y - x).max(axis=(0, 2, 3))  # (C,)
    assert (err <= scales / 2 * (1 + 1e-5) + 1e-7).all()
    assert (y[:, 2] == 0).all()
    # Per channel beats per tensor when channels differ in range.
    per_tensor = decode_any(get_codec("int8").encode(x))
    assert np.abs(y - x).mean() < np.abs(per_tensor - x).mean()


def test_int8_per_channel_needs_a_channel_axis():
    with pytest.raises(CodecError, match="channel"):
        get_codec("int8c").encode(np.ones(5, np.float32))


@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.25, 1.0])
def test_topk_keeps_exactly_the_largest_values_of_each_sample(ratio):
    x = np.random.default_rng(3).normal(size=(3, 4, 5, 5)).astype(np.float32)  # distinct
    y = decode_any(get_codec(f"topk:{ratio}").encode(x))
    per = x[0].size
    k = max(1, math.ceil(ratio * per))
    for xs, ys in zip(x.reshape(3, -1), y.reshape(3, -1), strict=True):
        top = np.argsort(-np.abs(xs))[:k]
        assert set(np.flatnonzero(ys)) == set(top)
        assert np.array_equal(ys[top], xs[top])  # kept values are exact


def test_threshold_keeps_values_at_or_above_it():
    x = np.array([[0.1, -0.5, 0.49, 2.0], [-3.0, 0.0, 0.5, 0.2]], np.float32)
    y = decode_any(get_codec("thr:0.5+zstd").encode(x))
    assert y.tolist() == [[0.0, -0.5, 0.0, 2.0], [-3.0, 0.0, 0.5, 0.0]]


def test_sparse_codecs_handle_large_tensors_and_empty_results():
    x = _relu_features((2, 64, 32, 32))  # > 65536 elements: 32-bit indices
    payload = get_codec("topk:0.05").encode(x)
    assert read_payload(payload)[0].params["index"] == "u4"
    assert (decode_any(payload) != 0).sum() == 2 * math.ceil(0.05 * x[0].size)
    empty = decode_any(get_codec("thr:100").encode(x))
    assert empty.shape == x.shape and not empty.any()


def test_zstd_flag_is_in_the_header_and_shrinks_sparse_features():
    x = _relu_features((1, 32, 14, 14))
    plain, packed = get_codec("int8").encode(x), get_codec("int8+zstd").encode(x)
    assert read_payload(plain)[0].zstd is False
    header = read_payload(packed)[0]
    assert header.zstd is True and header.spec == "int8+zstd"
    assert len(packed) < len(plain)
    assert np.array_equal(decode_any(plain), decode_any(packed))


def test_every_default_spec_round_trips_and_names_itself():
    x = _relu_features((1, 8, 7, 7))
    for spec in DEFAULT_SPECS:
        codec = get_codec(spec)
        assert codec.spec == spec
        payload = codec.encode(x)
        assert read_payload(payload)[0].spec == spec
        assert codec.decode(payload).shape == x.shape


@pytest.mark.parametrize("spec", [
    "", "foo", "fp32+lz4", "int8+zstd+zstd", "int8:3", "topk", "topk:0", "topk:1.5",
    "topk:x", "thr", "thr:-1", "thr:nan", "thr:inf", "+zstd", "FP32",
])
def test_bad_specs_are_codec_errors(spec):
    with pytest.raises(CodecError):
        get_codec(spec)


def test_spec_is_canonical():
    assert get_codec("topk:.25+zstd").spec == "topk:0.25+zstd"
    assert get_codec("thr:1").spec == "thr:1.0"


def test_codec_error_is_a_400_split_error():
    assert issubclass(CodecError, SplitError)
    assert CodecError.http_status == 400 and CodecError("x").to_dict()["code"] == "codec_error"


def test_lossy_codecs_refuse_non_finite_and_non_numeric_input():
    bad = np.array([1.0, np.nan], np.float32)
    for spec in ("int8", "int8c", "topk:0.5", "thr:0.1"):
        with pytest.raises(CodecError, match="NaN"):
            get_codec(spec).encode(bad.reshape(1, 2))
    with pytest.raises(CodecError, match="real numbers"):
        get_codec("fp32").encode(np.array(["a", "b"]))


def test_decode_with_the_wrong_codec_names_both():
    payload = get_codec("int8").encode(np.ones((1, 3), np.float32))
    with pytest.raises(CodecError, match="'int8', not 'fp16'"):
        get_codec("fp16").decode(payload)
    assert decode_any(payload).tolist() == [[1.0, 1.0, 1.0]]


# -- malformed payloads ------------------------------------------------------------------


@pytest.fixture()
def good() -> bytes:
    return get_codec("int8").encode(_relu_features((1, 4, 3, 3)))


def _with(payload: bytes, **changes) -> bytes:
    """``payload`` with header fields changed; body, its length and CRC kept."""
    header = _header(payload)
    header.update(changes)
    return _frame(header, _body(payload))


def _with_body(payload: bytes, body: bytes, **changes) -> bytes:
    """``payload`` with a new body (length and CRC updated) and header fields changed."""
    header = {**_header(payload), "payload_len": len(body), "crc32": zlib.crc32(body),
              **changes}
    return _frame(header, body)


@pytest.mark.parametrize("case, match", [
    ("empty", "truncated"),
    ("short_prefix", "truncated"),
    ("bad_magic", "magic"),
    ("format_version", "format version 9"),
    ("header_cut", "truncated"),
    ("body_cut", "truncated"),
    ("trailing", "trailing"),
    ("crc", "CRC"),
    ("unknown_codec", "unknown feature codec 'brotli8'"),
    ("unknown_version", "version 7"),
    ("shape_mismatch", "shape and body disagree"),
    ("not_json", "not valid JSON"),
    ("not_object", "not a JSON object"),
    ("missing_field", "'crc32'"),
    ("bool_for_int", "'version'"),
    ("negative_dim", "shape"),
    ("huge_shape", "shape"),
    ("dtype", "dtype"),
    ("bad_scale", "scale"),
    ("zstd_claimed", "zstd"),
    ("not_bytes", "bytes"),
])
def test_malformed_payloads_are_codec_errors(good, case, match):
    header = _header(good)
    payloads = {
        "empty": b"",
        "short_prefix": good[:5],
        "bad_magic": b"XYZ" + good[3:],
        "format_version": good[:3] + bytes([9]) + good[4:],
        "header_cut": good[:20],
        "body_cut": good[:-3],
        "trailing": good + b"\0",
        "crc": good[:-1] + bytes([good[-1] ^ 0x01]),
        "unknown_codec": _with(good, codec="brotli8"),
        "unknown_version": _with(good, version=7),
        "shape_mismatch": _with(good, shape=[1, 4, 3, 4]),
        "not_json": struct.pack("<3sBI", MAGIC, 1, 4) + b"{{{{" + _body(good),
        "not_object": _frame([1, 2], b""),  # type: ignore[arg-type]
        "missing_field": _frame({k: v for k, v in header.items() if k != "crc32"},
                                _body(good)),
        "bool_for_int": _with(good, version=True),
        "negative_dim": _with(good, shape=[-1, 36]),
        "huge_shape": _with(good, shape=[MAX_ELEMENTS, 2]),
        "dtype": _with(good, dtype="float64"),
        "bad_scale": _with(good, params={"scale": "!!", "zero_point": "AA=="}),
        "zstd_claimed": _with(good, zstd=True),
        "not_bytes": "TLF",
    }
    with pytest.raises(CodecError, match=match):
        decode_any(payloads[case])  # type: ignore[arg-type]


def test_sparse_payloads_with_bad_indices_are_codec_errors():
    payload = get_codec("thr:0.5").encode(np.array([[0.0, 1.0, 2.0, 0.0]], np.float32))
    idx = np.array([2, 1], "<u2").tobytes()  # not increasing
    values = np.array([1.0, 2.0], "<f4").tobytes()
    with pytest.raises(CodecError, match="increasing"):
        decode_any(_with_body(payload, idx + values))
    out_of_range = np.array([1, 9], "<u2").tobytes()
    with pytest.raises(CodecError, match="increasing"):
        decode_any(_with_body(payload, out_of_range + values))
    with pytest.raises(CodecError, match="nnz"):
        decode_any(_with(payload, params={"threshold": 0.5, "nnz": 99, "index": "u2"}))


def test_zstd_bomb_is_refused_without_decompressing_it_all():
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
    payload = get_codec("fp32+zstd").encode(np.zeros((1, 4), np.float32))
    with pytest.raises(CodecError, match="raw bytes"):
        decode_any(_with_body(payload, bomb))
    with pytest.raises(CodecError, match="not valid zstd"):
        decode_any(_with_body(payload, b"\x28\xb5\x2f\xfd garbage"))


@pytest.mark.parametrize("spec", DEFAULT_SPECS)
def test_random_truncations_and_bit_flips_only_raise_codec_errors(spec):
    rng = np.random.default_rng(zlib.crc32(spec.encode()))
    good = get_codec(spec).encode(_relu_features((1, 8, 5, 5), seed=2))
    for _ in range(150):
        data = bytearray(good)
        if rng.random() < 0.4:
            data = data[:int(rng.integers(0, len(data)))]
        else:
            for _ in range(int(rng.integers(1, 4))):
                pos = int(rng.integers(0, len(data)))
                data[pos] ^= 1 << int(rng.integers(0, 8))
        try:
            out = decode_any(bytes(data))
        except CodecError:
            continue
        assert isinstance(out, np.ndarray) and out.dtype == np.float32
