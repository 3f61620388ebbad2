"""The taco codec against the independent float64 reference (tests/codec_reference.py).

Behaviour shared with int8 (dtypes, accumulate, poisoned outputs, NaN groups, counts,
determinism) is tested in test_codec_contract.py for both codecs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from coccl.compressors import TacoCompressor, get_compressor
from coccl.compressors.layout import taco_layout

from codec_reference import (
    QMAX,
    extended_alpha,
    fp8_ordinal,
    fp8_values,
    group_max,
    grouped_gaussian,
    padded_groups,
    rel_l2,
    seed_for,
    split_taco_payload,
    taco_decode_ref,
    taco_encode_ref,
)

ALL_CONFIGS = [
    {"fp8_format": f, "group_size": g, "ash": a, "dual_scale": d}
    for f, g, a, d in itertools.product(
        ["e4m3", "e5m2"], [32, 64, 128, 256, 512], [True, False], [True, False]
    )
]
SOME_CONFIGS = [
    {"fp8_format": "e4m3", "group_size": 128, "ash": True, "dual_scale": True},
    {"fp8_format": "e5m2", "group_size": 128, "ash": True, "dual_scale": True},
    {"fp8_format": "e4m3", "group_size": 32, "ash": True, "dual_scale": True},
    {"fp8_format": "e4m3", "group_size": 512, "ash": True, "dual_scale": True},
    {"fp8_format": "e4m3", "group_size": 128, "ash": False, "dual_scale": True},
    {"fp8_format": "e4m3", "group_size": 128, "ash": True, "dual_scale": False},
    {"fp8_format": "e5m2", "group_size": 64, "ash": False, "dual_scale": False},
    {
        "fp8_format": "e4m3",
        "group_size": 128,
        "ash": True,
        "dual_scale": True,
        "coccl_clamps": True,
    },
    {
        "fp8_format": "e5m2",
        "group_size": 32,
        "ash": False,
        "dual_scale": True,
        "coccl_clamps": True,
    },
]
COUNTS = [0, 1, 31, 127, 128, 129, 1000]


def _id(cfg: dict) -> str:
    clamps = "-coccl" if cfg.get("coccl_clamps") else ""
    return (
        f"{cfg['fp8_format']}-G{cfg['group_size']}-ash{int(cfg['ash'])}-ds{int(cfg['dual_scale'])}"
        + clamps
    )


def check_encoding(x: np.ndarray, cfg: dict, seed: int) -> np.ndarray:
    """Encode x with the codec and compare the payload with the reference encoding.

    Returns the payload. Scales must agree within a few float32 ulps (for a group that took
    the extended range: the ratio s / alpha, which is what decoding uses, and its alpha
    must lie outside [1e-3, 1e3] and differ from the reference's by a power of two); codes
    must be equal for all but a tiny fraction, and differ elsewhere by at most one code
    step, or by a value negligible next to the group's largest (float32 vs float64
    cancellation in the rotation can move a coefficient that is ~1e-6 of the group's scale
    by a few codes of the finer e5m2 subnormals).
    """
    c = TacoCompressor(**cfg)
    g, fmt, ash, ds = cfg["group_size"], cfg["fp8_format"], cfg["ash"], cfg["dual_scale"]
    clamps = cfg.get("coccl_clamps", False)
    payload = c.encode(x)
    assert payload.dtype == np.uint8 and payload.size == c.encoded_nbytes(x.size, x.dtype)
    got = split_taco_payload(payload, x.size, g, ash, ds)
    ref = taco_encode_ref(x, g, fmt, ash, ds, clamps)
    msg = f"seed={seed} cfg={cfg} count={x.size}"

    ext = ref.extended
    if ash:
        np.testing.assert_array_equal(extended_alpha(got.alpha), ext, err_msg=f"ext; {msg}")
        p = np.log2(got.alpha[ext] / ref.alpha[ext])
        assert (np.abs(p - np.round(p)) <= 1e-5).all(), f"alpha not scaled by 2^p; {msg}"
        k_got, k_ref = got.s[ext] / got.alpha[ext], ref.s[ext] / ref.alpha[ext]
        rel = np.abs(k_got / k_ref - 1)
        assert rel.size == 0 or rel.max() <= 32 * 2.0**-24, f"s/alpha off by {rel.max()}; {msg}"
    for name, tol_ulps in (("alpha", 8), ("s", 16)):
        a, b = getattr(got, name), getattr(ref, name)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=f"{name} NaNs; {msg}")
        ok = ~np.isnan(b) & ~(ext if ash else np.zeros_like(ext))
        ulps = np.abs(a[ok] - b[ok]) / np.spacing(np.abs(b[ok]).astype(np.float32))
        assert ulps.size == 0 or ulps.max() <= tol_ulps, f"{name} off by {ulps.max()} ulps; {msg}"
    if not ash:  # the codes follow the s stored, which for tiny groups is subnormal
        ref = taco_encode_ref(x, g, fmt, ash, ds, clamps, fitted_s=got.s)

    d_ord = np.abs(fp8_ordinal(got.codes) - fp8_ordinal(ref.codes))
    va, vb = fp8_values(got.codes, fmt), fp8_values(ref.codes, fmt)
    with np.errstate(invalid="ignore"):
        scale = np.nanmax(np.abs(vb), axis=1, initial=0.0)[:, None]
        negligible = np.abs(va - vb) <= 1e-5 * scale
    nan_rows = np.isnan(ref.s) | np.isnan(ref.alpha)
    np.testing.assert_array_equal(got.codes[nan_rows], 0x7F, err_msg=msg)
    fine = (d_ord <= 1) | negligible | nan_rows[:, None]
    assert fine.all(), f"codes differ beyond one step at {np.argwhere(~fine)[:5]}; {msg}"
    frac = float((d_ord > 0).mean()) if d_ord.size else 0.0
    assert frac <= 1e-3, f"{frac:.2e} of the codes differ from the reference; {msg}"
    return payload


def check_decoding(payload: np.ndarray, count: int, cfg: dict, seed: int) -> np.ndarray:
    """Decode with the codec and compare with the reference decoding of the same payload."""
    c = TacoCompressor(**cfg)
    g, fmt, ash, ds = cfg["group_size"], cfg["fp8_format"], cfg["ash"], cfg["dual_scale"]
    got = c.decode(payload, count=count, dtype=np.float32)
    ref = taco_decode_ref(split_taco_payload(payload, count, g, ash, ds), count, g, fmt, ash)
    msg = f"seed={seed} cfg={cfg} count={count}"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=msg)
    ok = ~np.isnan(ref)
    scale = group_max(np.where(ok, ref, 0.0), g)
    err = np.abs(got[ok].astype(np.float64) - ref[ok])
    # float32 rotation vs float64: ~log2(G) roundings of the group's largest magnitude,
    # and the rounding of a subnormal result.
    assert (err <= 2e-6 * scale[ok] + c.abs_error_floor).all(), f"max err {err.max()}; {msg}"
    return got


@pytest.mark.parametrize("cfg", ALL_CONFIGS, ids=_id)
def test_matches_reference(cfg: dict, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    x = grouped_gaussian(np.random.default_rng(seed), 3000, cfg["group_size"])
    payload = check_encoding(x, cfg, seed)
    check_decoding(payload, x.size, cfg, seed)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("cfg", SOME_CONFIGS, ids=_id)
def test_counts_match_reference(cfg: dict, count: int, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    x = grouped_gaussian(np.random.default_rng(seed), count, cfg["group_size"])
    payload = check_encoding(x, cfg, seed)
    check_decoding(payload, count, cfg, seed)


@pytest.mark.parametrize("count", COUNTS + [4096 + 77])
@pytest.mark.parametrize("ash", [True, False])
@pytest.mark.parametrize("dual_scale", [True, False])
def test_layout(count: int, ash: bool, dual_scale: bool) -> None:
    g = 128
    k = -(-count // g)
    layout = taco_layout(count, g, ash=ash, dual_scale=dual_scale)
    assert layout.groups == k
    assert layout.nbytes == k * g + 4 * k * (int(ash) + int(dual_scale))
    assert layout.scale_offset == (k * g if dual_scale else None)
    assert layout.alpha_offset == (k * g + 4 * k * int(dual_scale) if ash else None)
    c = TacoCompressor(ash=ash, dual_scale=dual_scale)
    assert c.encoded_nbytes(count, np.float32) == layout.nbytes
    assert c.encoded_nbytes(count, np.float64) == layout.nbytes  # independent of dtype


def test_default_ratio() -> None:
    assert TacoCompressor().encoded_nbytes(1 << 20, np.float32) == int(1.0625 * (1 << 20))


@pytest.mark.parametrize("exponent", [-30, -20, -12, -6, 6, 12, 20, 30])
@pytest.mark.parametrize("cfg", SOME_CONFIGS, ids=_id)
def test_extreme_magnitudes(cfg: dict, exponent: int, request: pytest.FixtureRequest) -> None:
    # Far outside the normal range COCCL's clamps of alpha and s would decide: by default
    # the group takes the extended range, with coccl_clamps it saturates (or flushes);
    # the kernels must do exactly what the reference does, either way.
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    x = grouped_gaussian(rng, 700, cfg["group_size"], exponent - 0.5, exponent + 0.5)
    payload = check_encoding(x, cfg, seed)
    check_decoding(payload, x.size, cfg, seed)


@pytest.mark.parametrize("cfg", SOME_CONFIGS, ids=_id)
def test_float32_subnormals(cfg: dict, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    bits = rng.integers(1, 0x00800000, size=600, dtype=np.uint32)
    x = bits.view(np.float32) * rng.choice(np.float32([-1, 1]), size=600)
    payload = check_encoding(x, cfg, seed)
    y = check_decoding(payload, x.size, cfg, seed)
    assert np.isfinite(y).all() and np.abs(y).max() <= 1e-37


@pytest.mark.parametrize("cfg", SOME_CONFIGS, ids=_id)
def test_zero_groups_decode_to_zero(cfg: dict, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    g = cfg["group_size"]
    x = grouped_gaussian(np.random.default_rng(seed), 5 * g + 3, g)
    x[g : 3 * g] = 0.0
    x[4 * g :] = 0.0  # the last, partial group too
    c = TacoCompressor(**cfg)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    zero = x == 0
    assert (y[g : 3 * g] == 0).all() and (y[4 * g :] == 0).all(), f"seed={seed}"
    assert np.isfinite(y).all() and (y[~zero] != 0).any()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("group_size", [32, 128, 512])
def test_roundtrip_error_on_gaussian(
    fmt: str, group_size: int, request: pytest.FixtureRequest
) -> None:
    seed = seed_for(request)
    x = np.random.default_rng(seed).standard_normal(1 << 16).astype(np.float32)
    c = TacoCompressor(fp8_format=fmt, group_size=group_size)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    err = rel_l2(y, x)
    # rel_error_typical is measured at G = 128; other group sizes differ by < 10 %.
    assert abs(err - c.rel_error_typical) <= 0.1 * c.rel_error_typical, f"err={err} seed={seed}"
    per_group = np.linalg.norm(padded_groups(y - x, group_size), axis=1) / np.linalg.norm(
        padded_groups(x, group_size), axis=1
    )
    assert per_group.max() <= c.rel_error_bound, f"seed={seed}"


@pytest.mark.parametrize("exponent", [-9, -6, -3, 0, 3, 6])
@pytest.mark.parametrize("cfg", [c for c in SOME_CONFIGS if c["dual_scale"]], ids=_id)
def test_bound_across_normal_range(
    cfg: dict, exponent: int, request: pytest.FixtureRequest
) -> None:
    # rel_error_bound holds for every group whose absmax is within ~1e-9 .. 1e8.
    seed = seed_for(request)
    g = cfg["group_size"]
    x = grouped_gaussian(np.random.default_rng(seed), 20 * g, g, exponent, exponent + 0.5)
    c = TacoCompressor(**cfg)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    err = np.linalg.norm(padded_groups(y - x, g), axis=1)
    norm = np.linalg.norm(padded_groups(x, g), axis=1)
    assert (err <= c.rel_error_bound * norm).all(), f"{(err / norm).max()} seed={seed}"


def test_e4m3_typical_error_is_about_2_6_percent() -> None:
    assert 0.025 <= TacoCompressor().rel_error_typical <= 0.027


@pytest.mark.parametrize("cfg", ALL_CONFIGS, ids=_id)
def test_error_bound_is_consistent(cfg: dict) -> None:
    c = TacoCompressor(**cfg)
    assert 0 < c.rel_error_typical < c.rel_error_bound
    if cfg["dual_scale"]:
        step = 2.0 ** -(4 if cfg["fp8_format"] == "e4m3" else 3)
        assert step <= c.rel_error_bound <= 1.01 * step


# ------------------------------------------------------------------ property tests
@st.composite
def _normal_range_data(draw: st.DrawFn) -> np.ndarray:
    """float32 arrays of 1..700 elements, magnitudes 1e-3 .. 1e3, both signs."""
    count = draw(st.integers(1, 700))
    mags = draw(
        hnp.arrays(np.float32, count, elements=st.floats(float(np.float32(1e-3)), 1e3, width=32))
    )
    signs = draw(hnp.arrays(np.int8, count, elements=st.sampled_from([-1, 1])))
    return (mags * signs).astype(np.float32)


_property = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_property
@given(x=_normal_range_data(), cfg=st.sampled_from(SOME_CONFIGS))
def test_property_size_written_and_bounded(x: np.ndarray, cfg: dict) -> None:
    c = get_compressor("taco", **cfg)
    payload = c.encode(x)
    assert payload.size == c.encoded_nbytes(x.size, np.float32)
    out = np.full(x.size, np.nan, dtype=np.float32)
    c.decode(payload, out, count=x.size, dtype=np.float32)
    assert np.isfinite(out).all()  # every element written
    g = cfg["group_size"]
    err = np.linalg.norm(padded_groups(out - x, g), axis=1)
    norm = np.linalg.norm(padded_groups(x, g), axis=1)
    assert (err <= c.rel_error_bound * norm).all(), (err / norm).max()


@_property
@given(count=st.integers(0, 5000), cfg=st.sampled_from(ALL_CONFIGS))
def test_property_payload_size(count: int, cfg: dict) -> None:
    c = TacoCompressor(**cfg)
    x = np.ones(count, dtype=np.float32)
    assert c.encode(x).size == c.encoded_nbytes(count, np.float32)
    k = -(-count // cfg["group_size"])
    assert c.encoded_nbytes(count, np.float32) == k * (
        cfg["group_size"] + 4 * (cfg["ash"] + cfg["dual_scale"])
    )


def test_reference_qmax_matches_codec() -> None:
    from coccl.compressors import fp8

    assert QMAX == {name: f.qmax for name, f in fp8.FORMATS.items()}
