"""The int8 codec against the independent float64 reference (tests/codec_reference.py).

Behaviour shared with taco (dtypes, accumulate, poisoned outputs, NaN groups, counts,
determinism) is tested in test_codec_contract.py for both codecs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from coccl.compressors import Int8Compressor
from coccl.compressors.layout import int8_layout

from codec_reference import (
    grouped_gaussian,
    int8_decode_ref,
    int8_encode_ref,
    padded_groups,
    rel_l2,
    seed_for,
    split_int8_payload,
)

GROUP_SIZES = [32, 64, 128, 256, 512]
COUNTS = [0, 1, 31, 127, 128, 129, 1000]


def check_against_reference(x: np.ndarray, group_size: int, seed: int) -> np.ndarray:
    """Encode and decode x; compare payload and output with the reference. Returns output.

    The scales are bitwise equal (one correctly rounded division either way); the codes
    are equal but where x * (1/scale) and x / scale round to different sides of a tie,
    which moves a code by one; the decoded values are exactly q * scale rounded once.
    """
    c = Int8Compressor(group_size=group_size)
    msg = f"seed={seed} G={group_size} count={x.size}"
    payload = c.encode(x)
    assert (
        payload.size == c.encoded_nbytes(x.size, x.dtype) == x.size + 4 * -(-x.size // group_size)
    )
    got = split_int8_payload(payload, x.size, group_size)
    ref = int8_encode_ref(x, group_size)
    np.testing.assert_array_equal(got.scale, ref.scale, err_msg=msg)
    dq = np.abs(got.q.astype(np.int64) - ref.q)
    assert dq.size == 0 or dq.max() <= 1, msg
    assert dq.size == 0 or (dq > 0).mean() <= 1e-3, msg
    y = c.decode(payload, count=x.size, dtype=np.float32)
    expect = int8_decode_ref(got, x.size, group_size).astype(np.float32)
    np.testing.assert_array_equal(y, expect, err_msg=msg)
    return y


@pytest.mark.parametrize("count", COUNTS + [4096 + 5])
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_matches_reference(group_size: int, count: int, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    x = grouped_gaussian(np.random.default_rng(seed), count, group_size)
    check_against_reference(x, group_size, seed)


@pytest.mark.parametrize("count", COUNTS)
def test_layout(count: int) -> None:
    layout = int8_layout(count, 128)
    k = -(-count // 128)
    assert layout == (k, count, count + 4 * k)
    assert Int8Compressor().encoded_nbytes(count, np.float64) == count + 4 * k


@pytest.mark.parametrize("exponent", [-30, -20, -10, -3, 3, 10, 20, 30])
@pytest.mark.parametrize("group_size", [32, 128])
def test_extreme_magnitudes(group_size: int, exponent: int, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    x = grouped_gaussian(
        np.random.default_rng(seed), 1000, group_size, exponent - 0.5, exponent + 0.5
    )
    check_against_reference(x, group_size, seed)


def test_largest_float32_values() -> None:
    # A FORMAT.md edge: fl(FLT_MAX / 127) rounds up, so 127 * scale would overflow; the
    # scale goes one float32 step down and ±FLT_MAX decodes finite, as in the reference.
    x = np.array([3.4028235e38, -3.4028235e38, 1e38, -1.0], dtype=np.float32)
    y = check_against_reference(x, 32, 0)
    assert np.isfinite(y).all()
    assert np.abs(y[:2] - x[:2]).max() <= 3.4028235e38 * 2.0**-22


@pytest.mark.parametrize("group_size", [32, 128])
def test_tiny_groups(group_size: int, request: pytest.FixtureRequest) -> None:
    # Groups whose absmax is below 127 * 2^-128 (~3.7e-37, float32 subnormals included)
    # have a scale whose reciprocal would overflow: FORMAT.md divides by the scale instead,
    # rounded up where needed so that no code clamps. The codes match the reference, and
    # the group round-trips within the bound plus the subnormal floor.
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    bits = rng.integers(1, 0x00800000, size=4 * group_size, dtype=np.uint32)
    bits[group_size : 2 * group_size] >>= 16  # a group of the smallest subnormals
    x = bits.view(np.float32) * rng.choice(np.float32([-1, 1]), size=bits.size)
    x[2 * group_size :] *= np.float32(2.0**30)  # normal, below 3.7e-37
    x[::7] = 0.0
    y = check_against_reference(x, group_size, seed)
    assert (y[x == 0] == 0).all() and (np.sign(y) * np.sign(x) >= 0).all(), f"seed={seed}"
    c = Int8Compressor(group_size=group_size)
    err = np.linalg.norm(padded_groups(y.astype(np.float64) - x, group_size), axis=1)
    norm = np.linalg.norm(padded_groups(x, group_size), axis=1)
    limit = c.rel_error_bound * norm + np.sqrt(group_size) * c.abs_error_floor
    assert (err <= limit).all(), f"seed={seed}"


def test_zero_group() -> None:
    x = np.zeros(300, dtype=np.float32)
    x[200:210] = np.arange(118, 128)  # scale = 1: these are exact
    c = Int8Compressor()
    payload = c.encode(x)
    parts = split_int8_payload(payload, 300, 128)
    np.testing.assert_array_equal(parts.scale, [0.0, 1.0, 0.0])
    y = c.decode(payload, count=300, dtype=np.float32)
    np.testing.assert_array_equal(y, x)


def test_exact_codes() -> None:
    # scale = 127/127 = 1: integers round-trip exactly; x.5 rounds half to even.
    x = np.array([127, -127, 0, 1.5, 2.5, -0.5, 3.49, 100.0], dtype=np.float32)
    payload = Int8Compressor(group_size=32).encode(x)
    np.testing.assert_array_equal(payload[:8].view(np.int8), [127, -127, 0, 2, 2, 0, 3, 100])


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_roundtrip_error_on_gaussian(group_size: int, request: pytest.FixtureRequest) -> None:
    seed = seed_for(request)
    x = np.random.default_rng(seed).standard_normal(1 << 16).astype(np.float32)
    c = Int8Compressor(group_size=group_size)
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    err = rel_l2(y, x)
    assert abs(err - c.rel_error_typical) <= 0.1 * c.rel_error_typical, f"err={err} seed={seed}"
    assert c.rel_error_typical < 0.01


def test_error_bound_value() -> None:
    c = Int8Compressor()
    assert math.sqrt(128) / 254 <= c.rel_error_bound <= 1.001 * math.sqrt(128) / 254
    # The bound is attained: one element at amax, the rest just below half a step.
    x = np.full(128, 0.4999 / 127, dtype=np.float32)
    x[0] = 1.0
    y = c.decode(c.encode(x), count=128, dtype=np.float32)
    assert rel_l2(y, x) <= c.rel_error_bound
    assert rel_l2(y, x) >= 0.8 * c.rel_error_bound


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
@given(x=_normal_range_data(), group_size=st.sampled_from(GROUP_SIZES))
def test_property_size_written_and_bounded(x: np.ndarray, group_size: int) -> None:
    c = Int8Compressor(group_size=group_size)
    payload = c.encode(x)
    assert payload.size == c.encoded_nbytes(x.size, np.float32)
    out = np.full(x.size, np.nan, dtype=np.float32)
    c.decode(payload, out, count=x.size, dtype=np.float32)
    assert np.isfinite(out).all()  # every element written
    err = np.linalg.norm(padded_groups(out - x, group_size), axis=1)
    norm = np.linalg.norm(padded_groups(x, group_size), axis=1)
    assert (err <= c.rel_error_bound * norm).all(), (err / norm).max()


@_property
@given(count=st.integers(0, 5000), group_size=st.sampled_from(GROUP_SIZES))
def test_property_payload_size(count: int, group_size: int) -> None:
    c = Int8Compressor(group_size=group_size)
    assert c.encode(np.ones(count, np.float32)).size == c.encoded_nbytes(count, np.float32)
    assert c.encoded_nbytes(count, np.float32) == count + 4 * -(-count // group_size)
