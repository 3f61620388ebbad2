"""The int codec family against the independent float64 reference (tests/codec_reference.py):
payload layout, codes and scales, exact decoding, int8's bytes at 8 bits, reproducible and
unbiased stochastic rounding, and the salt and stochastic declarations of the contract.
The contract's generic checks (test_codec_contract.py), the whole-range bound
(test_codec_range.py) and the fixtures run on int as on every codec.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from fixtures.make_codec_fixtures import make_extreme_input, make_input

from coccl.compressors import IntCompressor, get_compressor, intq_cpu
from coccl.compressors import cpu_kernels as ck
from coccl.compressors.intq import mix64, stream_key, stream_salt
from coccl.compressors.layout import int8_layout, int_layout

from codec_reference import (
    assert_within_bound,
    grouped_gaussian,
    int_decode_ref,
    int_rotated_ref,
    int_uniform_ref,
    seed_for,
    split_int_payload,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
COUNTS = [0, 1, 31, 1000, 4097]
CFGS = [
    {"bits": 2, "group_size": 32},
    {"bits": 3, "hadamard": 32},
    {"bits": 4},
    {"bits": 4, "hadamard": 8},
    {"bits": 5, "group_size": 256, "hadamard": 256},
    {"bits": 6, "group_size": 32},
    {"bits": 7, "group_size": 1024, "hadamard": 64},
    {"bits": 8, "hadamard": 32},
    {"bits": 4, "group_size": 2048, "hadamard": 2048},
    {"bits": 4, "hadamard": 32, "rounding": "stochastic", "seed": 3},
    {"bits": 6, "group_size": 32, "rounding": "stochastic", "seed": 1 << 63},
    {"bits": 8, "rounding": "stochastic"},
]


def _id(cfg: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in cfg.items())


def _codec(cfg: dict) -> IntCompressor:
    c = get_compressor("int", **cfg)
    assert isinstance(c, IntCompressor)
    return c


# ------------------------------------------------------------------------ layout
@pytest.mark.parametrize("h", [0, 8, 32, 128])
@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("count", [0, 1, 7, 31, 33, 128, 1000, 4097])
def test_layout(count: int, bits: int, h: int) -> None:
    g = 128
    layout = int_layout(count, bits, g, h)
    coded = -(-count // h) * h if h else count
    assert layout.coded == coded and layout.groups == -(-count // g)
    assert layout.scale_offset == math.ceil(coded * bits / 8)
    assert layout.nbytes == layout.scale_offset + 4 * layout.groups
    assert _codec({"bits": bits, "hadamard": h}).encoded_nbytes(count, np.float32) == layout.nbytes
    if bits == 8 and not h:
        assert layout.nbytes == int8_layout(count, g).nbytes


# --------------------------------------------------------- against the reference
def _check_codes(c: IntCompressor, x: np.ndarray, payload: np.ndarray, salt: int, msg: str) -> None:
    """Codes equal the float64 reference's, except where the scaled value lies within the
    float32 rounding of the kernels' rotation of a rounding boundary; scales as FORMAT.md
    computes them (the reference's within float32 rounding)."""
    g, h, q_max = c.group_size, c.hadamard, c.qmax
    parts = split_int_payload(payload, x.size, c.bits, g, h)
    r = int_rotated_ref(x, g, h)  # (K, G)
    bad = ~np.isfinite(r).all(axis=1)
    assert np.isnan(parts.scale[bad]).all(), msg
    assert not parts.q[np.repeat(bad, g)[: parts.q.size]].any(), f"{msg}: a NaN group's codes"
    amax = np.abs(np.where(bad[:, None], 0.0, r)).max(axis=1, initial=0.0)
    normal = ~bad & (amax > 1e-30) & (amax < 1e30)
    m = float(h) if h else 1.0
    np.testing.assert_allclose(parts.scale[normal], amax[normal] / (q_max * m), rtol=2e-6)
    step = np.repeat(parts.scale * m, g)[: parts.q.size]
    flat = r.reshape(-1)[: parts.q.size]
    ok = np.repeat(normal, g)[: parts.q.size]
    y = flat[ok] / step[ok]
    q = parts.q[ok]
    slack = 1e-5 * q_max
    if c.rounding == "nearest":
        ref = np.clip(np.rint(y), -q_max, q_max)
        near = np.abs(np.abs(y - np.floor(y)) - 0.5) < slack
    else:
        u = int_uniform_ref(c.seed, salt, parts.q.size)[ok]
        f = np.floor(y)
        ref = np.clip(np.where(u < y - f, f + 1, f), -q_max, q_max)
        near = (np.abs(u - (y - f)) < slack) | (np.abs(y - np.rint(y)) < slack)
    assert (np.abs(q - ref) <= 1).all(), msg
    assert ((q == ref) | near).all(), f"{msg}: {int((~((q == ref) | near)).sum())} codes off"


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("cfg", CFGS, ids=_id)
def test_payload_matches_reference(cfg: dict, count: int, request) -> None:
    seed = seed_for(request)
    c = _codec(cfg)
    x = grouped_gaussian(np.random.default_rng(seed), count, c.group_size, -6, 6)
    if count > 100:
        x[77] = np.nan  # a NaN group
    salt = seed & 0xFFFF
    payload = c.encode(x, salt=salt)
    msg = f"{cfg} count={count} seed={seed}"
    _check_codes(c, x, payload, salt, msg)
    parts = split_int_payload(payload, count, c.bits, c.group_size, c.hadamard)
    expect = int_decode_ref(parts, count, c.group_size, c.hadamard)
    y = c.decode(payload, count=count, dtype=np.float32)
    nan = np.isnan(expect)
    np.testing.assert_array_equal(np.isnan(y), nan, err_msg=msg)
    np.testing.assert_array_equal(y[~nan].view(np.uint32), expect[~nan].view(np.uint32), msg)
    finite = np.isfinite(int_rotated_ref(x, c.group_size, 0)).all(axis=1)
    ok = np.repeat(finite, c.group_size)[:count]  # whole groups, so grouping is kept
    if ok.any():
        bound = c.rel_error_bound
        assert_within_bound(y[ok], x[ok], c.group_size, bound, c.abs_error_floor, msg)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16), BF16], ids=str)
