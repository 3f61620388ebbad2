"""The tah CUDA kernels (compressors/tah_kernels.cu) run on the CPU through a host emulation
of the CUDA built-ins (tests/cuda_emulation/), against the numba kernels, bit for bit.

This checks the kernels' logic (lanes, shuffles, packing, the pivot's swaps, the scores)
where there is no GPU; tests/test_codec_gpu_tah.py checks the real thing on one. The
encode and decode steps between the kernels (the choice of low tokens, the bitmap) are the
CPU kernels' own here, as tah_gpu does them with CuPy. Skips without a C++20 compiler.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from coccl.compressors import TahCompressor
from coccl.compressors.tah_cpu import low_prefix, payload_prefix
from coccl.compressors.tah_format import SCORE_W, SCORE_WL, tah_layout

from codec_reference import magnitude_sweep

CXX = shutil.which("g++")
if CXX is None:
    pytest.skip("needs g++ for the CUDA host emulation", allow_module_level=True)

HERE = Path(__file__).parent
SOURCES = [
    HERE / "cuda_emulation" / "emu.h",
    HERE.parent / "compressors" / "codec_kernels.cu",
    HERE.parent / "compressors" / "tah_kernels.cu",
    HERE / "cuda_emulation" / "launch.cpp",
]
BF16 = np.dtype(ml_dtypes.bfloat16)
XT = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, BF16: 2}
CASES = [
    ({"row": 256}, np.dtype(np.float32)),
    ({"row": 256}, BF16),
    ({"row": 128, "tile": 32, "bits_high": 5, "bits_low": 2, "low_fraction": 0.5}, np.float16),
    ({"row": 384, "tile": 128, "bits_high": 8, "bits_low": 4, "pivot_ratio": 4.0}, np.float32),
]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """A function from a variant's defines to its compiled emulation (cached)."""
    workdir = tmp_path_factory.mktemp("tah_emulation")
    source = workdir / "all.cpp"
    source.write_text("\n".join(p.read_text() for p in SOURCES))
    libs: dict[tuple, ctypes.CDLL] = {}

    def get(defines: dict) -> ctypes.CDLL:
        key = tuple(sorted(defines.items()))
        if key not in libs:
            so = workdir / ("v" + "".join(f"_{k}{v}" for k, v in key) + ".so")
            flags = [f"-D{k}={v}" for k, v in key]
            cmd = [CXX, "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-DOP=0"]
            done = subprocess.run([*cmd, *flags, "-o", str(so), str(source)], capture_output=True)
            if done.returncode != 0:
                pytest.skip(f"the emulation does not build here: {done.stderr[-500:]!r}")
            lib = ctypes.CDLL(str(so))
            lib.emu_launch.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong] * 4
            libs[key] = lib
        return libs[key]

    return get


def _variant(c: TahCompressor) -> dict:
    return {"TILE": c.tile, "BH": c.bits_high, "BL": c.bits_low}


def emulated_encode(build, c: TahCompressor, x: np.ndarray) -> np.ndarray:
    n = x.size
    lay = tah_layout(n, c.row, c.tile, c.bits_high, c.bits_low, c.low_fraction)
    payload = np.full(lay.nbytes, 0xAB, np.uint8)  # every byte must be written
    keys = np.empty(lay.tokens, np.int64)
    tables = np.concatenate([SCORE_W, SCORE_WL]).astype(np.int64)
    score = build({"TAH_OP": 1, "XT": XT[x.dtype]})
    score.emu_launch(x.ctypes.data, keys.ctypes.data, tables.ctypes.data, n, c.row, keys.size, 0)
    lb = low_prefix(keys, lay.full_tokens, lay.low_tokens)
    flags = (lb[1:] - lb[:-1]).astype(np.uint8)
    payload[lay.bitmap_offset :] = np.packbits(flags, bitorder="little")
    ratio = f"{int(np.float32(c.pivot_ratio).view(np.uint32)):#010x}u"
    defs = {"TAH_OP": 2, "XT": XT[x.dtype], "PIVOT": int(c.pivot == "auto"), "RATIO_BITS": ratio}
    build({**defs, **_variant(c)}).emu_launch(
        x.ctypes.data, payload.ctypes.data, lb.ctypes.data, n, c.row, lay.tiles, lay.pivot_offset
    )
    return payload


def emulated_decode(build, c, payload, out: np.ndarray, accumulate: bool) -> np.ndarray:
    n = out.size
    lay = tah_layout(n, c.row, c.tile, c.bits_high, c.bits_low, c.low_fraction)
    lb = payload_prefix(payload, lay.tokens, lay.bitmap_offset)
    defs = {"TAH_OP": 3, "XT": XT[out.dtype], "ACC": int(accumulate), **_variant(c)}
    build(defs).emu_launch(
        payload.ctypes.data, out.ctypes.data, lb.ctypes.data, n, c.row, lay.tiles, lay.pivot_offset
    )
    return out


def assert_values_equal(got: np.ndarray, want: np.ndarray, msg: str) -> None:
    nan = np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan, err_msg=msg)
    bits = {2: np.uint16, 4: np.uint32}[want.dtype.itemsize]
    np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits), err_msg=msg)


def data(rng: np.random.Generator, n: int, row: int, dtype: np.dtype) -> np.ndarray:
    x = rng.standard_normal(n)
    lo, hi = (-3, 3) if dtype == np.float16 else (-20, 20)
    x *= np.repeat(10.0 ** rng.uniform(lo, hi, -(-n // row)), row)[:n]
    x[rng.random(n) < 0.01] *= 100.0  # outliers: pivot tiles and low tokens
    if n > 1000:
        x[777] = np.nan
    return x.astype(dtype)


@pytest.mark.parametrize("cfg, dtype", CASES, ids=lambda v: str(v))
def test_emulated_kernels_match_cpu(build, cfg: dict, dtype) -> None:
    dtype = np.dtype(dtype)
    c = TahCompressor(**cfg)
    rng = np.random.default_rng(c.row + c.tile)
    inputs = [data(rng, n, c.row, dtype) for n in (1, 63, c.row - 1, 7 * c.row + 100)]
    sweep = TahCompressor(**{**cfg, "row": c.tile})
    inputs.append(magnitude_sweep(np.random.default_rng(3), c.tile, dtype).astype(dtype))
    for i, x in enumerate(inputs):
        codec = sweep if i == len(inputs) - 1 else c
        msg = f"{cfg} {dtype} n={x.size}"
        want = codec.encode(x)
        np.testing.assert_array_equal(emulated_encode(build, codec, x), want, err_msg=msg)
        out = np.full(x.size, 7, dtype)
        expect = codec.decode(want, count=x.size, dtype=dtype)
        assert_values_equal(emulated_decode(build, codec, want, out, False), expect, msg)
        acc = rng.standard_normal(x.size).astype(np.float32)
        expect = codec.decode(want, acc.copy(), count=x.size, dtype=dtype, accumulate=True)
        got = emulated_decode(build, codec, want, acc.copy(), True)
        assert_values_equal(got, expect, f"{msg} accumulate")
