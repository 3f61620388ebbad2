"""The software FP8 encoders and decode tables against ml_dtypes, bit for bit.

The encoders must equal ml_dtypes' float32 -> float8 conversion for every finite value
in the saturating range (ml_dtypes overflows to NaN/Inf beyond it, where ours saturate
to ±Qmax, as the GPU's ``cvt.rn.satfinite`` does). The sample below covers every
bfloat16 bit pattern, every FP8 value and its float32 neighbours, every midpoint (tie)
between adjacent FP8 values and its neighbours, float32 subnormals, values near Qmax,
and a few million random float32 bit patterns. (An exhaustive run over all 2^32 float32
patterns was done once by hand when the encoders were written; it takes minutes.)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from coccl.compressors import fp8

from codec_reference import FP8_DTYPES, QMAX, seed_for

FORMATS = ["e4m3", "e5m2"]


def _reference(x: np.ndarray, fmt: str) -> np.ndarray:
    """ml_dtypes' conversion of x clamped to ±Qmax (clamping first is FORMAT.md's rule)."""
    q = np.float32(QMAX[fmt])
    return np.clip(x, -q, q).astype(FP8_DTYPES[fmt]).view(np.uint8)


def _assert_matches(x: np.ndarray, fmt: str, what: str) -> None:
    x = np.ascontiguousarray(x, dtype=np.float32)
    x = x[np.isfinite(x)]
    ours = fp8.encode(x, fmt)
    ref = _reference(x, fmt)
    bad = np.flatnonzero(ours != ref)
    if bad.size:
        i = bad[0]
        bits = x[i : i + 1].view(np.uint32)[0]
        pytest.fail(
            f"{fmt} {what}: {bad.size} of {x.size} differ; first x={x[i]!r} "
            f"(bits 0x{bits:08x}) -> ours 0x{ours[i]:02x}, ml_dtypes 0x{ref[i]:02x}"
        )


def _neighbours(values: np.ndarray, k: int) -> np.ndarray:
    """values and their float32 neighbours up to k ulps away on each side (both signs)."""
    v = np.abs(np.asarray(values, dtype=np.float32)).view(np.uint32).astype(np.int64)
    steps = np.arange(-k, k + 1)
    bits = (v[:, None] + steps[None, :]).reshape(-1)
    bits = bits[(bits >= 0) & (bits < 0x7F800000)].astype(np.uint32)
    pos = bits.view(np.float32)
    return np.concatenate([pos, -pos])


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_table_equals_ml_dtypes(fmt: str) -> None:
    ref = np.arange(256, dtype=np.uint8).view(FP8_DTYPES[fmt]).astype(np.float32)
    np.testing.assert_array_equal(fp8.decode_table(fmt).view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_all_bfloat16_patterns(fmt: str) -> None:
    x = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    _assert_matches(x, fmt, "bfloat16 patterns")


@pytest.mark.parametrize("fmt", FORMATS)
def test_fp8_values_and_neighbours(fmt: str) -> None:
    table = fp8.decode_table(fmt)
    finite = table[np.isfinite(table)]
    _assert_matches(_neighbours(finite, 4), fmt, "fp8 values ± 4 ulps")


@pytest.mark.parametrize("fmt", FORMATS)
def test_ties_between_fp8_values(fmt: str) -> None:
    # Midpoints of adjacent codes (exact in float32: at most 5 significant bits) are the
    # round-half-even cases; their neighbours check the rounding direction either side.
    table = fp8.decode_table(fmt).astype(np.float64)
    pos = np.unique(table[np.isfinite(table) & (table >= 0)])
    mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)
    assert np.array_equal(mids.astype(np.float64), (pos[:-1] + pos[1:]) / 2)
    _assert_matches(_neighbours(mids, 3), fmt, "ties ± 3 ulps")


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_subnormals_and_tiny(fmt: str, request: pytest.FixtureRequest) -> None:
    rng = np.random.default_rng(seed_for(request))
    sub = rng.integers(0, 0x00800000, size=100_000, dtype=np.uint32).view(np.float32)
    edges = np.array([0x1, 0x7FFFFF, 0x800000, 0x800001], dtype=np.uint32).view(np.float32)
    _assert_matches(np.concatenate([sub, -sub, edges, -edges, [0.0, -0.0]]), fmt, "subnormals")


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_float32_patterns(fmt: str, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, size=2_000_000, dtype=np.uint64).astype(np.uint32)
    # Random bits are mostly far outside the fp8 range; add as many values log-uniform
    # from below the smallest fp8 subnormal to just beyond Qmax.
    f = fp8.get_format(fmt)
    lo, hi = 1 - f.bias - f.mbits - 2, np.log2(f.qmax) + 0.5
    inside = np.exp2(rng.uniform(lo, hi, 2_000_000)) * rng.choice([-1.0, 1.0], size=2_000_000)
    x = np.concatenate([bits.view(np.float32), inside.astype(np.float32)])
    _assert_matches(x, fmt, f"random float32 (seed={seed})")


@pytest.mark.parametrize("fmt", FORMATS)
def test_saturation_beyond_qmax(fmt: str) -> None:
    f = fp8.get_format(fmt)
    q = np.float32(f.qmax)
    big = np.concatenate(
        [
            _neighbours(np.array([q]), 64),
            np.array([q * 1.03125, q * 1.0625, q * 2, 1e10, 3.4e38, np.inf], dtype=np.float32),
        ]
    )
    big = big[np.abs(big) >= q]
    codes = fp8.encode(big, fmt)
    expect = np.where(big > 0, f.qmax_code, 0x80 | f.qmax_code).astype(np.uint8)
    np.testing.assert_array_equal(codes, expect)
    np.testing.assert_array_equal(fp8.decode(codes, fmt), np.sign(big) * q)


@pytest.mark.parametrize("fmt", FORMATS)
def test_special_values(fmt: str) -> None:
    x = np.array([0.0, -0.0, np.nan, -np.nan, 1e-30, -1e-30], dtype=np.float32)
    np.testing.assert_array_equal(fp8.encode(x, fmt), [0x00, 0x80, 0x7F, 0x7F, 0x00, 0x80])
    assert np.isnan(fp8.decode(np.array([fp8.NAN_CODE]), fmt)).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_roundtrip_of_every_code(fmt: str) -> None:
    table = fp8.decode_table(fmt)
    codes = np.flatnonzero(np.isfinite(table)).astype(np.uint8)
    codes = codes[codes != 0x80]  # -0.0 encodes to 0x80 too, but compare the rest plainly
    np.testing.assert_array_equal(fp8.encode(table[codes], fmt), codes)
    assert fp8.encode(np.array([-0.0], np.float32), fmt)[0] == 0x80


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="e4m3"):
        fp8.get_format("e3m4")