@pytest.mark.parametrize("cfg", CFGS[:4], ids=_id)
def test_roundtrip_dtypes(cfg: dict, dtype: np.dtype, request) -> None:
    seed = seed_for(request)
    c = _codec(cfg)
    x = grouped_gaussian(np.random.default_rng(seed), 4097, c.group_size, -2, 2).astype(dtype)
    y = c.decode(c.encode(x), np.empty(x.size, np.float32), count=x.size, dtype=dtype)
    x64 = x.astype(np.float64)
    assert_within_bound(y, x64, c.group_size, c.rel_error_bound, c.abs_error_floor, f"{seed}")


# ------------------------------------------------------------------ int8's bytes
def _int8_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [make_input(), make_extreme_input(), grouped_gaussian(rng, 9000, 128, -40, 36)]


@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("g", [32, 64, 128, 256, 512, 1024, 2048])
def test_int8_bytes_at_8_bits(g: int, which: int) -> None:
    # int with bits=8 (no rotation, nearest) is int8: the codec runs int8's kernels, and
    # the int kernels themselves produce the same bytes and values.
    x = _int8_inputs()[which]
    expect = np.empty(int8_layout(x.size, g).nbytes, np.uint8)
    ck.int8_encode(x, expect, group_size=g)
    own = np.empty_like(expect)
    intq_cpu.int_encode(x, own, bits=8, group_size=g, hadamard=0, stochastic=False, key=0)
    np.testing.assert_array_equal(own, expect)
    c = _codec({"bits": 8, "group_size": g})
    np.testing.assert_array_equal(c.encode(x, salt=9), expect)
    y8 = np.empty(x.size, np.float32)
    ck.int8_decode(expect, y8, group_size=g, accumulate=False)
    y = np.empty(x.size, np.float32)
    intq_cpu.int_decode(expect, y, bits=8, group_size=g, hadamard=0, accumulate=False)
    nan = np.isnan(y8)
    np.testing.assert_array_equal(np.isnan(y), nan)
    np.testing.assert_array_equal(y[~nan].view(np.uint32), y8[~nan].view(np.uint32))
    if g <= 512:
        np.testing.assert_array_equal(get_compressor("int8", group_size=g).encode(x), expect)


def test_int8_fixture_bytes() -> None:
    from pathlib import Path

    with np.load(Path(__file__).parent / "fixtures" / "codecs.npz") as data:
        np.testing.assert_array_equal(data["int_b8__payload"], data["int8_g128__payload"])


# ----------------------------------------------------------- stochastic rounding
def test_stream_key_rule() -> None:
    gamma = 0x9E3779B97F4A7C15
    assert stream_key(5, 9) == mix64(mix64(5 + gamma) ^ 9)
    # mix64 is a bijection: distinct salts (or seeds) give distinct keys.
    keys = {stream_key(1, s) for s in range(4096)} | {stream_key(s, 1) for s in range(4096)}
    assert len(keys) >= 8191
    assert mix64(0) == 0 and mix64(1) != mix64(2)
    u = int_uniform_ref(5, 9, 3)
    z = [mix64(stream_key(5, 9) + (i + 1) * gamma) >> 40 for i in range(3)]
    np.testing.assert_array_equal(u, np.array(z) * 2.0**-24)


