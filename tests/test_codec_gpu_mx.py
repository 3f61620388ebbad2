"""The mx and taco_fp CUDA kernels (compressors/mx_kernels.cu) against the CPU kernels, bit
for bit: payload bytes identical, decoded values and accumulations identical (NaNs as
NaN-ness only: FORMAT.md fixes the NaN codes and scales stored in payloads, not the bits
of a decoded NaN).

Two ways: on a GPU through CuPy (skipped without one), and everywhere the same CUDA source
compiled as plain C++ (``-DMX_HOST``, g++ with ``-ffp-contract=off``; skipped without a
compiler), whose arithmetic is what the inline PTX computes, called through ctypes.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from coccl.compressors import get_compressor
from coccl.compressors.gpu_build import ELEMENT_TYPES
from coccl.compressors.layout import num_groups

from codec_reference import grouped_gaussian, magnitude_sweep, seed_for
from gpu import GPU

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
SOURCE = Path(__file__).parents[1] / "compressors" / "mx_kernels.cu"
CONFIGS = [
    {"id": "mx"},
    {"id": "mx", "element": "e3m2"},
    {"id": "mx", "element": "e2m3", "block": 16},
    {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"},
    {"id": "mx", "element": "e3m2", "scale": "e4m3"},
    {"id": "mx", "element": "e2m3", "block": 16, "scale": "e4m3"},
    {"id": "taco_fp"},
    {"id": "taco_fp", "element": "e3m2", "group_size": 32},
    {"id": "taco_fp", "element": "e2m3", "group_size": 512},
]
COUNTS = [1, 31, 1000, 4097]
_ELEM = {"e2m1": 0, "e3m2": 1, "e2m3": 2}


def _id(cfg: dict) -> str:
    return "-".join(str(v) if k == "id" else f"{k}={v}" for k, v in cfg.items())


def _data(rng: np.random.Generator, count: int, g: int, dtype: np.dtype) -> np.ndarray:
    lo, hi = (-3, 3) if dtype == np.float16 else (-30, 30)
    x = grouped_gaussian(rng, count, g, lo, hi).astype(np.float64)
    if count > 3 * g:
        x[g + 2] = np.nan
        x[2 * g] = -np.inf
        x[3 * g : 4 * g] = 0.0
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def _assert_same(got: np.ndarray, expect: np.ndarray, msg: str) -> None:
    g64, e64 = got.astype(np.float64), expect.astype(np.float64)
    nan = np.isnan(e64)
    np.testing.assert_array_equal(np.isnan(g64), nan, err_msg=msg)
    bits = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    np.testing.assert_array_equal(got[~nan].view(bits), expect[~nan].view(bits), err_msg=msg)


# ------------------------------------------------------------- host emulation
def _defines(cfg: dict, op: str, xt: int, acc: bool) -> dict:
    c = get_compressor(cfg)
    if cfg["id"] == "mx":
        two = c.scale == "e4m3"
        ops = {"encode": 1, "decode": 2, "amax": 3}
        return {"OP": ops[op], "ELEM": _ELEM[c.element], "BS": c.block, "SC": int(two),
                "XT": xt, "ACC": int(acc)}  # fmt: skip
    cinv = int(np.float32(1.0 / np.sqrt(c.group_size)).view(np.uint32))
    return {"OP": 4 if op == "encode" else 5, "ELEM": _ELEM[c.element], "BS": c.group_size,
            "XT": xt, "ACC": int(acc), "CINV_BITS": f"{cinv:#x}u"}  # fmt: skip


@functools.cache
def _host_kernel(defines: tuple) -> ctypes.CDLL:
    out = Path(tempfile.mkdtemp(prefix="coccl_mx_host_")) / "k.so"
    flags = [f"-D{k}={v}" for k, v in defines]
    cmd = ["g++", "-x", "c++", "-DMX_HOST", *flags, "-O1", "-ffp-contract=off", "-shared",
           "-fPIC", "-o", str(out), str(SOURCE)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    lib = ctypes.CDLL(str(out))
    lib.mx_host_launch.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong] * 2
    return lib


def _host_run(cfg: dict, op: str, src: np.ndarray, dst: np.ndarray, aux, count: int, xt: int,
              acc: bool = False) -> None:  # fmt: skip
    c = get_compressor(cfg)
    lib = _host_kernel(tuple(sorted(_defines(cfg, op, xt, acc).items())))
    k = num_groups(count, c.alignment)
    lib.mx_host_launch(src.ctypes.data, dst.ctypes.data, aux.ctypes.data, count, k)


def _host_encode(cfg: dict, x: np.ndarray) -> np.ndarray:
    c = get_compressor(cfg)
    xt = ELEMENT_TYPES[x.dtype]
    payload = np.zeros(c.encoded_nbytes(x.size, x.dtype), np.uint8)
    aux = np.zeros(1, np.uint32)
    if cfg["id"] == "mx" and c.scale == "e4m3":
        _host_run(cfg, "amax", x, payload, aux, x.size, xt)
    _host_run(cfg, "encode", x, payload, aux, x.size, xt)
    return payload


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_cuda_source_on_host_matches_cpu(cfg: dict, dtype: np.dtype, request) -> None:
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    xt = ELEMENT_TYPES[dtype]
    for count in COUNTS:
        x = _data(rng, count, c.alignment, dtype)
        payload = c.encode(x)
        msg = f"{cfg} {dtype} count={count} seed={seed}"
        np.testing.assert_array_equal(_host_encode(cfg, x), payload, err_msg=msg)
        out = np.empty(count, dtype)
        _host_run(cfg, "decode", payload, out, payload, count, xt)
        _assert_same(out, c.decode(payload, count=count, dtype=dtype), msg)
        base = rng.standard_normal(count).astype(np.float32)
        acc = base.copy()
        _host_run(cfg, "decode", payload, acc, payload, count, 0, acc=True)
        expect = c.decode(payload, base.copy(), count=count, dtype=dtype, accumulate=True)
        _assert_same(acc, expect, msg + " accumulate")


@needs_gxx
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_cuda_source_on_host_whole_range(cfg: dict, request) -> None:
    seed = seed_for(request)
    c = get_compressor(cfg)
    x = magnitude_sweep(np.random.default_rng(seed), c.alignment, np.float32).astype(np.float32)
    payload = c.encode(x)
    np.testing.assert_array_equal(_host_encode(cfg, x), payload, err_msg=f"seed={seed}")
    out = np.empty(x.size, np.float32)
    _host_run(cfg, "decode", payload, out, payload, x.size, 0)
    _assert_same(out, c.decode(payload, count=x.size, dtype=np.float32), f"seed={seed}")


# ------------------------------------------------------------------------ GPU
needs_gpu = pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA GPU")


def _dev(cp, a: np.ndarray):
    return cp.asarray(a.view(np.uint16)).view(BF16) if a.dtype == BF16 else cp.asarray(a)


def _host(cp, d) -> np.ndarray:
    if np.dtype(d.dtype) == BF16:
        return cp.asnumpy(d.view(cp.uint16)).view(BF16)
    return cp.asnumpy(d)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_gpu_matches_cpu(cfg: dict, dtype: np.dtype, request) -> None:
    import cupy as cp

    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    for count in [0, *COUNTS, 1 << 20]:
        x = _data(rng, count, c.alignment, dtype)
        msg = f"{cfg} {dtype} count={count} seed={seed}"
        payload = c.encode(x)
        d_payload = c.encode(_dev(cp, x))
        np.testing.assert_array_equal(cp.asnumpy(d_payload), payload, err_msg=msg)
        got = _host(cp, c.decode(d_payload, count=count, dtype=dtype))
        _assert_same(got, c.decode(payload, count=count, dtype=dtype), msg)
        base = rng.standard_normal(count).astype(np.float32)
        d_acc = cp.asarray(base)
        c.decode(d_payload, d_acc, count=count, dtype=dtype, accumulate=True)
        expect = c.decode(payload, base.copy(), count=count, dtype=dtype, accumulate=True)
        _assert_same(cp.asnumpy(d_acc), expect, msg + " accumulate")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_gpu_whole_range_and_unaligned_payload(cfg: dict, request) -> None:
    import cupy as cp

    seed = seed_for(request)
    c = get_compressor(cfg)
    x = magnitude_sweep(np.random.default_rng(seed), c.alignment, np.float32).astype(np.float32)
    payload = c.encode(x)
    raw = cp.zeros(payload.size + 3, cp.uint8)
    d_payload = raw[3:]  # payload offsets need not be aligned
    c.encode(cp.asarray(x), d_payload)
    np.testing.assert_array_equal(cp.asnumpy(d_payload), payload, err_msg=f"seed={seed}")
    got = cp.asnumpy(c.decode(d_payload, count=x.size, dtype=np.float32))
    _assert_same(got, c.decode(payload, count=x.size, dtype=np.float32), f"seed={seed}")
