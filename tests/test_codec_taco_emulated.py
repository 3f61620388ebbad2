"""The taco kernels of gpu_kernels.CODEC_SOURCES that run by default (encode 7 and ring
hop 10, EPL elements a lane; decode and decode-accumulate 2, 32 a lane, staged) run on the
CPU through a host emulation of the CUDA built-ins (tests/cuda_emulation/), against the
numba kernels, bit for bit.

This checks the kernels' logic where there is no GPU: the lanes' split of a group and
their shuffles, the tiles copied a tile ahead through the warps' shared buffers and
written back through them (the swizzled slots), the decode's whole tiles transposed
through its padded buffer, extended-range groups, the partial last tile, unaligned
buffers (the per-lane paths), and warps that loop over several tiles (grids smaller than
the tiles). The arithmetic is the host branch of the kernels (software FP8 and bfloat16
conversions); the GPU's hardware conversions are checked against it in
tests/test_codec_gpu.py. Skips without a C++20 compiler.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

from coccl.compressors import TacoCompressor
from coccl.compressors.gpu_kernels import CODEC_SOURCES, _inv_sqrt_bits

from emulation import CXX, EMULATION, builder

if CXX is None:
    pytest.skip("needs g++ for the CUDA host emulation", allow_module_level=True)

SOURCES = [EMULATION / "emu.h", *CODEC_SOURCES, EMULATION / "codec_launch.cpp"]
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
XT = {F32: 0, BF16: 2}
OPS = {"encode": 7, "hop": 10, "decode": 2, "accumulate": 2}
OPS.update(hop_dec=10)  # the hop that also writes the decoded output (DEC)
THREADS = 64  # two warps a block
# (op, group size, elements a lane, dtype), one build each: the EPL kernels with two lanes
# a group and a whole group a lane; kernel 2 with four lanes a group and one
CASES = [
    *((op, 128, 64, dtype) for op in ("encode", "hop") for dtype in (F32, BF16)),
    ("encode", 32, 32, BF16),
    ("hop", 32, 32, BF16),
    # a whole 128-group a lane (the hop_epl=128 tuning, blocks of two warps)
    *(("hop", 128, 128, dtype) for dtype in (F32, BF16)),
    *(("hop_dec", 128, 64, dtype) for dtype in (F32, BF16)),
    ("decode", 128, 0, BF16),
    ("decode", 32, 0, F32),
    ("accumulate", 128, 0, BF16),
    # kernel 2's transposed whole tiles (16-bit outputs at four and eight lanes a group)
    # and its shuffled ones (float32 outputs; bfloat16 at G = 64)
    ("decode", 128, 0, F32),
    ("decode", 64, 0, F32),
    ("decode", 64, 0, BF16),
    ("decode", 256, 0, BF16),
]
# (count, blocks): one element, a partial group, whole tiles, several tiles a warp with a
# partial last one
COUNTS = [(1, 1), (129, 1), (4 * 32 * 64, 1), (9 * 32 * 64 + 77, 2)]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """A function from a variant's defines to its compiled emulation (cached)."""
    argtypes = {
        "emu_launch": [ctypes.c_void_p] * 3 + [ctypes.c_longlong] * 2,
        "emu_launch_dec": [ctypes.c_void_p] * 4 + [ctypes.c_longlong] * 2,
        "emu_set_grid": [ctypes.c_int],
    }
    return builder(tmp_path_factory.mktemp("taco_emulation"), SOURCES, argtypes)


def variant(op: str, G: int, epl: int, dtype: np.dtype) -> dict:
    """The defines gpu_kernels gives the kernel (taco's defaults: e4m3, ash, dual scale);
    the decodes are kernel 2 staged, accumulating into float32 for ``accumulate``."""
    defines = {
        "OP": OPS[op], "GS": G, "XT": 0 if op == "accumulate" else XT[dtype], "FMT": 0,
        "ASH": 1, "DUAL": 1, "CINV_BITS": _inv_sqrt_bits(G), "THREADS": THREADS,
        "MIN_BLOCKS": 1,
    }  # fmt: skip
    if op not in ("encode", "hop", "hop_dec"):
        return {**defines, "ACC": int(op == "accumulate"), "STAGE": 1}
    return {**defines, "EXT": 1, "EPL": epl, "DEC": int(op == "hop_dec")}


