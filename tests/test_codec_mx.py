"""The mx and taco_fp codecs against independent references (tests/mx_reference.py):
element and scale rounding by ml_dtypes, payload layout and packing, the error bounds
(NVFP4's per-payload range included), non-finite blocks, and any count.

The contract checks shared by every codec (config, dtypes, accumulate, fixtures...) run
for these codecs in test_codec_contract.py, the whole-range sweep in test_codec_range.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from mx_reference import (
    BITS,
    ELEMENT_DTYPES,
    QMAX,
    element_codes,
    mx_decode_ref,
    mx_encode_ref,
    split_mx_payload,
    taco_fp_codes_ref,
    taco_fp_decode_ref,
    unpack_codes,
)

from coccl.compressors import MxCompressor, TacoFpCompressor, get_compressor, minifloat
from coccl.compressors.mx_layout import taco_fp_layout

from codec_reference import assert_within_bound, grouped_gaussian, seed_for

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), np.dtype(np.float16), BF16, np.dtype(np.float64)]
ELEMENTS = ["e2m1", "e3m2", "e2m3"]
MX = [
    {"element": e, "block": b, "scale": s}
    for e in ELEMENTS
    for b in (16, 32)
    for s in ("e8m0", "e4m3")
]
COUNTS = [0, 1, 31, 1000, 4097]
FLT_MAX = float(np.finfo(np.float32).max)


def _id(cfg: dict) -> str:
    return "-".join(f"{v}" for v in cfg.values())


# ----------------------------------------------------------- element conversion
@pytest.mark.parametrize("element", ELEMENTS)
def test_element_rounding_matches_ml_dtypes(element: str, request) -> None:
    rng = np.random.default_rng(seed_for(request))
    bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate(
        [
            bits.view(np.float32),
            (rng.standard_normal(1 << 18) * QMAX[element] / 2).astype(np.float32),
            np.float32([0.0, -0.0, 1e-45, -1e-45, QMAX[element], 2 * QMAX[element]]),
        ]
    )
    x = x[np.isfinite(x)]
    np.testing.assert_array_equal(minifloat.encode(x, element), element_codes(x, element))
    codes = np.arange(1 << BITS[element], dtype=np.uint8)
    expect = codes.view(ELEMENT_DTYPES[element]).astype(np.float32)
    np.testing.assert_array_equal(minifloat.decode(codes, element), expect)


@pytest.mark.parametrize("element", ELEMENTS)
def test_element_format_constants(element: str) -> None:
    f = minifloat.get_format(element)
    info = ml_dtypes.finfo(ELEMENT_DTYPES[element])
    assert f.qmax == float(info.max) and f.bits == BITS[element]
    assert 2.0**f.emax <= f.qmax < 2.0 ** (f.emax + 1)
    assert 2.0 ** (f.emin - f.mbits) == float(info.smallest_subnormal)


# ------------------------------------------------------------------- mx payload
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("cfg", MX, ids=_id)
def test_mx_matches_reference(cfg: dict, count: int, request) -> None:
    seed = seed_for(request)
    c = MxCompressor(**cfg)
    x = grouped_gaussian(np.random.default_rng(seed), count, cfg["block"], -2, 2)
    payload = c.encode(x)
    assert payload.size == c.encoded_nbytes(count, np.float32)
    got = split_mx_payload(payload, count, **cfg)
    ref = mx_encode_ref(x, **cfg)
    np.testing.assert_array_equal(got.scales, ref.scales, err_msg=f"seed={seed}")
    np.testing.assert_array_equal(got.codes, ref.codes, err_msg=f"seed={seed}")
    if cfg["scale"] == "e4m3":
        assert got.tensor_scale == ref.tensor_scale
    y = c.decode(payload, count=count, dtype=np.float32)
    np.testing.assert_array_equal(y.astype(np.float64), mx_decode_ref(got, count, **cfg))
    if count:  # NVFP4's range within a payload: its floor (0 for E8M0 at these sizes)
        floor = c.payload_floor(np.abs(x).max()) if cfg["scale"] == "e4m3" else 0.0
        assert_within_bound(y, x.astype(np.float64), c.alignment, c.rel_error_bound, floor, "")


def test_packing_order() -> None:
    # FP4: element 2j in the low nibble; FP6: elements 4j.. in bits 0-5, 6-11, ... of a
    # little-endian 24-bit word. Values 1..4 at E8M0 scale 2^0 (amax 4 -> shared 0).
    x = np.zeros(32, np.float32)
    x[:4] = [1.0, 2.0, 3.0, 4.0]
    p4 = MxCompressor(element="e2m1").encode(x)
    assert list(p4[:2]) == [0x2 | 0x4 << 4, 0x5 | 0x6 << 4] and p4[16] == 127
    p6 = MxCompressor(element="e3m2").encode(x * 4)  # amax 16: shared 0
    w = int(p6[0]) | int(p6[1]) << 8 | int(p6[2]) << 16
    c = element_codes(x[:4] * 4, "e3m2")
    c0, c1, c2, c3 = (int(v) for v in c)
    assert w == c0 | c1 << 6 | c2 << 12 | c3 << 18 and p6[24] == 127
    np.testing.assert_array_equal(unpack_codes(p6[:24], 6)[:4], c)


@pytest.mark.parametrize("cfg", MX, ids=_id)
def test_payload_size(cfg: dict) -> None:
    c = MxCompressor(**cfg)
    b, bits = cfg["block"], BITS[cfg["element"]]
    for count in COUNTS:
        k = -(-count // b)
        extra = 4 if cfg["scale"] == "e4m3" else 0
        assert c.encoded_nbytes(count, np.float32) == k * b * bits // 8 + k + extra


@pytest.mark.parametrize("cfg", MX, ids=_id)
def test_nonfinite_blocks_are_nan_and_skip_the_payload_scale(cfg: dict) -> None:
    c = MxCompressor(**cfg)
    b = cfg["block"]
    x = np.ones(4 * b, np.float32)
    x[b + 1] = np.inf
    x[2 * b + 2] = np.nan
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    assert np.isnan(y[b : 3 * b]).all()
    np.testing.assert_allclose(np.r_[y[:b], y[3 * b :]], 1.0, rtol=1e-6)  # S rounds
    parts = split_mx_payload(c.encode(x), x.size, **cfg)
    assert list(parts.scales[1:3]) == [0xFF if cfg["scale"] == "e8m0" else 0x7F] * 2
    assert (parts.codes[1:3] == 0).all()


def test_mx_scale_rule_follows_the_spec() -> None:
    # OCP MX: X = 2^(floor(log2 amax) - emax); a block with amax = 7 (E2M1, emax 2) gets
    # X = 1, and 7 clips to 6 (the spec's rule, kept; the bound allows it).
    c = MxCompressor()
    x = np.zeros(32, np.float32)
    x[0], x[1] = 7.0, 0.75
    parts = split_mx_payload(c.encode(x), 32, "e2m1", 32, "e8m0")
    assert parts.scales[0] == 127
    y = c.decode(c.encode(x), count=32, dtype=np.float32)
    assert y[0] == 6.0 and y[1] in (0.5, 1.0)


# ---------------------------------------------------------------- NVFP4 range
@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("exponent", [-45, -40, -38, -36, -30, -10, 0, 10, 30, 38])
def test_e4m3_whole_range_per_payload(element: str, exponent: int, request) -> None:
    # Each payload at one magnitude (blocks within 2^4 of each other), over float32's range.
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = MxCompressor(element=element, block=16, scale="e4m3")
    x = rng.standard_normal(16 * 40) * 2.0 ** rng.uniform(-4, 0, 16 * 40).round()
    x = (x / np.abs(x).max() * min(10.0**exponent, FLT_MAX)).astype(np.float32)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    assert np.isfinite(y).all()
    assert_within_bound(y, x.astype(np.float64), 16, c.rel_error_bound, c.abs_error_floor, "")


@pytest.mark.parametrize("element", ELEMENTS)
def test_e4m3_range_within_a_payload(element: str, request) -> None:
    # Blocks from the payload's absmax down to 2^-30 below it: those within E4M3's normal
    # range of S (absmax >= top * 2^-6 / 448) keep the bound; every block keeps it with
    # the payload floor (payload_floor), and none beyond is silently better than zero.
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = MxCompressor(element=element, block=16, scale="e4m3")
    mags = 2.0 ** -rng.uniform(0, 30, 200)
    mags[0] = 1.0
    x = (rng.standard_normal((200, 16)) * mags[:, None]).reshape(-1).astype(np.float32)
    top = float(np.abs(x).max())
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    x64 = x.astype(np.float64)
    block_max = np.abs(x64).reshape(200, 16).max(axis=1)
    ok = np.repeat(block_max >= top * 2.0**-6 / 448 * (1 + 2**-8), 16)
    assert ok.sum() >= 32 and (~ok).sum() >= 32
    assert_within_bound(y[ok], x64[ok], 16, c.rel_error_bound, c.abs_error_floor, "in range")
    assert_within_bound(y, x64, 16, c.rel_error_bound, c.payload_floor(top), "payload floor")


def test_e4m3_largest_values_stay_finite() -> None:
    c = MxCompressor(element="e2m1", block=16, scale="e4m3")
    x = np.full(64, FLT_MAX, np.float32) * np.where(np.arange(64) % 3, 1, -1).astype(np.float32)
    y = c.decode(c.encode(x), count=64, dtype=np.float32)
    assert np.isfinite(y).all()
    assert_within_bound(y, x.astype(np.float64), 16, c.rel_error_bound, c.abs_error_floor, "")


# --------------------------------------------------------------------- taco_fp
@pytest.mark.parametrize("g", [32, 128, 512])
@pytest.mark.parametrize("element", ELEMENTS)
def test_taco_fp_matches_reference(element: str, g: int, request) -> None:
    seed = seed_for(request)
    c = TacoFpCompressor(element=element, group_size=g)
    x = grouped_gaussian(np.random.default_rng(seed), 5 * g + 7, g)
    payload = c.encode(x)
    k = taco_fp_layout(x.size, g, BITS[element]).groups
    codes = unpack_codes(payload[: k * g * BITS[element] // 8], BITS[element]).reshape(k, g)
    u, _ = taco_fp_codes_ref(x, element, g)
    same = (codes == element_codes(u, element)).mean()
    assert same > 0.995, f"seed={seed}: {same}"  # float32 ties apart, codes equal
    y = c.decode(payload, count=x.size, dtype=np.float32)
    ref = taco_fp_decode_ref(payload, x.size, element, g)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6 * float(np.abs(x).max()))
    assert_within_bound(y, x.astype(np.float64), g, c.rel_error_bound, c.abs_error_floor, "")


@pytest.mark.parametrize("element", ELEMENTS)
def test_taco_fp_nonfinite_groups(element: str) -> None:
    c = TacoFpCompressor(element=element, group_size=32)
    x = np.ones(96, np.float32)
    x[40] = -np.inf
    y = c.decode(c.encode(x), count=96, dtype=np.float32)
    assert np.isnan(y[32:64]).all() and np.isfinite(y[:32]).all() and np.isfinite(y[64:]).all()


# ------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "options, error",
    [
        ({"element": "e4m3"}, ValueError),
        ({"element": 4}, TypeError),
        ({"block": 64}, ValueError),
        ({"block": 16.0}, TypeError),
        ({"block": True}, TypeError),
        ({"scale": "ue8m0"}, ValueError),
        ({"scale": None}, TypeError),
    ],
)
def test_mx_bad_options(options: dict, error: type) -> None:
    with pytest.raises(error, match=next(iter(options))):
        MxCompressor(**options)


def test_presets_and_configs() -> None:
    assert get_compressor("mx").get_config() == {
        "id": "mx",
        "element": "e2m1",
        "block": 32,
        "scale": "e8m0",
    }
    assert get_compressor("taco_fp").get_config() == {
        "id": "taco_fp",
        "element": "e2m1",
        "group_size": 128,
    }
    nvfp4 = get_compressor({"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"})
    assert nvfp4.encoded_nbytes(1 << 20, np.float32) == (1 << 19) + (1 << 16) + 4
    with pytest.raises(ValueError, match="group_size"):
        TacoFpCompressor(group_size=16)
    with pytest.raises(ValueError, match="element"):
        TacoFpCompressor(element="e5m2")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("cfg", [{"id": "mx", **m} for m in MX[::3]] + [{"id": "taco_fp"}], ids=str)
def test_counts_and_dtypes_within_bound(cfg: dict, dtype: np.dtype, request) -> None:
    seed = seed_for(request)
    c = get_compressor(cfg)
    for count in COUNTS:
        x = grouped_gaussian(np.random.default_rng(seed + count), count, c.alignment).astype(dtype)
        y = c.decode(c.encode(x), np.zeros(count, np.float64), count=count, dtype=dtype)
        if count == 0:
            assert y.size == 0
            continue
        floor = c.payload_floor(float(np.abs(x).max())) if cfg["id"] == "mx" else 0.0
        floor = max(floor, c.abs_error_floor)
        assert_within_bound(
            y, x.astype(np.float64), c.alignment, c.rel_error_bound, floor, str(count)
        )
