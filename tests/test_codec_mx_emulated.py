"""The mx and taco_fp CUDA kernels (mx_gpu.MX_SOURCES) run on the CPU through a host
emulation of the CUDA built-ins (tests/cuda_emulation/), against the numba kernels, bit for
bit: payload bytes identical (every byte written), decoded values and accumulations
identical (NaNs as NaN-ness only, as in tests/test_codec_gpu_mx.py).

This checks the kernels' logic where there is no GPU: the lanes of a block (group), the
shuffles of its maxima, of taco_fp's energy tree and Walsh-Hadamard stages, the packing
into words, the grid-stride loops over several CUDA blocks, the 16-byte, word and byte
paths for aligned and unaligned x, out and payload, the mx decodes' staging of a warp's
whole span through shared memory (overwrite and accumulate; the counts that fill a warp's
span with out aligned), and the e4m3 partials; the launches are mx_gpu's (its grid and
unroll functions), on a small CUDA block (64 threads) and on the GPU's.
tests/test_codec_gpu_mx.py checks the real thing on one. Skips without g++ (C++20).
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from mx_reference import any_payloads, mx_encode_ref, quotient_edges

from coccl.compressors import get_compressor, minifloat, mx_gpu
from coccl.compressors.gpu_build import ELEMENT_TYPES
from coccl.compressors.layout import num_groups

from codec_reference import grouped_gaussian, magnitude_sweep, seed_for
from emulation import CXX  # g++ that builds the emulation's C++20, or None

if CXX is None:
    pytest.skip("needs g++ for the CUDA host emulation", allow_module_level=True)

HERE = Path(__file__).parent
SOURCES = [
    HERE / "cuda_emulation" / "emu.h",
    *mx_gpu.MX_SOURCES,
    HERE / "cuda_emulation" / "mx_launch.cpp",
]
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
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
E4M3_CONFIGS = [
    {"id": "mx", "element": e, "block": b, "scale": "e4m3"}
    for e in ("e2m1", "e3m2", "e2m3")
    for b in (16, 32)
]
COUNTS = [0, 1, 31, 1000, 4097]
ELEM = {"e2m1": 0, "e3m2": 1, "e2m3": 2}
OPS = {("mx", "encode"): 1, ("mx", "decode"): 2, ("mx", "parts"): 3, ("mx", "scale"): 6,
       ("taco_fp", "encode"): 4, ("taco_fp", "decode"): 5}  # fmt: skip
THREADS = 64  # a small CUDA block: more of them, and grid-stride loops at small counts
SMS = 1  # the emulated GPU's multiprocessors: mx_gpu caps the grid at 8 blocks per SM
POISON_CPU, POISON_KERNEL = 0x5A, 0xA5


def _id(cfg: dict) -> str:
    return "-".join(str(v) if k == "id" else f"{k}={v}" for k, v in cfg.items())


FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fno-strict-aliasing", "-fPIC"]
# The standard headers emu.h includes, precompiled once (most of a variant's build time).
STD_HEADERS = ("barrier", "cmath", "cstring", "cstdint", "thread", "vector", "algorithm", "memory")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """A function from a variant's defines to its compiled emulation (cached). The defines
    are #define lines after the precompiled headers (a -D would make g++ refuse them)."""
    workdir = tmp_path_factory.mktemp("mx_emulation")
    header = workdir / "emu_std.h"
    header.write_text("".join(f"#include <{h}>\n" for h in STD_HEADERS))
    subprocess.run([CXX, *FLAGS, "-x", "c++-header", str(header)], capture_output=True)
    body = "\n".join(p.read_text() for p in SOURCES)
    libs: dict[tuple, ctypes.CDLL] = {}

    def get(defines: dict) -> ctypes.CDLL:
        key = tuple(sorted(defines.items()))
        if key not in libs:
            n = len(libs)
            source, so = workdir / f"v{n}.cpp", workdir / f"v{n}.so"
            lines = [f"#define {k} {v}" for k, v in (("MX_HOST", 1), *key)]
            source.write_text("\n".join(['#include "emu_std.h"', *lines, body]))
            cmd = [CXX, *FLAGS, "-shared", "-o", str(so), str(source)]
            done = subprocess.run(cmd, capture_output=True)
            if done.returncode != 0:
                pytest.fail(f"the emulation of {key} does not build: {done.stderr[-800:]!r}")
            lib = ctypes.CDLL(str(so))
            lib.emu_mx_launch.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_longlong] * 3
            lib.emu_codes.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong]
            lib.emu_values.argtypes = [ctypes.c_void_p]
            libs[key] = lib
        return libs[key]

    return get


