"""The int codec's CUDA kernels (compressors/intq_gpu.py) against its CPU kernels, bit for
bit: payload bytes identical, decoded values identical (NaNs as NaN-ness), for every
variant, aligned and unaligned counts and buffers, the three kernel dtypes and the whole
float32 range. Skips without CuPy and a GPU.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpu import GPU

if not GPU:
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)

import cupy  # noqa: E402

from coccl.compressors import get_compressor, intq_cpu, intq_gpu  # noqa: E402
from coccl.compressors.intq import stream_key  # noqa: E402
from coccl.compressors.layout import int_layout  # noqa: E402

from codec_reference import (  # noqa: E402
    grouped_gaussian,
    int_edge_payload,
    magnitude_sweep,
    seed_for,
)

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
COUNTS = [0, 1, 31, 1000, 4097, 100003]
# (bits, group_size, hadamard, stochastic): every width plain and rotated, then group sizes
# and blocks at the edges (each variant compiles its own kernels: the list stays short).
VARIANTS = [(b, 128, 0, False) for b in range(2, 9)] + [(b, 128, 32, True) for b in range(2, 9)]
VARIANTS += [
    (4, 32, 0, True),
    (3, 64, 0, False),
    (6, 32, 8, False),
    (8, 256, 16, True),
    (5, 1024, 1024, True),
    (4, 2048, 0, False),
    (4, 2048, 64, True),
    (8, 2048, 2048, False),
    (8, 256, 256, False),
    (2, 128, 8, False),
]
NARROW = [(4, 128, 0, False), (8, 128, 0, True), (4, 128, 32, False), (6, 32, 0, True)]


def _vid(v: tuple) -> str:
    b, g, h, s = v
    return f"b{b}-g{g}-h{h}-{'sr' if s else 'rn'}"


def to_dev(a: np.ndarray) -> cupy.ndarray:
    if a.dtype == BF16:
        return cupy.asarray(a.view(np.uint16)).view(BF16)
    return cupy.asarray(a)


def to_host(d: cupy.ndarray) -> np.ndarray:
    if np.dtype(d.dtype) == BF16:
        return cupy.asnumpy(d.view(cupy.uint16)).view(BF16)
    return cupy.asnumpy(d)


def _assert_same(got: np.ndarray, expect: np.ndarray, msg: str) -> None:
    g64, e64 = got.astype(np.float64), expect.astype(np.float64)
    nan = np.isnan(e64)
    np.testing.assert_array_equal(np.isnan(g64), nan, err_msg=msg)
    bits = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    np.testing.assert_array_equal(got[~nan].view(bits), expect[~nan].view(bits), err_msg=msg)


def _both(x: np.ndarray, variant: tuple, key: int, offset: int = 0) -> tuple:
    """The CPU payload and the GPU payload (written at byte ``offset`` of a larger buffer)."""
    b, g, h, s = variant
    opts = {"bits": b, "group_size": g, "hadamard": h}
    nbytes = int_layout(x.size, b, g, h).nbytes
    cpu = np.empty(nbytes, np.uint8)
    intq_cpu.int_encode(x, cpu, stochastic=s, key=key, **opts)
    big = cupy.zeros(nbytes + 16, cupy.uint8)
    dev = big[offset : offset + nbytes]
    intq_gpu.int_encode(to_dev(x), dev, stochastic=s, key=key, **opts)
    return cpu, dev, opts


def _cases() -> list[tuple]:
    f32 = [(v, n, DTYPES[0]) for v in VARIANTS for n in COUNTS]
    return f32 + [(v, n, d) for v in NARROW for n in COUNTS for d in DTYPES[1:]]


@pytest.mark.parametrize(
    "variant, count, dtype", _cases(), ids=lambda p: _vid(p) if isinstance(p, tuple) else str(p)
)
def test_gpu_matches_cpu(variant: tuple, count: int, dtype: np.dtype, request) -> None:
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    x = grouped_gaussian(rng, count, variant[1], -4, 4).astype(dtype)
    if count > 500:
        x[rng.integers(count)] = np.nan
    key = stream_key(seed, 3)
    cpu, dev, opts = _both(x, variant, key)
    msg = f"{_vid(variant)} count={count} {dtype} seed={seed}"
    np.testing.assert_array_equal(cupy.asnumpy(dev), cpu, err_msg=msg)
    # Decode into the dtype, and accumulate into float32.
    out = np.empty(count, dtype)
    intq_cpu.int_decode(cpu, out, accumulate=False, **opts)
    d_out = to_dev(np.zeros(count, dtype))
    intq_gpu.int_decode(dev, d_out, accumulate=False, **opts)
    _assert_same(to_host(d_out), out, msg)
    base = rng.standard_normal(count).astype(np.float32)
    acc = base.copy()
    intq_cpu.int_decode(cpu, acc, accumulate=True, **opts)
    d_acc = cupy.asarray(base)
    intq_gpu.int_decode(dev, d_acc, accumulate=True, **opts)
    _assert_same(cupy.asnumpy(d_acc), acc, f"{msg} accumulate")


@pytest.mark.parametrize("offset", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "variant", [(4, 128, 0, False), (3, 128, 32, True), (6, 32, 0, True)], ids=_vid
)
def test_unaligned_payload(variant: tuple, offset: int) -> None:
    x = grouped_gaussian(np.random.default_rng(offset), 70001, variant[1])
    cpu, dev, opts = _both(x, variant, 12345, offset)
    np.testing.assert_array_equal(cupy.asnumpy(dev), cpu)
    out = np.empty(x.size, np.float32)
    intq_cpu.int_decode(cpu, out, accumulate=False, **opts)
    d_out = cupy.empty(x.size + 1, cupy.float32)[1:]  # not 16-byte aligned either
    intq_gpu.int_decode(dev, d_out, accumulate=False, **opts)
    _assert_same(cupy.asnumpy(d_out), out, f"offset={offset}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", NARROW, ids=_vid)
def test_whole_range(variant: tuple, dtype: np.dtype, request) -> None:
    seed = seed_for(request)
    x = magnitude_sweep(np.random.default_rng(seed), variant[1], dtype).astype(dtype)
    cpu, dev, opts = _both(x, variant, seed)
    np.testing.assert_array_equal(cupy.asnumpy(dev), cpu, err_msg=f"seed={seed}")
    out = np.empty(x.size, np.float32)
    intq_cpu.int_decode(cpu, out, accumulate=False, **opts)
    d_out = cupy.empty(x.size, cupy.float32)
    intq_gpu.int_decode(dev, d_out, accumulate=False, **opts)
    _assert_same(cupy.asnumpy(d_out), out, f"seed={seed}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "variant", [(4, 128, 32, False), (8, 256, 256, False), (5, 128, 32, False)], ids=_vid
)
def test_decode_any_payload(variant: tuple, dtype: np.dtype) -> None:
    # Random code bytes (every code, -2^(bits-1) included: the first group all of it) under
    # scales at the decode's edges: products past FLT_MAX (sat), NaN, ±Inf, zeros,
    # subnormals, negative scales.
    b, g, h, _ = variant
    opts = {"bits": b, "group_size": g, "hadamard": h}
    rng = np.random.default_rng(b)
    count = 100003
    payload = int_edge_payload(rng, count, b, g, h)
    out = np.empty(count, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        intq_cpu.int_decode(payload, out, accumulate=False, **opts)
    d_out = to_dev(np.zeros(count, dtype))
    intq_gpu.int_decode(cupy.asarray(payload), d_out, accumulate=False, **opts)
    _assert_same(to_host(d_out), out, str(dtype))
    base = rng.standard_normal(count).astype(np.float32)
    acc = base.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        intq_cpu.int_decode(payload, acc, accumulate=True, **opts)
    d_acc = cupy.asarray(base)
    intq_gpu.int_decode(cupy.asarray(payload), d_acc, accumulate=True, **opts)
    _assert_same(cupy.asnumpy(d_acc), acc, f"{dtype} accumulate")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "variant",
    [(4, 128, 32, False), (8, 128, 0, True), (3, 64, 0, False), (4, 2048, 64, True)],
    ids=_vid,
)
def test_warps_loop_over_tiles(variant: tuple, dtype: np.dtype, monkeypatch, request) -> None:
    # The grid as if the GPU had one multiprocessor: every warp runs several tiles, so the
    # encode's next tile is copied while one computes (two buffers a warp) and the decode's
    # next codes and scale are loaded one tile ahead, a partial tile last.
    monkeypatch.setattr(intq_gpu, "sm_count", lambda cp: 1)
    monkeypatch.setattr(intq_gpu, "_launches", {})
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    x = grouped_gaussian(rng, 200003, variant[1], -4, 4).astype(dtype)
    x[rng.integers(x.size)] = np.nan
    cpu, dev, opts = _both(x, variant, stream_key(seed, 3))
    msg = f"{_vid(variant)} {dtype} seed={seed}"
    np.testing.assert_array_equal(cupy.asnumpy(dev), cpu, err_msg=msg)
    out = np.empty(x.size, dtype)
    intq_cpu.int_decode(cpu, out, accumulate=False, **opts)
    d_out = to_dev(np.zeros(x.size, dtype))
    intq_gpu.int_decode(dev, d_out, accumulate=False, **opts)
    _assert_same(to_host(d_out), out, msg)
    base = rng.standard_normal(x.size).astype(np.float32)
    acc = base.copy()
    intq_cpu.int_decode(cpu, acc, accumulate=True, **opts)
    d_acc = cupy.asarray(base)
    intq_gpu.int_decode(dev, d_acc, accumulate=True, **opts)
    _assert_same(cupy.asnumpy(d_acc), acc, f"{msg} accumulate")


@pytest.mark.parametrize(
    "cfg",
    [
        {"bits": 4},
        {"bits": 8},
        {"bits": 8, "group_size": 2048},
        {"bits": 4, "hadamard": 32, "rounding": "stochastic", "seed": 5},
    ],
    ids=str,
)
def test_codec_on_gpu(cfg: dict) -> None:
    # The public API on CuPy arrays (float64 and accumulate bridged by _dispatch), with a
    # salt: the CPU's bytes and values.
    c = get_compressor("int", **cfg)
    x = grouped_gaussian(np.random.default_rng(1), 300001, c.group_size).astype(np.float64)
    payload = c.encode(x, salt=77)
    d_payload = c.encode(cupy.asarray(x), salt=77)
    np.testing.assert_array_equal(cupy.asnumpy(d_payload), payload)
    for dtype in (np.float64, np.float32, BF16):
        y = c.decode(payload, count=x.size, dtype=dtype)
        d_y = c.decode(d_payload, count=x.size, dtype=dtype)
        _assert_same(
            to_host(d_y).astype(np.float64).astype(np.float32), y.astype(np.float32), str(dtype)
        )


def test_ring_hop_only_for_int8_bytes() -> None:
    like = cupy.empty(10, cupy.float32)
    assert get_compressor("int", bits=8).reduce_encode_kernel(like, np.float32) is not None
    assert get_compressor("int", bits=4).reduce_encode_kernel(like, np.float32) is None
