"""The int codec's CUDA source (compressors/intq_kernels.cu, intq_encode.cu and
intq_decode.cu), compiled as C++ against a host emulation of the CUDA built-ins
(tests/host/cuda_emu.h: one warp of 32 threads), gives the numba kernels' payloads and
decoded values bit for bit.

This checks the kernels' indexing, packing, staging, shuffles, rounding and key stream
without a GPU; the inline PTX (used only on the device) is the one part it cannot reach,
which tests/test_codec_gpu_int.py covers on a GPU. Skips without g++ (C++20).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from coccl.compressors import intq_cpu
from coccl.compressors.intq import stream_key
from coccl.compressors.layout import int_layout

from codec_reference import grouped_gaussian, int_edge_payload, magnitude_sweep

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++")

HERE = Path(__file__).parent
SOURCES = [
    HERE.parent / "compressors" / "codec_kernels.cu",
    HERE.parent / "compressors" / "codec_tile_helpers.cu",
    HERE.parent / "compressors" / "intq_kernels.cu",
    HERE.parent / "compressors" / "intq_encode.cu",
    HERE.parent / "compressors" / "intq_decode.cu",
    HERE / "host" / "harness.cpp",
]
BF16 = np.dtype(ml_dtypes.bfloat16)
XT = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, BF16: 2}
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
# (bits, group_size, hadamard, stochastic, dtype): a lane's 32 and 64 elements, rotations
# within and across lanes, both roundings, the three element types. Rounding to nearest
# packs codes word by word where BITS divides 32 (2, 4, 8), field by field elsewhere; the
# decode's rotation runs on packed integers for BITS 2, 4, 8 (within a lane, across lanes,
# and with the two fields of a word in different blocks: 2 bits, H = 8), in float32
# otherwise.
VARIANTS = [
    (4, 128, 32, True, BF16),
    (4, 128, 32, False, BF16),
    (3, 64, 0, False, F32),
    (6, 32, 8, True, F16),
    (5, 2048, 128, True, F32),
    (2, 256, 8, False, F32),
    (8, 256, 256, False, BF16),
    (4, 2048, 2048, False, F32),
    (7, 1024, 512, False, F16),
]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("intq_host") / "all.cpp"
    path.write_text("\n".join(p.read_text() for p in SOURCES))
    return path


def _build(source: Path, defines: dict) -> Path:
    exe = source.with_name("k_" + "_".join(f"{k}{v}" for k, v in defines.items()))
    if not exe.exists():
        flags = [
            f"-D{k}={v}" for k, v in {"OP": 0, "THREADS": 32, "MIN_BLOCKS": 1, **defines}.items()
        ]
        cmd = [GXX, "-std=c++20", "-O1", "-ffp-contract=off", "-pthread"]
        cmd += ["-include", str(HERE / "host" / "cuda_emu.h"), *flags, "-x", "c++", str(source)]
        result = subprocess.run([*cmd, "-o", str(exe)], capture_output=True, text=True)
        if result.returncode:
            pytest.fail(f"g++ failed:\n{result.stderr[-4000:]}")
    return exe


def _run(exe: Path, src: np.ndarray, count: int, K: int, key: int, nout: int, init=None):
    d = exe.parent
    src.view(np.uint8).tofile(d / "in.bin")
    args = [str(exe), str(d / "in.bin"), str(count), str(K), str(key), str(nout)]
    args.append(str(d / "out.bin"))
    if init is not None:
        init.view(np.uint8).tofile(d / "init.bin")
        args.append(str(d / "init.bin"))
    subprocess.run(args, check=True)
    return np.fromfile(d / "out.bin", np.uint8)


def _same(got: np.ndarray, expect: np.ndarray) -> None:
    nan = np.isnan(expect.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    bits = {2: np.uint16, 4: np.uint32}[expect.dtype.itemsize]
    np.testing.assert_array_equal(got.view(bits)[~nan], expect.view(bits)[~nan])


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"b{v[0]}-g{v[1]}-h{v[2]}-{v[4]}")
def test_cuda_source_matches_numba(variant: tuple, source: Path) -> None:
    bits, g, h, stochastic, dtype = variant
    npl = 64 if g > 1024 else 32
    opts = {"bits": bits, "group_size": g, "hadamard": h}
    rng = np.random.default_rng(bits)
    # ISTAGE as intq_gpu launches it: whole tiles staged through shared memory at 32 a lane.
    enc = _build(source, {"IOP": 1, "BITS": bits, "GS": g, "HAD": h, "XT": XT[dtype],
                          "STOCH": int(stochastic), "NPL": npl,
                          "ISTAGE": int(npl == 32)})  # fmt: skip
    dec = _build(source, {"IOP": 2, "BITS": bits, "GS": g, "HAD": h, "XT": XT[dtype], "NPL": npl})
    acc = _build(source, {"IOP": 2, "BITS": bits, "GS": g, "HAD": h, "XT": 0, "ACC": 1, "NPL": npl})
    sweep = magnitude_sweep(rng, g, dtype).astype(dtype)
    # One element, a count short of a lane, several tiles and a partial one, the sweep
    # (groups of subnormal steps, where the codes divide).
    counts = (1, 33, 3 * 32 * npl + 37)
    inputs = [grouped_gaussian(rng, n, g, -2, 2).astype(dtype) for n in counts]
    for x in (*inputs, sweep):
        count = x.size
        layout = int_layout(count, bits, g, h)
        key = stream_key(count, 5)
        expect = np.empty(layout.nbytes, np.uint8)
        intq_cpu.int_encode(x, expect, stochastic=stochastic, key=key, **opts)
        got = _run(enc, x, count, layout.groups, key, layout.nbytes)
        np.testing.assert_array_equal(got, expect)
        out = np.empty(count, dtype)
        intq_cpu.int_decode(expect, out, accumulate=False, **opts)
        y = _run(dec, expect, count, layout.groups, 0, count * dtype.itemsize).view(dtype)
        _same(y, out)
        base = rng.standard_normal(count).astype(np.float32)
        summed = base.copy()
        intq_cpu.int_decode(expect, summed, accumulate=True, **opts)
        z = _run(acc, expect, count, layout.groups, 0, 4 * count, init=base).view(np.float32)
        _same(z, summed)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"b{v[0]}-g{v[1]}-h{v[2]}-{v[4]}")
def test_cuda_decode_matches_numba_on_any_payload(variant: tuple, source: Path) -> None:
    """Random code bytes (every code value, -2^(bits-1) included) under scales that reach
    the decode's edges: products at and past FLT_MAX (sat, around the threshold below
    which the kernel skips it), NaN, ±Inf, zeros, subnormals and negative scales."""
    bits, g, h, _, dtype = variant
    npl = 64 if g > 1024 else 32
    opts = {"bits": bits, "group_size": g, "hadamard": h}
    rng = np.random.default_rng(100 + bits)
    dec = _build(source, {"IOP": 2, "BITS": bits, "GS": g, "HAD": h, "XT": XT[dtype], "NPL": npl})
    acc = _build(source, {"IOP": 2, "BITS": bits, "GS": g, "HAD": h, "XT": 0, "ACC": 1, "NPL": npl})
    count = 3 * 32 * npl + 37
    layout = int_layout(count, bits, g, h)
    payload = int_edge_payload(rng, count, bits, g, h)
    out = np.empty(count, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        intq_cpu.int_decode(payload, out, accumulate=False, **opts)
    y = _run(dec, payload, count, layout.groups, 0, count * dtype.itemsize).view(dtype)
    _same(y, out)
    base = rng.standard_normal(count).astype(np.float32)
    summed = base.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        intq_cpu.int_decode(payload, summed, accumulate=True, **opts)
    z = _run(acc, payload, count, layout.groups, 0, 4 * count, init=base).view(np.float32)
    _same(z, summed)


@pytest.mark.parametrize(
    "variant", [v for v in VARIANTS if v[2]], ids=lambda v: f"b{v[0]}-g{v[1]}-h{v[2]}-{v[4]}"
)
def test_cuda_encode_rare_groups_match_numba(variant: tuple, source: Path) -> None:
    """With a rotation the encode rotates before it knows the raw absmax, and takes the
    raw-absmax steps again only for a warp with a group at or past its bound: groups of
    NaN, ±Inf, and magnitudes around the bound and the prescale's threshold, in whole
    tiles and in the partial last one."""
    bits, g, h, stochastic, dtype = variant
    npl = 64 if g > 1024 else 32
    opts = {"bits": bits, "group_size": g, "hadamard": h}
    rng = np.random.default_rng(200 + bits)
    enc = _build(source, {"IOP": 1, "BITS": bits, "GS": g, "HAD": h, "XT": XT[dtype],
                          "STOCH": int(stochastic), "NPL": npl,
                          "ISTAGE": int(npl == 32)})  # fmt: skip
    count = 3 * 32 * npl + 37
    x = grouped_gaussian(rng, count, g, -2, 2).astype(np.float64)
    k = -(-count // g)
    lb = int(np.log2(h))
    fmax = float(ml_dtypes.finfo(dtype).max)
    # Group j (of a few picked, the last one too): NaN, +Inf, -Inf, or a group scaled to
    # 2^(e) for e around 126 - log2 H (the bound) and 127 - log2 H (the prescale), where
    # the dtype reaches them.
    specials = [np.nan, np.inf, -np.inf]
    for e in (125, 126, 127, 128):
        if 2.0 ** (e - lb) * 1.5 < fmax:
            specials += [2.0 ** (e - lb), -(2.0 ** (e - lb)) * 1.5]
    n = min(k, len(specials))
    picked = [*rng.choice(k - 1, size=n - 1, replace=False), k - 1]
    for j, s in zip(picked, specials[:n], strict=True):
        lo, hi = j * g, min(count, j * g + g)
        if np.isfinite(s):
            z = x[lo:hi]
            x[lo:hi] = z / np.abs(z).max() * s
        else:
            x[lo + rng.integers(hi - lo)] = s
    x = x.astype(dtype)
    layout = int_layout(count, bits, g, h)
    key = stream_key(count, 9)
    expect = np.empty(layout.nbytes, np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        intq_cpu.int_encode(x, expect, stochastic=stochastic, key=key, **opts)
    got = _run(enc, x, count, layout.groups, key, layout.nbytes)
    np.testing.assert_array_equal(got, expect)