class Emulated:
    """mx_gpu's launches of one codec on the emulation (``threads`` per CUDA block;
    ``blocks``: a fixed grid in place of mx_gpu's)."""

    def __init__(self, build, cfg: dict, threads: int = THREADS, blocks: int | None = None):
        self.build, self.cfg, self.threads, self.blocks = build, cfg, threads, blocks
        self.codec = get_compressor(cfg)

    def defines(self, op: str, xt: int, acc: bool = False) -> dict:
        c, kind = self.codec, self.cfg["id"]
        if kind == "mx":
            d = {"ELEM": ELEM[c.element], "BS": c.block, "SC": int(c.scale == "e4m3")}
        else:
            cinv = int(np.float32(1.0 / np.sqrt(c.group_size)).view(np.uint32))
            d = {"ELEM": ELEM[c.element], "BS": c.group_size, "CINV_BITS": f"{cinv:#x}u"}
        d.update(OP=OPS[kind, op], XT=0 if op == "scale" else xt, ACC=int(acc))
        d.update(THREADS=self.threads, UNR=1 if op == "scale" else mx_gpu.chunks_and_unroll(d)[1])
        return d

    def run(self, defs: dict, src, dst, count: int, k: int, blocks: int) -> None:
        self.build(defs).emu_mx_launch(src.ctypes.data, dst.ctypes.data, count, k, blocks)

    def grid(self, defs: dict, k: int) -> int:
        if self.blocks is not None:
            return self.blocks
        return mx_gpu.grid_size(defs, k, SMS, self.threads)

    def encode(self, x: np.ndarray, payload: np.ndarray) -> np.ndarray:
        xt, k = ELEMENT_TYPES[x.dtype], num_groups(x.size, self.codec.alignment)
        if self.cfg["id"] == "mx" and self.codec.scale == "e4m3":
            parts = self.defines("parts", xt)
            g = mx_gpu.partial_grid(parts, k, SMS, self.threads)
            g = min(g, self.blocks) if self.blocks and g else g
            if g:
                self.run(parts, x, payload, x.size, k, g)
            self.run(self.defines("scale", xt), payload, payload, g, k, 1)
        if k:
            defs = self.defines("encode", xt)
            self.run(defs, x, payload, x.size, k, self.grid(defs, k))
        return payload

    def decode(self, payload: np.ndarray, out: np.ndarray, acc: bool) -> None:
        k = num_groups(out.size, self.codec.alignment)
        if out.size:
            defs = self.defines("decode", ELEMENT_TYPES[out.dtype], acc)
            self.run(defs, payload, out, out.size, k, self.grid(defs, k))


