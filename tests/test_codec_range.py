"""Every finite value of float32's range round-trips within the codecs' stated bound.

Each lossy codec states, per group of n values x, ``||decode(encode(x)) - x|| <=
rel_error_bound * ||x|| + sqrt(n) * abs_error_floor`` (compressors/base.py). These tests
sweep group magnitudes over the whole range of each input dtype (smallest subnormal to
largest finite, both signs, mixed magnitudes) and hold every group to that bound against
the exact input in float64. They also pin what the library says happens outside it:
float64 beyond float32's range decodes to NaN (its whole group), taco with
``dual_scale=False`` flushes and saturates within its bound of 1, and
``coccl_clamps=True`` keeps COCCL's arithmetic, groups outside its normal range included.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from coccl.compressors import TacoCompressor, get_compressor

from codec_reference import (
    assert_within_bound,
    extended_alpha,
    group_errors,
    magnitude_sweep,
    padded_groups,
    seed_for,
    split_taco_payload,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FLT_MAX = float(np.finfo(np.float32).max)

CODECS = [
    {"id": "taco"},
    {"id": "taco", "fp8_format": "e5m2"},
    {"id": "taco", "group_size": 32},
    {"id": "taco", "group_size": 512, "fp8_format": "e5m2"},
    {"id": "taco", "ash": False},
    {"id": "taco", "ash": False, "fp8_format": "e5m2", "group_size": 64},
    {"id": "int8"},
    {"id": "int8", "group_size": 32},
    {"id": "int8", "group_size": 512},
    {"id": "mx"},
    {"id": "mx", "element": "e3m2"},
    {"id": "mx", "element": "e2m3", "block": 16},
    {"id": "taco_fp"},
    {"id": "taco_fp", "element": "e3m2", "group_size": 32},
    {"id": "taco_fp", "element": "e2m3", "group_size": 512},
    {"id": "int"},
    {"id": "int", "bits": 2, "group_size": 32},
    {"id": "int", "bits": 3, "hadamard": 32},
    {"id": "int", "bits": 6, "group_size": 32},
    {"id": "int", "bits": 5, "group_size": 64, "hadamard": 64},
    {"id": "int", "bits": 8, "hadamard": 128, "rounding": "stochastic"},
    {"id": "int", "bits": 4, "group_size": 2048, "hadamard": 32, "rounding": "stochastic"},
    # tah with one tile per token: the sweep's groups are its tiles
    {"id": "tah", "row": 64},
    {"id": "tah", "row": 32, "tile": 32, "bits_high": 2, "bits_low": 2},
    {"id": "tah", "row": 128, "tile": 128, "bits_high": 8, "pivot": "off"},
]


def _id(cfg: dict) -> str:
    return "-".join(str(v) if k == "id" else f"{k}={v}" for k, v in cfg.items())


@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64], ids=str)
@pytest.mark.parametrize("cfg", CODECS, ids=_id)
def test_whole_range_within_bound(cfg: dict, dtype: np.dtype, request) -> None:
    seed = seed_for(request)
    c = get_compressor(cfg)
    g = c.alignment
    x64 = magnitude_sweep(np.random.default_rng(seed), g, dtype)
    x = x64.astype(dtype)  # exact: the sweep's values are the dtype's
    payload = c.encode(x)
    msg = f"{cfg} {dtype} seed={seed}"
    # Decoded in float32 (a float32 accumulator stands for any dtype; float64 for float64).
    acc = F64 if dtype == F64 else F32
    y = c.decode(payload, np.zeros(x.size, acc), count=x.size, dtype=dtype)
    assert np.isfinite(y).all(), f"{msg}: non-finite output"
    assert_within_bound(y, x64, g, c.rel_error_bound, c.abs_error_floor, msg)
    # Decoded into the dtype itself: the same values, rounded once more (half an ulp of
    # the output type). float32 saturates at ±FLT_MAX; the narrow types stay finite here
    # because the sweep stops a few percent short of their largest values' rounding.
    if dtype in (F16, BF16):
        z = c.decode(payload, count=x.size, dtype=dtype).astype(np.float64)
        half_ulp = 2.0 ** -(ml_dtypes.finfo(dtype).nmant + 1)
        limit_rel = c.rel_error_bound + half_ulp * (1 + c.rel_error_bound)
        floor = c.abs_error_floor + float(ml_dtypes.finfo(dtype).smallest_subnormal)
        near_max = np.abs(x64) > 0.9 * float(ml_dtypes.finfo(dtype).max)  # may round to ±Inf
        zz, xx = np.where(near_max, 0.0, z), np.where(near_max, 0.0, x64)
        assert_within_bound(zz, xx, g, limit_rel, floor, f"{msg} ({dtype} output)")


@pytest.mark.parametrize("cfg", CODECS, ids=_id)
def test_largest_float32_values_stay_finite(cfg: dict) -> None:
    # Groups at FLT_MAX: decoded values saturate at ±FLT_MAX rather than overflow.
    c = get_compressor(cfg)
    g = c.alignment
    x = np.full(2 * g, FLT_MAX, np.float32)
    x[g:] *= np.where(np.arange(g) % 3 == 0, -1, 1).astype(np.float32)
    x[g + 5] = np.float32(1e38)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    assert np.isfinite(y).all()
    assert_within_bound(y, x.astype(np.float64), g, c.rel_error_bound, c.abs_error_floor, "max")


@pytest.mark.parametrize("cfg", CODECS, ids=_id)
def test_subnormal_groups(cfg: dict, request) -> None:
    # Random float32 subnormals (and zeros): only the absolute floor is looser than usual.
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    g = c.alignment
    bits = rng.integers(0, 0x00800000, size=6 * g, dtype=np.uint32)
    bits[: 2 * g] >>= rng.integers(0, 23, size=2 * g, dtype=np.uint32)  # all bit lengths
    x = bits.view(np.float32) * rng.choice(np.float32([-1, 1]), size=bits.size)
    x[::5] = 0.0
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    if cfg["id"] in ("taco", "taco_fp"):
        keeps_zeros = not cfg.get("ash", True)
    elif cfg["id"] == "tah":
        keeps_zeros = False  # asymmetric tiles: zero is a code only by chance
    else:
        keeps_zeros = not cfg.get("hadamard")
    if keeps_zeros:  # symmetric, no rotation: zeros stay zero
        assert (y[x == 0] == 0).all()
    assert_within_bound(
        y, x.astype(np.float64), g, c.rel_error_bound, c.abs_error_floor, f"seed={seed}"
    )


@pytest.mark.parametrize("cfg", CODECS, ids=_id)
def test_groups_on_the_subnormal_grid(cfg: dict) -> None:
    # Groups of small multiples of the smallest subnormal (absmax k * 2^-149, k up to
    # 3000, every value of the grid below it): the worst case for the scales' and the
    # decoded values' rounding, where the absolute floor is what keeps the bound.
    c = get_compressor(cfg)
    g = c.alignment
    tiny = 2.0**-149
    groups = []
    for k in range(1, 3000, 7):
        grp = np.minimum(np.arange(g) % k, k).astype(np.float64)
        grp[0] = k
        groups.append(grp * np.where(np.arange(g) % 2 == 0, 1, -1) * tiny)
    x = np.concatenate(groups).astype(np.float32)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    assert_within_bound(y, x.astype(np.float64), g, c.rel_error_bound, c.abs_error_floor, "")


@pytest.mark.parametrize("cfg", CODECS, ids=_id)
def test_bfloat16_times_1e30(cfg: dict, request) -> None:
    # bfloat16 shares float32's exponent range: activations scaled by 1e30 (or 1e-30)
    # round-trip within the bound, and as well as unscaled ones: scaled by a power of two
    # (the same bfloat16 significands) the error stays within a few percent of itself.
    seed = seed_for(request)
    c = get_compressor(cfg)
    g = c.alignment
    base = np.random.default_rng(seed).standard_normal(4 * g + 7)

    def roundtrip(x: np.ndarray) -> float:
        y = c.decode(c.encode(x), np.empty(x.size, np.float32), count=x.size, dtype=BF16)
        x64 = x.astype(np.float64)
        assert_within_bound(y, x64, g, c.rel_error_bound, c.abs_error_floor, f"seed={seed}")
        return float(np.linalg.norm(y - x64) / np.linalg.norm(x64))

    for scale in (1e30, 1e-30, 1e37, 1e-37):
        roundtrip((base * scale).astype(BF16))
    x1 = base.astype(BF16)
    err1 = roundtrip(x1)
    for k in (-120, -100, -60, 60, 100, 124):
        x = (x1.astype(np.float64) * 2.0**k).astype(BF16)  # exact
        assert abs(roundtrip(x) - err1) <= 0.05 * err1, f"2^{k}: seed={seed}"


# ------------------------------------------------------------------ float64 input
F32_OVERFLOW = 2.0**128 - 2.0**103  # float64 values from here round to ±Inf in float32


@pytest.mark.parametrize("cfg", CODECS, ids=_id)
def test_float64_beyond_float32_range_is_a_nan_group(cfg: dict) -> None:
    # FORMAT.md's rule: float64 data is rounded to float32 first; a value that rounds
    # beyond FLT_MAX becomes ±Inf and its whole group decodes to NaN (visibly); the
    # largest float64 below that threshold rounds to FLT_MAX and round-trips.
    c = get_compressor(cfg)
    g = c.alignment
    x = np.ones(4 * g)
    x[g + 1] = F32_OVERFLOW
    x[2 * g + 2] = -1e300
    x[3 * g + 3] = np.nextafter(F32_OVERFLOW, 0)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float64)
    nan = np.isnan(y)
    assert nan[g : 3 * g].all() and not nan[:g].any() and not nan[3 * g :].any()
    assert_within_bound(y[3 * g :], x[3 * g :], g, c.rel_error_bound, c.abs_error_floor, "")


@pytest.mark.parametrize("cfg", CODECS, ids=_id)
def test_float64_below_float32_range(cfg: dict) -> None:
    # Values below float32's smallest subnormal round to zero: within the absolute floor.
    c = get_compressor(cfg)
    g = c.alignment
    x = np.random.default_rng(1).standard_normal(2 * g) * 1e-50
    x[g:] *= 1e-250
    y = c.decode(c.encode(x), count=x.size, dtype=np.float64)
    assert (y == 0).all()
    assert_within_bound(y, x, g, c.rel_error_bound, c.abs_error_floor, "")


# --------------------------------------------------------- taco's two ranges
def _taco_cfgs() -> list[dict]:
    return [
        {"fp8_format": f, "group_size": g, "ash": a}
        for f in ("e4m3", "e5m2")
        for g in (32, 128, 512)
        for a in (True, False)
    ]


@pytest.mark.parametrize("cfg", _taco_cfgs(), ids=lambda c: "-".join(map(str, c.values())))
def test_extended_range_changes_only_groups_that_clamped(cfg: dict, request) -> None:
    # coccl_clamps=True and the default encode every group alike except those whose s
    # would leave COCCL's clamps; decoding does not depend on the option.
    seed = seed_for(request)
    g = cfg["group_size"]
    x = magnitude_sweep(np.random.default_rng(seed), g, F32).astype(np.float32)
    new, old = TacoCompressor(**cfg), TacoCompressor(**cfg, coccl_clamps=True)
    pn, po = new.encode(x), old.encode(x)
    a, b = (split_taco_payload(p, x.size, g, cfg["ash"], True) for p in (pn, po))
    ext = extended_alpha(a.alpha) if cfg["ash"] else ((a.s < 1e-12) | (a.s > 1e6))
    # The extended groups are the non-zero groups whose COCCL s sits on a clamp.
    nonzero = (padded_groups(x, g) != 0).any(axis=1)
    clamped = nonzero & ((b.s == np.float32(1e-12)) | (b.s == np.float32(1e6)))
    np.testing.assert_array_equal(ext, clamped)
    assert ext.any() and (~ext).any()
    same = ~ext
    np.testing.assert_array_equal(a.codes[same], b.codes[same])
    np.testing.assert_array_equal(a.s[same], b.s[same])
    np.testing.assert_array_equal(a.alpha[same], b.alpha[same])
    for p in (pn, po):  # either codec decodes either payload, to the same bits
        y1 = new.decode(p, count=x.size, dtype=np.float32)
        y2 = old.decode(p, count=x.size, dtype=np.float32)
        np.testing.assert_array_equal(y1.view(np.uint32), y2.view(np.uint32))
    # The clamped payload breaks the bound somewhere; the extended one nowhere.
    x64 = x.astype(np.float64)
    y_new = new.decode(pn, count=x.size, dtype=np.float32)
    assert_within_bound(y_new, x64, g, new.rel_error_bound, new.abs_error_floor, f"seed={seed}")
    err, norm, n = group_errors(old.decode(po, count=x.size, dtype=np.float32), x64, g)
    assert (err > old.rel_error_bound * norm + np.sqrt(n) * old.abs_error_floor).any()


@pytest.mark.parametrize("exponent", [-40, -30, -20, 20, 30, 37])
def test_coccl_clamps_flush_and_saturate_as_published(exponent: int) -> None:
    # COCCL's arithmetic outside its normal range: tiny groups flush to zero, huge ones
    # saturate (near 1e11 in magnitude at G = 128), as the issue that led to the extended
    # range described.
    x = (np.random.default_rng(exponent + 50).standard_normal(512) * 10.0**exponent).astype(
        np.float32
    )
    c = TacoCompressor(coccl_clamps=True)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    if exponent < 0:
        assert (np.abs(y) <= np.abs(x).max() * 1e-3).all()  # (almost) all flushed
    else:
        assert np.abs(y).max() < 1e13 and np.abs(x).max() > 1e19
    assert np.linalg.norm(y - x.astype(np.float64)) > 0.5 * np.linalg.norm(x.astype(np.float64))


@pytest.mark.parametrize("exponent", [-30, -12, 12, 30])
@pytest.mark.parametrize("ash", [True, False])
def test_without_dual_scale_the_bound_is_one(ash: bool, exponent: int) -> None:
    # The dual_scale=False ablation keeps COCCL's behaviour: far from unit scale a group
    # flushes to zero or saturates, which its stated bound (1) allows.
    c = TacoCompressor(ash=ash, dual_scale=False)
    x = (np.random.default_rng(3).standard_normal(256) * 10.0**exponent).astype(np.float32)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    assert c.rel_error_bound <= 1.001
    assert_within_bound(y, x.astype(np.float64), 128, c.rel_error_bound, c.abs_error_floor, "")
    if exponent == -30:
        assert (y == 0).all()
    if exponent == 30:
        assert np.abs(y).max() < 1e-3 * np.abs(x).max()