def placed(a: np.ndarray, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """A copy of ``a`` at ``offset`` bytes past a 16-byte boundary, and its poisoned frame
    (bytes around it that a kernel must not touch)."""
    frame = np.full(a.nbytes + offset + 32, 0xA5, np.uint8)
    start = (-frame.ctypes.data) % 16 + offset
    view = frame[start : start + a.nbytes]
    view[:] = a.view(np.uint8).reshape(-1)
    return view, frame


def run(build, op, G, epl, dtype, grid, *arrays, count):
    lib = build(variant(op, G, epl, dtype))
    lib.emu_set_grid(grid)
    ptrs = [a.ctypes.data for a in arrays] + [None] * (3 - len(arrays))
    launch = lib.emu_launch_dec if op == "hop_dec" else lib.emu_launch
    launch(*ptrs, count, -(-count // G))


def data(n: int, dtype: np.dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * 3
    x[::97] *= 1e4  # some groups with an outlier
    x[256:384] *= 1e-25  # groups of FORMAT.md's extended range (step 4b), tiny and huge
    x[512:640] *= 1e20
    return x.astype(dtype)


@pytest.mark.parametrize(
    ("op", "G", "epl", "dtype"), CASES, ids=lambda v: getattr(v, "name", str(v))
)
def test_taco_kernel_emulated(build, op, G, epl, dtype):
    codec = TacoCompressor(group_size=G)
    item = dtype.itemsize
    for n, grid in COUNTS:
        x = data(n, dtype, n + G)
        payload = codec.encode(x)
        for x_off, p_off in ((0, 0), (item, 1)):
            where = f"{op} n={n} offsets {x_off},{p_off}"
            if op == "encode":
                xs, _ = placed(x, x_off)
                out, frame = placed(np.zeros(payload.size, np.uint8), p_off)
                run(build, op, G, epl, dtype, grid, xs, out, count=n)
                np.testing.assert_array_equal(out, payload, err_msg=where)
            elif op == "decode":
                pin, _ = placed(payload, p_off)
                out, frame = placed(np.zeros(n, dtype), x_off)
                run(build, op, G, epl, dtype, grid, pin, out, count=n)
                want = codec.decode(payload, count=n, dtype=dtype)
                np.testing.assert_array_equal(out, want.view(np.uint8), err_msg=where)
            elif op == "accumulate":
                acc = data(n, F32, n + G + 2)
                pin, _ = placed(payload, p_off)
                out, frame = placed(acc, 4 * (x_off > 0))
                run(build, op, G, epl, dtype, grid, pin, out, count=n)
                codec.decode_into(payload, acc, dtype, True)
                np.testing.assert_array_equal(out, acc.view(np.uint8), err_msg=where)
            else:  # hop: encode(own + decode(payload)), through a float32 accumulator
                own = data(n, dtype, n + G + 1)
                acc = own.astype(np.float32)
                codec.decode_into(payload, acc, dtype, True)
                want = np.empty_like(payload)
                codec.encode_into(acc, want, dtype)
                owns, _ = placed(own, x_off)
                pin, _ = placed(payload, p_off)
                out, frame = placed(np.zeros(payload.size, np.uint8), p_off)
                if op == "hop":
                    run(build, op, G, epl, dtype, grid, owns, pin, out, count=n)
                else:  # and the decoded output, bitwise the decode of the payload out
                    dec, dframe = placed(np.zeros(n, dtype), x_off)
                    run(build, op, G, epl, dtype, grid, owns, pin, out, dec, count=n)
                    want_d = codec.decode(want, count=n, dtype=dtype)
                    np.testing.assert_array_equal(dec, want_d.view(np.uint8), err_msg=where)
                    lo = dec.ctypes.data - dframe.ctypes.data
                    untouched = np.delete(dframe, np.s_[lo : lo + dec.size])
                    assert (untouched == 0xA5).all(), f"{where}: decoded outside its output"
                np.testing.assert_array_equal(out, want, err_msg=where)
            outside = np.ones(frame.size, bool)
            start = out.ctypes.data - frame.ctypes.data
            outside[start : start + out.size] = False
            assert (frame[outside] == 0xA5).all(), f"{where}: wrote outside its output"