def placed(n: int, dtype, offset: int = 0) -> np.ndarray:
    """An array of n ``dtype`` whose data start ``offset`` bytes past a 64-byte boundary."""
    dtype = np.dtype(dtype)
    raw = np.empty(n * dtype.itemsize + offset + 64, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    return raw[start : start + n * dtype.itemsize].view(dtype)


def copy_at(a: np.ndarray, offset: int) -> np.ndarray:
    out = placed(a.size, a.dtype, offset)
    out[...] = a
    return out


def data(rng: np.random.Generator, count: int, g: int, dtype: np.dtype) -> np.ndarray:
    lo, hi = (-3, 3) if dtype == np.float16 else (-30, 30)
    x = grouped_gaussian(rng, count, g, lo, hi).astype(np.float64)
    if count > 3 * g:
        x[g + 2] = np.nan
        x[2 * g] = -np.inf
        x[3 * g : 4 * g] = 0.0
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def cpu_encode(codec, x: np.ndarray) -> np.ndarray:
    return codec.encode(x, np.full(codec.encoded_nbytes(x.size, x.dtype), POISON_CPU, np.uint8))


def assert_same(got: np.ndarray, expect: np.ndarray, msg: str) -> None:
    g64, e64 = got.astype(np.float64), expect.astype(np.float64)
    nan = np.isnan(e64)
    np.testing.assert_array_equal(np.isnan(g64), nan, err_msg=msg)
    bits = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    np.testing.assert_array_equal(got[~nan].view(bits), expect[~nan].view(bits), err_msg=msg)


def roundtrip(emu: Emulated, x: np.ndarray, msg: str, offsets=(0, 0, 0)) -> None:
    """Encode and decode (overwrite, accumulate) against the CPU's; ``offsets``: of x, the
    payload and out from a 64-byte boundary, in bytes."""
    c, dtype = emu.codec, x.dtype
    want = cpu_encode(c, x)
    payload = placed(want.size, np.uint8, offsets[1])
    payload[:] = POISON_KERNEL
    got = emu.encode(copy_at(x, offsets[0]), payload)
    np.testing.assert_array_equal(got, want, err_msg=msg)
    out = placed(x.size, dtype, offsets[2])
    out[:] = np.full(x.size, 7, dtype)
    emu.decode(payload, out, False)
    assert_same(out, c.decode(want, count=x.size, dtype=dtype), msg)
    base = np.random.default_rng(x.size).standard_normal(x.size).astype(np.float32)
    acc = copy_at(base, offsets[2] and 4)
    emu.decode(payload, acc, True)
    expect = c.decode(want, base.copy(), count=x.size, dtype=dtype, accumulate=True)
    assert_same(acc, expect, msg + " accumulate")


# ------------------------------------------------------------------ conversions
@pytest.mark.parametrize("element", list(ELEM))
def test_short_element_code_is_the_direct_one(build, element: str) -> None:
    # The kernels' elem_code against the direct to_code (the numba kernels' algorithm) and
    # minifloat's encode: every float32 sign and exponent with many mantissas, and random
    # bit patterns (NaN and Inf included: they saturate like the CPU's).
    f = minifloat.get_format(element)
    lib = build({"OP": 1, "ELEM": ELEM[element]})
    rng = np.random.default_rng(f.bits + f.bias)
    top = np.arange(1 << 9, dtype=np.uint32) << np.uint32(23)
    mant = np.concatenate([np.arange(0, 1 << 23, 1 << 13), rng.integers(0, 1 << 23, 2048)])
    mant = np.concatenate([mant, mant ^ 0x1FFF, (mant | 0x1FFF) - 0x1000]).astype(np.uint32)
    bits = (top[:, None] | mant[None, :]).ravel()
    bits = np.concatenate([bits, rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint32)])
    fast, direct = np.empty_like(bits), np.empty_like(bits)
    lib.emu_codes(bits.ctypes.data, fast.ctypes.data, direct.ctypes.data, bits.size)
    np.testing.assert_array_equal(fast, direct)
    finite = (bits & 0x7FFFFFFF) < 0x7F800000
    want = minifloat.encode(bits[finite].view(np.float32), element)
    np.testing.assert_array_equal(fast[finite], want)


@pytest.mark.parametrize("element", list(ELEM))
def test_element_values_are_the_decode_table(build, element: str) -> None:
    f = minifloat.get_format(element)
    got = np.empty(1 << f.bits, np.uint32)
    build({"OP": 2, "ELEM": ELEM[element]}).emu_values(got.ctypes.data)
    np.testing.assert_array_equal(got, minifloat.decode_table(element).view(np.uint32))


# ---------------------------------------------------------------------- kernels
CASES = [(cfg, d) for cfg in CONFIGS for d in DTYPES if d != np.float16 or cfg in CONFIGS[::3]]


def _case_id(v) -> str:
    return _id(v) if isinstance(v, dict) else str(v)