def test_stream_salt() -> None:
    assert stream_salt(rank=0, call=0) == 0
    assert stream_salt(rank=1, call=2, chunk=3, step=4) == (2 << 36) | (1 << 20) | (3 << 10) | 4
    assert (
        stream_salt(rank=(1 << 16) - 1, call=(1 << 28) - 1, chunk=1023, step=1023) == (1 << 64) - 1
    )
    salts = {
        stream_salt(rank=r, call=c, chunk=k, step=s)
        for r in range(4)
        for c in range(4)
        for k in range(4)
        for s in range(4)
    }
    assert len(salts) == 256
    for bad in (
        {"rank": -1, "call": 0},
        {"rank": 1 << 16, "call": 0},
        {"rank": 0, "call": 0, "step": 1024},
    ):
        with pytest.raises(ValueError):
            stream_salt(**bad)
    with pytest.raises(TypeError):
        stream_salt(rank=0, call=1.0)


@pytest.mark.parametrize("cfg", [c for c in CFGS if c.get("rounding")], ids=_id)
def test_stochastic_reproducible(cfg: dict, request) -> None:
    seed = seed_for(request)
    c = _codec(cfg)
    x = grouped_gaussian(np.random.default_rng(seed), 5000, c.group_size)
    first = c.encode(x, salt=7)
    assert np.array_equal(first, c.encode(x, salt=7))
    assert np.array_equal(first, _codec(cfg).encode(x.copy(), salt=7))
    assert not np.array_equal(first, c.encode(x, salt=8))
    other_seed = _codec({**cfg, "seed": cfg.get("seed", 0) ^ 1})
    assert not np.array_equal(first, other_seed.encode(x, salt=7))
    assert c.stochastic and c.encode(x).tobytes() == c.encode(x, salt=0).tobytes()


def test_nearest_ignores_salt() -> None:
    x = grouped_gaussian(np.random.default_rng(0), 3000, 128)
    for c in (_codec({"bits": 4}), _codec({"bits": 8}), get_compressor("taco")):
        assert not c.stochastic
        assert np.array_equal(c.encode(x, salt=1), c.encode(x, salt=2))


@pytest.mark.parametrize("salt", [-1, 1 << 64])
def test_salt_out_of_range(salt: int) -> None:
    for c in (_codec({"rounding": "stochastic"}), get_compressor("int8")):
        with pytest.raises(ValueError, match="salt"):
            c.encode(np.ones(10, np.float32), salt=salt)
    with pytest.raises(TypeError, match="salt"):
        _codec({}).encode(np.ones(10, np.float32), salt=1.0)


UNBIASED = [{"bits": 4}, {"bits": 2, "group_size": 32}, {"bits": 6, "hadamard": 32}]


@pytest.mark.parametrize("cfg", UNBIASED, ids=_id)
def test_stochastic_unbiased(cfg: dict, request) -> None:
    # E[code] = the scaled value: the mean over k salts of the codes approaches it within
    # Hoeffding's bound (a code lies in [floor(y), floor(y) + 1]: |mean - y| <= 6 / sqrt(k)
    # fails with probability below 2 exp(-72) per value), and the mean decoded error falls
    # like 1 / sqrt(k).
    seed = seed_for(request)
    c = _codec({**cfg, "rounding": "stochastic", "seed": seed})
    g, h = c.group_size, c.hadamard
    x = grouped_gaussian(np.random.default_rng(seed), 2048, g, -1, 1)
    k = 256
    payloads = [c.encode(x, salt=s) for s in range(k)]
    parts = [split_int_payload(p, x.size, c.bits, g, h) for p in payloads]
    scale = parts[0].scale
    assert all(np.array_equal(p.scale, scale) for p in parts)  # rounding leaves D alone
    y = int_rotated_ref(x, g, h).reshape(-1) / np.repeat(scale * (h or 1), g)
    mean_q = np.mean([p.q for p in parts], axis=0)
    assert np.abs(mean_q - y[: mean_q.size]).max() <= 6 / math.sqrt(k) + 1e-4 * c.qmax
    decoded = [c.decode(p, count=x.size, dtype=np.float32) for p in payloads]
    err = [np.linalg.norm(np.mean(decoded[:n], axis=0) - x) for n in (16, 256)]
    assert err[1] < 0.5 * err[0], f"seed={seed}: {err}"


def test_declared_stochastic() -> None:
    assert _codec({"rounding": "stochastic"}).stochastic
    for name in ("identity", "int8", "taco", "int"):
        assert not get_compressor(name).stochastic


def test_defaults_and_options() -> None:
    c = get_compressor("int")
    assert c.get_config() == {
        "id": "int",
        "bits": 4,
        "group_size": 128,
        "hadamard": 0,
        "rounding": "nearest",
        "seed": 0,
    }
    assert c.alignment == 128 and c.qmax == 7
    assert [_codec({"bits": b}).qmax for b in range(2, 9)] == [1, 3, 7, 15, 31, 63, 127]
    int8_bound = get_compressor("int8").rel_error_bound
    assert _codec({"bits": 8}).rel_error_bound == pytest.approx(int8_bound, rel=1e-12)