@pytest.mark.parametrize("cfg, dtype", CASES, ids=_case_id)
def test_emulated_kernels_match_cpu(build, cfg: dict, dtype: np.dtype, request) -> None:
    # Counts 0, 1, odd, within a block, several CUDA blocks and grid-stride steps (float16
    # for a few codecs: its loads are bfloat16's but for the conversion).
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    emu = Emulated(build, cfg)
    for count in COUNTS:
        x = data(rng, count, emu.codec.alignment, dtype)
        roundtrip(emu, x, f"{cfg} {dtype} count={count} seed={seed}")


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_emulated_kernels_whole_range(build, cfg: dict, dtype: np.dtype, request) -> None:
    # dtype's whole finite range, subnormals and blocks of them included (bfloat16: the
    # E8M0 encode's bf16x2 arithmetic on scales up to 2^127).
    seed = seed_for(request)
    emu = Emulated(build, cfg)
    x = magnitude_sweep(np.random.default_rng(seed), emu.codec.alignment, dtype)
    roundtrip(emu, x.astype(dtype), f"{dtype} seed={seed}")


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_emulated_kernels_unaligned(build, cfg: dict, dtype: np.dtype, request) -> None:
    # x and out one element past an aligned address, the payload 3 bytes (byte stores) and
    # 4 bytes (words, no 16-byte stores) past one; the last count ends mid-chunk.
    seed = seed_for(request)
    emu = Emulated(build, cfg, blocks=2)
    x = data(np.random.default_rng(seed), 2000 + 3, emu.codec.alignment, dtype)
    for pay in (3, 4):
        offsets = (dtype.itemsize, pay, dtype.itemsize)
        roundtrip(emu, x, f"{cfg} {dtype} offsets={offsets} seed={seed}", offsets)


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3], CONFIGS[7], CONFIGS[8]], ids=_id)
def test_emulated_kernels_gpu_block_size(build, cfg: dict, request) -> None:
    # mx_gpu's own CUDA block size, its grid for 132 SMs.
    seed = seed_for(request)
    emu = Emulated(build, cfg, threads=mx_gpu._THREADS)
    x = data(np.random.default_rng(seed), 9000 + 5, emu.codec.alignment, BF16)
    roundtrip(emu, x, f"{cfg} seed={seed}")


E8M0_CONFIGS = [
    {"id": "mx", "element": e, "block": b} for e in ("e2m1", "e3m2", "e2m3") for b in (16, 32)
]


@pytest.mark.parametrize("cfg", E8M0_CONFIGS, ids=_id)
def test_emulated_bf16_e8m0_every_variant(build, cfg: dict, request) -> None:
    # The bfloat16 encode with E8M0 scales computes two elements at a time (bf16x2): every
    # element format and block size, on Gaussian blocks and on bfloat16's whole range.
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    emu = Emulated(build, cfg)
    x = data(rng, 4097, emu.codec.alignment, BF16)
    roundtrip(emu, x, f"{cfg} seed={seed}")
    x = magnitude_sweep(rng, emu.codec.alignment, BF16).astype(BF16)
    roundtrip(emu, x, f"{cfg} whole range seed={seed}")


def _small_cases(b: int) -> dict[str, list[float]]:
    """Payloads of at most two blocks: the edges of the per-payload scale S."""
    nan, inf = float("nan"), float("inf")
    return {
        "empty": [],
        "one": [0.75],
        "one_nan": [nan],
        "partial": [(-1.0) ** i * (i + 1) for i in range(b - 1)],
        "zeros": [0.0] * (b + 1),
        "subnormal": [1e-40, -3e-41],
        "nan_in_block0": [nan] + [2.5] * b,
        "inf_in_block1": [0.5] * b + [-inf, 1e30],
        "all_bad": [nan] * b + [inf],
    }


def _assert_tensor_scale(cfg: dict, x: np.ndarray, payload: np.ndarray, msg: str) -> None:
    ref = mx_encode_ref(x.astype(np.float64), cfg["element"], cfg["block"], "e4m3")
    s = payload[-4:].copy().view("<f4")[0]
    assert s == np.float32(ref.tensor_scale), f"{msg}: S = {s!r}, expected {ref.tensor_scale!r}"


@pytest.mark.parametrize("case", list(_small_cases(16)))
@pytest.mark.parametrize("cfg", E4M3_CONFIGS, ids=_id)
def test_emulated_e4m3_small_payloads(build, cfg: dict, case: str) -> None:
    # S is written for every count (0 included) and whatever block 0 holds.
    emu = Emulated(build, cfg)
    x = np.array(_small_cases(cfg["block"])[case], np.float32)
    want = cpu_encode(emu.codec, x)
    _assert_tensor_scale(cfg, x, want, f"{cfg} {case} (CPU)")
    got = emu.encode(x, np.full(want.size, POISON_KERNEL, np.uint8))
    np.testing.assert_array_equal(got, want, err_msg=f"{cfg} {case}")


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("cfg", [E4M3_CONFIGS[0], E4M3_CONFIGS[3]], ids=_id)
def test_emulated_e4m3_partials(build, cfg: dict, where: str, request) -> None:
    # The payload's amax through partials of 1 to 8 CUDA blocks (grid-stride), the largest
    # finite value in the first, a middle or the last block, NaN and Inf beside.
    seed = seed_for(request)
    b = cfg["block"]
    x = np.random.default_rng(seed).standard_normal(60 * b * 8 + 5).astype(np.float32)
    k = num_groups(x.size, b)
    spot = {"first": 3, "middle": x.size // 2, "last": x.size - 1}[where]
    x[spot] = 1e3
    x[(spot + 2 * b) % x.size] = np.nan
    x[b * (k // 3)] = -np.inf
    want = cpu_encode(get_compressor(cfg), x)
    _assert_tensor_scale(cfg, x, want, f"{cfg} seed={seed}")
    for blocks in (1, 2, 7, None):
        emu = Emulated(build, cfg, blocks=blocks)
        got = emu.encode(x, np.full(want.size, POISON_KERNEL, np.uint8))
        np.testing.assert_array_equal(got, want, err_msg=f"{cfg} {blocks} blocks seed={seed}")


# The payload's largest value: S in the float32 encode's range (2.0**-73 and 2.0**98: at
# its ends), then below and above it (x / d in double there), and S at its floor 2^-126
# (float16: its own range).
EDGE_TOPS = [3.0, 1.5e3, 2.0**-73, 2.0**98, 2.0**-100, 2.0**110, 1e-38]
EDGE_TOPS_F16 = [3.0, 1.5e3, 2.0**-10]
EDGE_CASES = [(cfg, d) for cfg in E4M3_CONFIGS for d in (np.dtype(np.float32), BF16)] + [
    (E4M3_CONFIGS[0], np.dtype(np.float16))
]


@pytest.mark.parametrize("cfg, dtype", EDGE_CASES, ids=_case_id)
def test_emulated_e4m3_quotient_edges(build, cfg: dict, dtype: np.dtype, request) -> None:
    # Elements whose quotient x / d lies within a few ulps of a code's rounding boundary,
    # for many block divisors d: the E4M3 encode's quotients must be the rounded ones.
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    emu = Emulated(build, cfg)
    for top in EDGE_TOPS if dtype != np.float16 else EDGE_TOPS_F16:
        x = quotient_edges(rng, cfg["element"], cfg["block"], top, dtype).astype(dtype)
        want = cpu_encode(emu.codec, x)
        got = emu.encode(x, np.full(want.size, POISON_KERNEL, np.uint8))
        np.testing.assert_array_equal(got, want, err_msg=f"{cfg} {dtype} top={top} seed={seed}")


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16, np.dtype(np.float16)], ids=str)
@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c["id"] == "mx"], ids=_id)
def test_emulated_decode_any_payload(build, cfg: dict, dtype: np.dtype, request) -> None:
    # Decodes of payloads no encode writes: random codes, every scale byte (E8M0 0, the
    # subnormal 2^-127, and 255, NaN; E4M3 with the sign bit and the NaN codes), E4M3's S
    # over ANY_S; whole warp spans and a partial end, out aligned and one element past; on
    # mx_gpu's grid and on one CUDA block (its warps take many grid steps: the lean loop's
    # loads one step ahead).
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    count = 256 * c.alignment + 3 * c.alignment + 5
    for s, payload in any_payloads(rng, c, count, dtype):
        want = c.decode(payload, count=count, dtype=dtype)
        for emu in (Emulated(build, cfg), Emulated(build, cfg, blocks=1)):
            msg = f"{cfg} {dtype} S={s} blocks={emu.blocks} seed={seed}"
            for offset in (0, dtype.itemsize):
                out = placed(count, dtype, offset)
                out[:] = np.full(count, 7, dtype)
                emu.decode(payload, out, False)
                assert_same(out, want, f"{msg} offset={offset}")
            base = rng.standard_normal(count).astype(np.float32)
            acc = copy_at(base, 0)
            emu.decode(payload, acc, True)
            expect = c.decode(payload, base.copy(), count=count, dtype=dtype, accumulate=True)
            assert_same(acc, expect, f"{msg} accumulate")
