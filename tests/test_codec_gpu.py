"""GPU codec kernels (compressors/gpu_kernels.py) against the CPU kernels, bit for bit.

Payload bytes must be identical, and decoded values identical bit for bit except that
NaNs are compared as NaN-ness only: the GPU's arithmetic returns its canonical NaN where
the CPU propagates the payload of the NaN it got, and FORMAT.md fixes only the NaN bits
stored in payloads (0x7F codes, 0x7FC00000 scales), which are compared exactly.
"""

from __future__ import annotations

import importlib
import importlib.util

import ml_dtypes
import numpy as np
import pytest

try:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no CUDA device")
except Exception as exc:  # ImportError, no driver, no device
    pytest.skip(f"needs CuPy and a CUDA GPU ({exc})", allow_module_level=True)

from coccl.compressors import gpu_kernels as gk  # noqa: E402
from coccl.compressors.layout import int8_layout, taco_nbytes  # noqa: E402

from codec_reference import magnitude_sweep  # noqa: E402

pytestmark = pytest.mark.gpu

if importlib.util.find_spec("coccl.compressors.cpu_kernels") is not None:
    ck = importlib.import_module("coccl.compressors.cpu_kernels")
else:  # written by another engineer; the comparison tests wait for it
    ck = None
needs_cpu = pytest.mark.skipif(ck is None, reason="compressors/cpu_kernels.py not available")

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
COUNTS = [0, 1, 31, 127, 128, 129, 1000, 100003]
TACO_GROUPS = [32, 64, 128, 256, 512]


# ------------------------------------------------------------------------ helpers
def to_dev(a: np.ndarray) -> cupy.ndarray:
    try:
        return cupy.asarray(a)
    except Exception:
        if a.dtype != BF16:
            raise
        return cupy.asarray(a.view(np.uint16)).view(BF16)


def to_host(d: cupy.ndarray) -> np.ndarray:
    try:
        return cupy.asnumpy(d)
    except Exception:
        if np.dtype(d.dtype) != BF16:
            raise
        return cupy.asnumpy(d.view(cupy.uint16)).view(BF16)


def dev_empty(n: int, dtype, fill_byte: int, offset_bytes: int = 0) -> cupy.ndarray:
    """n elements of dtype, every byte fill_byte, starting offset_bytes past 256-aligned."""
    dtype = np.dtype(dtype)
    raw = cupy.full(n * dtype.itemsize + offset_bytes, fill_byte, dtype=cupy.uint8)
    view = raw[offset_bytes:]
    if dtype == np.uint8:
        return view
    try:
        return view.view(dtype)
    except Exception:
        if dtype != BF16:
            raise
        return view.view(cupy.uint16).view(BF16)


def make_data(n: int, dtype, rng: np.random.Generator, G: int) -> np.ndarray:
    """Gaussian groups of random magnitude (1e-30..1e30; 1e-6..1e3 for float16), plus
    groups that are all zero, subnormal, hold NaN, +Inf or -Inf, one spike, a constant,
    one lone subnormal, or mix tiny and huge values."""
    dtype = np.dtype(dtype)
    K = max(1, -(-n // G))
    x = rng.standard_normal(n)
    lo, hi = (-6, 3) if dtype == np.float16 else (-30, 30)
    x *= np.repeat(10.0 ** rng.uniform(lo, hi, K), G)[:n]
    tiny = {np.dtype(np.float16): 3e-6, BF16: 3e-39, np.dtype(np.float32): 3e-40}[dtype]
    kinds = ["zero", "sub", "nan", "inf", "ninf", "spike", "const", "mixed", "sub1"]
    for i, kind in enumerate(kinds):
        g = 1 + 3 * i
        if g >= K:
            break
        sl = slice(g * G, min(n, (g + 1) * G))
        m = sl.stop - sl.start
        if kind == "zero":
            x[sl] = 0.0
        elif kind == "sub":
            x[sl] = rng.standard_normal(m) * tiny
        elif kind == "sub1":
            x[sl] = 0.0
            x[sl.start] = -tiny
        elif kind == "nan":
            x[sl.start + m // 2] = np.nan
        elif kind == "inf":
            x[sl.start] = np.inf
        elif kind == "ninf":
            x[sl.stop - 1] = -np.inf
        elif kind == "spike":
            x[sl] = rng.standard_normal(m) * 1e-3
            x[sl.start + m // 3] = 1e4
        elif kind == "const":
            x[sl] = -2.5
        elif kind == "mixed":
            big, small = (1e4, 1e-6) if dtype == np.float16 else (1e20, 1e-20)
            x[sl] = rng.standard_normal(m) * np.where(rng.random(m) < 0.5, small, big)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dtype)


def assert_values_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Bitwise equality, NaNs compared as NaN-ness."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    gf, wf = got.astype(np.float32), want.astype(np.float32)
    gn, wn = np.isnan(gf), np.isnan(wf)
    uint = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    diff = (gn != wn) | (~wn & (got.view(uint) != want.view(uint)))
    if diff.any():
        idx = np.nonzero(diff)[0][:8]
        pytest.fail(
            f"{what}: {int(diff.sum())} values differ, first at {idx}: "
            f"got {got[idx]} want {want[idx]}"
        )


def assert_bytes_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    diff = got != want
    if diff.any():
        idx = np.nonzero(diff)[0][:8]
        pytest.fail(
            f"{what}: {int(diff.sum())} bytes differ, first at {idx}: "
            f"got {got[idx]} want {want[idx]}"
        )


def int8_nbytes(n: int, G: int) -> int:
    return int8_layout(n, G).nbytes


def cpu_taco_encode(x, G, fmt, ash, dual, clamps=False):
    p = np.empty(taco_nbytes(x.size, G, ash, dual), np.uint8)
    ck.taco_encode(
        x, p, group_size=G, fp8_format=fmt, ash=ash, dual_scale=dual, coccl_clamps=clamps
    )
    return p


def cpu_taco_decode(p, n, dtype, G, fmt, ash, dual, acc=None):
    out = np.empty(n, dtype) if acc is None else acc.copy()
    ck.taco_decode(
        p, out, group_size=G, fp8_format=fmt, ash=ash, dual_scale=dual, accumulate=acc is not None
    )
    return out


def cpu_int8_encode(x, G):
    p = np.empty(int8_nbytes(x.size, G), np.uint8)
    ck.int8_encode(x, p, group_size=G)
    return p


def cpu_int8_decode(p, n, dtype, G, acc=None):
    out = np.empty(n, dtype) if acc is None else acc.copy()
    ck.int8_decode(p, out, group_size=G, accumulate=acc is not None)
    return out


def gpu_taco_encode(x, G, fmt, ash, dual, fill=0xA5, x_off=0, p_off=0, clamps=False):
    xd = dev_empty(x.size, x.dtype, 0, x_off)
    xd[...] = to_dev(x)
    pd = dev_empty(taco_nbytes(x.size, G, ash, dual), np.uint8, fill, p_off)
    gk.taco_encode(
        xd, pd, group_size=G, fp8_format=fmt, ash=ash, dual_scale=dual, coccl_clamps=clamps
    )
    return to_host(pd)


def gpu_taco_decode(p, n, dtype, G, fmt, ash, dual, acc=None, fill=0xFF, o_off=0, p_off=0):
    pd = dev_empty(p.size, np.uint8, 0, p_off)
    pd[...] = to_dev(p)
    if acc is None:
        od = dev_empty(n, dtype, fill, o_off)
    else:
        od = dev_empty(n, np.float32, 0, o_off)
        od[...] = to_dev(acc)
    gk.taco_decode(
        pd, od, group_size=G, fp8_format=fmt, ash=ash, dual_scale=dual, accumulate=acc is not None
    )
    return to_host(od)


def gpu_int8_encode(x, G, fill=0xA5, x_off=0, p_off=0):
    xd = dev_empty(x.size, x.dtype, 0, x_off)
    xd[...] = to_dev(x)
    pd = dev_empty(int8_nbytes(x.size, G), np.uint8, fill, p_off)
    gk.int8_encode(xd, pd, group_size=G)
    return to_host(pd)


def gpu_int8_decode(p, n, dtype, G, acc=None, fill=0xFF, o_off=0, p_off=0):
    pd = dev_empty(p.size, np.uint8, 0, p_off)
    pd[...] = to_dev(p)
    if acc is None:
        od = dev_empty(n, dtype, fill, o_off)
    else:
        od = dev_empty(n, np.float32, 0, o_off)
        od[...] = to_dev(acc)
    gk.int8_decode(pd, od, group_size=G, accumulate=acc is not None)
    return to_host(od)


def _taco_cases():
    cases = []
    for G in TACO_GROUPS:
        for fmt in ("e4m3", "e5m2"):
            for ash in (True, False):
                for dual in (True, False):
                    for dt in DTYPES:
                        full = G in (32, 128, 512)
                        if full or (dt == BF16 and ash and dual):
                            cases.append(
                                pytest.param(
                                    G,
                                    fmt,
                                    ash,
                                    dual,
                                    dt,
                                    id=(f"G{G}-{fmt}-ash{int(ash)}-ds{int(dual)}-{dt.name}"),
                                )
                            )
    return cases


# -------------------------------------------------------------------------- taco
@needs_cpu
@pytest.mark.parametrize("G,fmt,ash,dual,dtype", _taco_cases())
def test_taco_bitwise_vs_cpu(G, fmt, ash, dual, dtype):
    rng = np.random.default_rng(G * 7 + len(fmt) + 2 * ash + dual)
    for n in COUNTS:
        x = make_data(n, dtype, rng, G)
        want = cpu_taco_encode(x, G, fmt, ash, dual)
        for fill in (0xA5, 0x00):  # poisoned payloads: every byte must be written
            got = gpu_taco_encode(x, G, fmt, ash, dual, fill=fill)
            assert_bytes_equal(got, want, f"taco encode n={n} fill={fill:#x}")
        # the CPU payload decodes on the GPU (and the GPU payload, identical, on the CPU)
        want_d = cpu_taco_decode(want, n, dtype, G, fmt, ash, dual)
        assert_values_equal(
            cpu_taco_decode(got, n, dtype, G, fmt, ash, dual),
            want_d,
            f"cpu decode of gpu payload n={n}",
        )
        for fill in (0xFF, 0x11):  # poisoned outputs
            got_d = gpu_taco_decode(want, n, dtype, G, fmt, ash, dual, fill=fill)
            assert_values_equal(got_d, want_d, f"taco decode n={n} fill={fill:#x}")
        acc = rng.standard_normal(n).astype(np.float32)
        want_a = cpu_taco_decode(want, n, np.float32, G, fmt, ash, dual, acc=acc)
        got_a = gpu_taco_decode(want, n, np.float32, G, fmt, ash, dual, acc=acc)
        assert_values_equal(got_a, want_a, f"taco decode accumulate n={n}")


@needs_cpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("G", [32, 64, 128, 512])
@pytest.mark.parametrize("epl", [0, 32, 64, 128])
def test_taco_encode_kernels_agree(epl, G, dtype):
    """Both encode kernels (32 elements per lane, and up to a whole group per lane) and
    every lane split give the CPU's payload, aligned or not, with or without ash."""
    rng = np.random.default_rng(epl + G)
    with gk.tuning(encode_epl=epl):
        for n in (1, 129, 4096 * 3 + 77, 100003):
            x = make_data(n, dtype, rng, G)
            for ash, dual in ((True, True), (False, True), (True, False)):
                want = cpu_taco_encode(x, G, "e5m2", ash, dual)
                for x_off, p_off in ((0, 0), (np.dtype(dtype).itemsize, 1)):
                    got = gpu_taco_encode(x, G, "e5m2", ash, dual, x_off=x_off, p_off=p_off)
                    where = f"n={n} ash={ash} dual={dual} offsets {x_off},{p_off}"
                    assert_bytes_equal(got, want, where)


@needs_cpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("G", [32, 128, 512])
def test_taco_unaligned_buffers(G, dtype):
    """Views that start off the 16-byte (and 4-byte) boundaries take the slow paths."""
    rng = np.random.default_rng(11)
    item = np.dtype(dtype).itemsize
    for n in (31, 1000, 4097, 20000):
        x = make_data(n, dtype, rng, G)
        want = cpu_taco_encode(x, G, "e4m3", True, True)
        want_d = cpu_taco_decode(want, n, dtype, G, "e4m3", True, True)
        for x_off, p_off in ((item, 0), (0, 1), (0, 2), (0, 3), (item, 4), (8, 8)):
            got = gpu_taco_encode(x, G, "e4m3", True, True, x_off=x_off, p_off=p_off)
            assert_bytes_equal(got, want, f"encode n={n} offsets {x_off},{p_off}")
            got_d = gpu_taco_decode(want, n, dtype, G, "e4m3", True, True, o_off=x_off, p_off=p_off)
            assert_values_equal(got_d, want_d, f"decode n={n} offsets {x_off},{p_off}")
            acc = rng.standard_normal(n).astype(np.float32)
            want_a = cpu_taco_decode(want, n, np.float32, G, "e4m3", True, True, acc=acc)
            got_a = gpu_taco_decode(
                want,
                n,
                np.float32,
                G,
                "e4m3",
                True,
                True,
                acc=acc,
                o_off=4 * (x_off > 0),
                p_off=p_off,
            )
            assert_values_equal(got_a, want_a, f"accumulate n={n} offsets {x_off},{p_off}")


@needs_cpu
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_taco_fp8_conversion_exhaustive_codes(fmt):
    """Without ash and dual_scale the codes are fp8(x) itself: every fp8 value, the
    midpoints between neighbours (ties to even), values past Qmax and subnormals."""
    f8 = ml_dtypes.float8_e4m3fn if fmt == "e4m3" else ml_dtypes.float8_e5m2
    vals = np.arange(256, dtype=np.uint8).view(f8).astype(np.float32)
    vals = np.sort(vals[np.isfinite(vals)])
    mids = (vals[:-1].astype(np.float64) + vals[1:]) / 2
    near = np.concatenate([mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)])
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            vals,
            near.astype(np.float32),
            np.float32([1e30, -1e30, 3e38]),
            (rng.standard_normal(20000) * 10.0 ** rng.uniform(-45, 6, 20000)),
        ]
    )
    x = x.astype(np.float32)
    x = np.concatenate([x, np.zeros((-x.size) % 128, np.float32)])
    for G in (32, 128):
        want = cpu_taco_encode(x, G, fmt, False, False)
        assert_bytes_equal(gpu_taco_encode(x, G, fmt, False, False), want, "fp8 codes")
        with gk.tuning(sw_cvt=1):  # the software converter on this GPU too
            assert_bytes_equal(gpu_taco_encode(x, G, fmt, False, False), want, "sw codes")
            got_sw = gpu_taco_decode(want, x.size, np.float32, G, fmt, False, False)
        got_hw = gpu_taco_decode(want, x.size, np.float32, G, fmt, False, False)
        want_d = cpu_taco_decode(want, x.size, np.float32, G, fmt, False, False)
        assert_values_equal(got_hw, want_d, "fp8 decode")
        assert_values_equal(got_sw, want_d, "sw fp8 decode")


def cpu_taco_hop(own, p, G, fmt, ash, dual, clamps=False):
    """The three-step ring hop: a float32 copy of own, decode-accumulate p, encode."""
    acc = own.astype(np.float32)
    ck.taco_decode(p, acc, group_size=G, fp8_format=fmt, ash=ash, dual_scale=dual, accumulate=True)
    return cpu_taco_encode(acc, G, fmt, ash, dual, clamps)


def _hop_buffers(own, p, fill, x_off, p_off, o_off, dec):
    """Device copies of a hop's own and received payload, a poisoned out, and where the
    decoded output goes: None, "apart" (a poisoned buffer of its own, offset like own) or
    "inplace" (own itself)."""
    od = dev_empty(own.size, own.dtype, 0, x_off)
    od[...] = to_dev(own)
    pd = dev_empty(p.size, np.uint8, 0, p_off)
    pd[...] = to_dev(p)
    out = dev_empty(p.size, np.uint8, fill, o_off)
    decoded = {None: None, "inplace": od}.get(dec)
    if dec == "apart":
        decoded = dev_empty(own.size, own.dtype, 0xFF - fill, x_off)
    return od, pd, out, decoded


def gpu_taco_hop(
    own, p, G, fmt, ash, dual, fill=0xA5, x_off=0, p_off=0, o_off=0, clamps=False, dec=None
):
    """The fused hop's payload, and with ``dec`` (see _hop_buffers) its decoded output."""
    od, pd, out, decoded = _hop_buffers(own, p, fill, x_off, p_off, o_off, dec)
    gk.taco_reduce_encode(
        od, pd, out, decoded,
        group_size=G, fp8_format=fmt, ash=ash, dual_scale=dual, coccl_clamps=clamps,
    )  # fmt: skip
    return to_host(out) if dec is None else (to_host(out), to_host(decoded))


def _hop_cases():
    cases = [
        (G, fmt, ash, dual, DTYPES[0])
        for G in (32, 128, 512)
        for fmt in ("e4m3", "e5m2")
        for ash in (True, False)
        for dual in (True, False)
    ]
    cases += [(128, "e4m3", True, True, dt) for dt in DTYPES[1:]]
    cases += [(G, "e4m3", True, True, BF16) for G in (64, 256)]
    return [
        pytest.param(*c, id=f"G{c[0]}-{c[1]}-ash{int(c[2])}-ds{int(c[3])}-{c[4].name}")
        for c in cases
    ]


@needs_cpu
@pytest.mark.parametrize("G,fmt,ash,dual,dtype", _hop_cases())
def test_taco_reduce_encode_is_the_three_step_hop(G, fmt, ash, dual, dtype):
    """The fused ring hop gives the payload of decode-accumulate into a float32 copy of
    own, then encode, bit for bit: special groups on either side (NaN, Inf, subnormal,
    huge), partial last groups, poisoned outputs, unaligned buffers."""
    rng = np.random.default_rng(G + 3 * len(fmt) + 5 * ash + 7 * dual)
    item = np.dtype(dtype).itemsize
    for n in COUNTS:
        own = make_data(n, dtype, rng, G)
        received = cpu_taco_encode(make_data(n, dtype, rng, G)[::-1].copy(), G, fmt, ash, dual)
        want = cpu_taco_hop(own, received, G, fmt, ash, dual)
        for fill, offs in ((0xA5, (0, 0, 0)), (0x00, (0, 0, 0)), (0xA5, (item, 1, 3))):
            got = gpu_taco_hop(own, received, G, fmt, ash, dual, fill, *offs)
            assert_bytes_equal(got, want, f"hop n={n} fill={fill:#x} offsets {offs}")


@needs_cpu
@pytest.mark.parametrize("G,fmt,ash,dual,dtype", _hop_cases())
def test_taco_hop_with_decoded_is_hop_then_decode(G, fmt, ash, dual, dtype):
    """With ``decoded`` the fused hop writes the same payload and, in the same pass, the
    decode of that payload, bit for bit the CPU decode: into a buffer of its own (aligned
    and not) or into own itself (an in-place AllReduce), at every count."""
    rng = np.random.default_rng(G + 13 * len(fmt) + 5 * ash + 7 * dual)
    item = np.dtype(dtype).itemsize
    for n in COUNTS:
        own = make_data(n, dtype, rng, G)
        received = cpu_taco_encode(make_data(n, dtype, rng, G)[::-1].copy(), G, fmt, ash, dual)
        want = cpu_taco_hop(own, received, G, fmt, ash, dual)
        want_d = cpu_taco_decode(want, n, dtype, G, fmt, ash, dual)
        for dec, offs in (("apart", (0, 0, 0)), ("apart", (item, 1, 3)), ("inplace", (0, 0, 0))):
            got, got_d = gpu_taco_hop(own, received, G, fmt, ash, dual, 0xA5, *offs, dec=dec)
            assert_bytes_equal(got, want, f"hop n={n} {dec} offsets {offs}")
            assert_values_equal(got_d, want_d, f"hop decoded n={n} {dec} offsets {offs}")


@needs_cpu
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: np.dtype(d).name)
def test_taco_kernels_several_tiles_a_warp(dtype):
    """A grid of one block an SM gives each warp several tiles: the decodes, and the encode
    and the hop copying the next tile in while this one computes; the hop in blocks of two
    warps with a whole 128-group a lane. Bitwise the CPU's, with a partial last tile."""
    rng = np.random.default_rng(5)
    n, G = 3 * (1 << 20) + 77, 128
    hop = {"hop_epl": 128, "hop_epl_from": 0, "epl_threads": {"hop": 64}}
    with gk.tuning(blocks_per_sm=1, epl_resident={"hop": 256}, **hop):
        x = rng.standard_normal(n).astype(np.float32).astype(dtype)
        want = cpu_taco_encode(x, G, "e4m3", True, True)
        assert_bytes_equal(gpu_taco_encode(x, G, "e4m3", True, True), want, "encode")
        want_d = cpu_taco_decode(want, n, dtype, G, "e4m3", True, True)
        assert_values_equal(gpu_taco_decode(want, n, dtype, G, "e4m3", True, True), want_d, "")
        acc = rng.standard_normal(n).astype(np.float32)
        want_a = cpu_taco_decode(want, n, np.float32, G, "e4m3", True, True, acc=acc)
        got_a = gpu_taco_decode(want, n, np.float32, G, "e4m3", True, True, acc=acc)
        assert_values_equal(got_a, want_a, "decode accumulate")
        own = rng.standard_normal(n).astype(np.float32).astype(dtype)
        want_h = cpu_taco_hop(own, want, G, "e4m3", True, True)
        want_hd = cpu_taco_decode(want_h, n, dtype, G, "e4m3", True, True)
        got, got_d = gpu_taco_hop(own, want, G, "e4m3", True, True, dec="apart")
        assert_bytes_equal(got, want_h, "hop")
        assert_values_equal(got_d, want_hd, "hop decoded")


@needs_cpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("G", [32, 64, 128, 512])
@pytest.mark.parametrize("epl", [0, 32, 64, 128])
def test_taco_hop_kernels_agree(epl, G, dtype):
    """Both hop kernels (32 elements per lane, and up to a whole group per lane) and every
    lane split give the CPU's payload and decoded values: aligned or not, in place or not,
    with or without ash and dual scale, tiles whole and partial."""
    rng = np.random.default_rng(epl + G + 1)
    item = np.dtype(dtype).itemsize
    with gk.tuning(hop_epl=epl, hop_epl_from=0):
        for n in (1, 129, 4096 * 3 + 77, 100003):
            own = make_data(n, dtype, rng, G)
            for ash, dual in ((True, True), (False, True), (True, False)):
                p = cpu_taco_encode(make_data(n, dtype, rng, G), G, "e4m3", ash, dual)
                want = cpu_taco_hop(own, p, G, "e4m3", ash, dual)
                want_d = cpu_taco_decode(want, n, dtype, G, "e4m3", ash, dual)
                assert_bytes_equal(gpu_taco_hop(own, p, G, "e4m3", ash, dual), want, f"n={n}")
                for dec, offs in (
                    ("apart", (0, 0, 0)),
                    ("apart", (item, 1, 3)),
                    ("inplace", (0, 16, 0)),
                ):
                    got, got_d = gpu_taco_hop(own, p, G, "e4m3", ash, dual, 0xA5, *offs, dec=dec)
                    where = f"n={n} ash={ash} dual={dual} {dec} offsets {offs}"
                    assert_bytes_equal(got, want, where)
                    assert_values_equal(got_d, want_d, "decoded " + where)


# ------------------------------------------------------------ whole float32 range
def range_data(dtype, G: int, seed: int) -> np.ndarray:
    """magnitude_sweep's groups (smallest subnormal to largest finite value of dtype, mixed
    magnitudes, a partial last group) followed by make_data's special groups."""
    rng = np.random.default_rng(seed)
    sweep = magnitude_sweep(rng, G, dtype).astype(dtype)
    return np.concatenate([sweep, make_data(5 * G + 17, dtype, rng, G)])


def _range_cases():
    return [
        pytest.param(
            G, fmt, ash, clamps, dt, id=f"G{G}-{fmt}-ash{int(ash)}-coccl{int(clamps)}-{dt.name}"
        )
        for G in (32, 128, 512)
        for fmt in ("e4m3", "e5m2")
        for ash in (True, False)
        for clamps in (False, True)
        for dt in DTYPES
        if dt == BF16 or (G == 128 and fmt == "e4m3") or dt == np.float32
    ]


@needs_cpu
@pytest.mark.parametrize("G,fmt,ash,clamps,dtype", _range_cases())
def test_taco_whole_range_bitwise_vs_cpu(G, fmt, ash, clamps, dtype):
    """Groups from the smallest subnormal to FLT_MAX, where the extended range (FORMAT.md
    step 4b) or COCCL's clamps decide: every encode kernel (32 elements per lane, and 32,
    64, 128 per lane), the decode and decode-accumulate kernels and the fused ring hop
    give the CPU's bits, with the extended groups decoded on either side."""
    x = range_data(dtype, G, G + 2 * ash + clamps)
    n = x.size
    want = cpu_taco_encode(x, G, fmt, ash, True, clamps)
    for epl in (0, 32, 64, 128):
        with gk.tuning(encode_epl=epl):
            got = gpu_taco_encode(x, G, fmt, ash, True, clamps=clamps)
        assert_bytes_equal(got, want, f"encode epl={epl}")
    with gk.tuning(sw_cvt=1):
        assert_bytes_equal(gpu_taco_encode(x, G, fmt, ash, True, clamps=clamps), want, "sw")
    want_d = cpu_taco_decode(want, n, dtype, G, fmt, ash, True)
    assert_values_equal(gpu_taco_decode(want, n, dtype, G, fmt, ash, True), want_d, "decode")
    acc = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    want_a = cpu_taco_decode(want, n, np.float32, G, fmt, ash, True, acc=acc)
    got_a = gpu_taco_decode(want, n, np.float32, G, fmt, ash, True, acc=acc)
    assert_values_equal(got_a, want_a, "accumulate")
    if dtype == np.float32 or dtype == BF16:
        own = range_data(dtype, G, 99)[:n]
        want_h = cpu_taco_hop(own, want, G, fmt, ash, True, clamps)
        got_h = gpu_taco_hop(own, want, G, fmt, ash, True, clamps=clamps)
        assert_bytes_equal(got_h, want_h, "hop")


@needs_cpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("G", [32, 128, 1024, 100])
def test_int8_whole_range_bitwise_vs_cpu(G, dtype):
    """int8 at both ends of float32's range (FORMAT.md steps 4 and 5): encode, decode,
    accumulate and (for the fast group sizes) the fused ring hop give the CPU's bits."""
    x = range_data(dtype, G, G)
    n = x.size
    want = cpu_int8_encode(x, G)
    assert_bytes_equal(gpu_int8_encode(x, G), want, "int8 encode")
    want_d = cpu_int8_decode(want, n, dtype, G)
    assert_values_equal(gpu_int8_decode(want, n, dtype, G), want_d, "int8 decode")
    acc = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    want_a = cpu_int8_decode(want, n, np.float32, G, acc=acc)
    assert_values_equal(gpu_int8_decode(want, n, np.float32, G, acc=acc), want_a, "accumulate")
    if G != 100 and dtype in (np.float32, BF16):
        own = range_data(dtype, G, 98)[:n]
        assert_bytes_equal(gpu_int8_hop(own, want, G), cpu_int8_hop(own, want, G), "int8 hop")


def test_taco_reduce_encode_argument_errors():
    kw = dict(group_size=128, fp8_format="e4m3", ash=True, dual_scale=True)
    own = cupy.zeros(256, cupy.float32)
    p = cupy.zeros(256 + 16, cupy.uint8)
    with pytest.raises(ValueError, match="overlap"):
        gk.taco_reduce_encode(own, p, p, **kw)
    with pytest.raises(ValueError):
        gk.taco_reduce_encode(own, p, cupy.zeros(256 + 15, cupy.uint8), **kw)
    with pytest.raises(TypeError):
        gk.taco_reduce_encode(own.astype(cupy.float64), p, p.copy(), **kw)
    gk.taco_reduce_encode(own[:0], p[:0], p[:0].copy(), **kw)  # count 0: nothing to do
    _check_decoded_errors(lambda *a: gk.taco_reduce_encode(*a, **kw), own, p)


def _check_decoded_errors(hop, own, p):
    """A hop's decoded argument is checked before any work: like own, on its device, own
    itself or disjoint from own and from both payloads."""
    out = p.copy()
    with pytest.raises(ValueError, match="like own"):
        hop(own, p, out, cupy.zeros(own.size + 1, own.dtype))
    with pytest.raises(ValueError, match="like own"):
        hop(own, p, out, cupy.zeros(own.size, cupy.float16))
    with pytest.raises(TypeError):
        hop(own, p, out, np.zeros(own.size, own.dtype))
    shared = cupy.zeros(own.nbytes, cupy.uint8)  # the received payload and decoded in one
    with pytest.raises(ValueError, match="overlap"):
        hop(own, shared[: p.size], out, shared.view(own.dtype))
    wide = cupy.zeros(own.size + 1, own.dtype)
    with pytest.raises(ValueError, match="own itself"):
        hop(wide[:-1], p, out, wide[1:])
    hop(own[:0], p[:0], out[:0], own[:0])  # count 0: nothing to do


# -------------------------------------------------------------------------- int8
@needs_cpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("G", [32, 64, 128, 256, 512, 1024, 100])
def test_int8_bitwise_vs_cpu(G, dtype):
    rng = np.random.default_rng(G)
    for n in COUNTS:
        x = make_data(n, dtype, rng, G)
        want = cpu_int8_encode(x, G)
        for fill in (0xA5, 0x00):
            got = gpu_int8_encode(x, G, fill=fill)
            assert_bytes_equal(got, want, f"int8 encode n={n} fill={fill:#x}")
        want_d = cpu_int8_decode(want, n, dtype, G)
        assert_values_equal(cpu_int8_decode(got, n, dtype, G), want_d, f"cpu decode n={n}")
        for fill in (0xFF, 0x11):
            got_d = gpu_int8_decode(want, n, dtype, G, fill=fill)
            assert_values_equal(got_d, want_d, f"int8 decode n={n} fill={fill:#x}")
        acc = rng.standard_normal(n).astype(np.float32)
        want_a = cpu_int8_decode(want, n, np.float32, G, acc=acc)
        got_a = gpu_int8_decode(want, n, np.float32, G, acc=acc)
        assert_values_equal(got_a, want_a, f"int8 decode accumulate n={n}")


@needs_cpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_int8_unaligned_buffers(dtype):
    rng = np.random.default_rng(3)
    item = np.dtype(dtype).itemsize
    for n in (31, 1001, 4097, 20001):  # odd counts: the scales start unaligned
        x = make_data(n, dtype, rng, 128)
        want = cpu_int8_encode(x, 128)
        want_d = cpu_int8_decode(want, n, dtype, 128)
        for x_off, p_off in ((item, 0), (0, 1), (0, 3), (item, 2), (0, 0)):
            assert_bytes_equal(
                gpu_int8_encode(x, 128, x_off=x_off, p_off=p_off),
                want,
                f"encode n={n} offsets {x_off},{p_off}",
            )
            got_d = gpu_int8_decode(want, n, dtype, 128, o_off=x_off, p_off=p_off)
            assert_values_equal(got_d, want_d, f"decode n={n} offsets {x_off},{p_off}")


def cpu_int8_hop(own, p, G):
    """The three-step int8 ring hop: a float32 copy of own, decode-accumulate p, encode."""
    acc = own.astype(np.float32)
    ck.int8_decode(p, acc, group_size=G, accumulate=True)
    return cpu_int8_encode(acc, G)


def gpu_int8_hop(own, p, G, fill=0xA5, x_off=0, p_off=0, o_off=0, dec=None):
    """The fused int8 hop's payload, and with ``dec`` (see _hop_buffers) its decoded output."""
    od, pd, out, decoded = _hop_buffers(own, p, fill, x_off, p_off, o_off, dec)
    gk.int8_reduce_encode(od, pd, out, decoded, group_size=G)
    return to_host(out) if dec is None else (to_host(out), to_host(decoded))


@needs_cpu
@pytest.mark.parametrize(
    "G,dtype",
    [(G, DTYPES[0]) for G in (32, 64, 128, 256, 512, 1024)] + [(128, dt) for dt in DTYPES[1:]],
    ids=lambda v: str(v) if isinstance(v, int) else np.dtype(v).name,
)
def test_int8_reduce_encode_is_the_three_step_hop(G, dtype):
    """The fused int8 ring hop gives the payload of decode-accumulate into a float32 copy
    of own, then encode, bit for bit: special groups on either side, partial last groups
    (odd counts put the scales at unaligned offsets), poisoned outputs, unaligned buffers."""
    rng = np.random.default_rng(G + 11)
    item = np.dtype(dtype).itemsize
    for n in COUNTS + [4097]:
        own = make_data(n, dtype, rng, G)
        received = cpu_int8_encode(make_data(n, dtype, rng, G)[::-1].copy(), G)
        want = cpu_int8_hop(own, received, G)
        for fill, offs in ((0xA5, (0, 0, 0)), (0x00, (0, 0, 0)), (0xA5, (item, 1, 3))):
            got = gpu_int8_hop(own, received, G, fill, *offs)
            assert_bytes_equal(got, want, f"hop n={n} fill={fill:#x} offsets {offs}")
        want_d = cpu_int8_decode(want, n, dtype, G)
        for dec, offs in (("apart", (0, 0, 0)), ("apart", (item, 1, 3)), ("inplace", (0, 0, 0))):
            got, got_d = gpu_int8_hop(own, received, G, 0xA5, *offs, dec=dec)
            assert_bytes_equal(got, want, f"hop n={n} {dec} offsets {offs}")
            assert_values_equal(got_d, want_d, f"hop decoded n={n} {dec} offsets {offs}")


def test_int8_reduce_encode_argument_errors():
    own = cupy.zeros(256, cupy.float32)
    p = cupy.zeros(256 + 8, cupy.uint8)
    with pytest.raises(ValueError, match="overlap"):
        gk.int8_reduce_encode(own, p, p, group_size=128)
    with pytest.raises(ValueError):
        gk.int8_reduce_encode(own, p, cupy.zeros(256 + 7, cupy.uint8), group_size=128)
    with pytest.raises(ValueError, match="group_size"):
        gk.int8_reduce_encode(own, cupy.zeros(256 + 12, cupy.uint8), p, group_size=100)
    with pytest.raises(TypeError):
        gk.int8_reduce_encode(own.astype(cupy.float64), p, p.copy(), group_size=128)
    gk.int8_reduce_encode(own[:0], p[:0], p[:0].copy(), group_size=128)  # count 0
    _check_decoded_errors(lambda *a: gk.int8_reduce_encode(*a, group_size=128), own, p)


# ---------------------------------------------------------------- interface checks
def test_count_zero_is_a_no_op():
    """Count 0 writes nothing: empty views into poisoned buffers leave every byte as it was."""
    kw = dict(group_size=128, fp8_format="e4m3", ash=True, dual_scale=True)
    xs = cupy.full(64, 3.0, cupy.float32)
    ps = cupy.full(256, 0xA5, cupy.uint8)
    outs = cupy.full(64, 7.0, cupy.float32)
    x, p, p2, out = xs[16:16], ps[32:32], ps[64:64], outs[16:16]
    gk.taco_encode(x, p, **kw)
    gk.taco_decode(p, out, accumulate=True, **kw)
    gk.taco_decode(p, out, accumulate=False, **kw)
    gk.taco_reduce_encode(x, p, p2, **kw)
    gk.int8_encode(x, p, group_size=128)
    gk.int8_decode(p, out, group_size=128, accumulate=False)
    gk.int8_reduce_encode(x, p, p2, group_size=128)
    cupy.cuda.get_current_stream().synchronize()
    assert (ps == 0xA5).all() and (outs == 7.0).all() and (xs == 3.0).all()


def test_tuning_hooks_on_the_gpu():
    """A tuning change recompiles (the launch attributes follow it) and is undone on exit;
    the payload never depends on it."""
    x = to_dev(make_data(5000, np.float32, np.random.default_rng(4), 128))
    kw = dict(group_size=128, fp8_format="e4m3", ash=True, dual_scale=True)
    p = cupy.empty(taco_nbytes(5000, 128, True, True), cupy.uint8)
    gk.taco_encode(x, p, **kw)
    default = gk.last_kernel_attributes()
    assert default["num_regs"] > 0 and "local_size_bytes" in default
    want = to_host(p)
    with gk.tuning(encode_epl=0, threads=128) as now:
        assert now["encode_epl"] == 0 and now["threads"] == 128
        p[...] = 0
        gk.taco_encode(x, p, **kw)
        assert gk.last_kernel_attributes()["max_threads_per_block"] <= 128
        assert_bytes_equal(to_host(p), want, "encode under another tuning")
    assert gk.get_tuning()["encode_epl"] != 0
    gk.taco_encode(x, p, **kw)
    assert gk.last_kernel_attributes() == default


def test_argument_errors():
    x = cupy.zeros(256, cupy.float16)
    p = cupy.zeros(256 + 16, cupy.uint8)
    kw = dict(group_size=128, fp8_format="e4m3", ash=True, dual_scale=True)
    with pytest.raises(TypeError):
        gk.taco_decode(p, x, accumulate=True, **kw)  # accumulate needs float32
    with pytest.raises(TypeError):
        gk.int8_decode(cupy.zeros(256 + 8, cupy.uint8), x, group_size=128, accumulate=True)
    with pytest.raises(ValueError):
        gk.taco_encode(x, p[:-1], **kw)  # wrong payload size
    with pytest.raises(ValueError):
        gk.taco_encode(x, p, **{**kw, "group_size": 48})
    with pytest.raises(ValueError):
        gk.taco_encode(x, p, **{**kw, "fp8_format": "e3m4"})
    with pytest.raises(TypeError):
        gk.taco_encode(x.get(), p, **kw)  # numpy input
    with pytest.raises(TypeError):
        gk.taco_encode(x.astype(cupy.float64), p, **kw)
    with pytest.raises(TypeError):
        gk.int8_encode(x, p.astype(cupy.int8)[: 256 + 8], group_size=128)


@needs_cpu
def test_runs_on_the_current_stream():
    rng = np.random.default_rng(9)
    n = 1 << 20
    x = make_data(n, BF16, rng, 128)
    want = cpu_taco_encode(x, 128, "e4m3", True, True)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        xd = to_dev(x)
        pd = cupy.empty(want.size, cupy.uint8)
        gk.taco_encode(xd, pd, group_size=128, fp8_format="e4m3", ash=True, dual_scale=True)
        out = cupy.zeros(n, cupy.float32)
        gk.taco_decode(
            pd, out, group_size=128, fp8_format="e4m3", ash=True, dual_scale=True, accumulate=True
        )
    stream.synchronize()
    assert_bytes_equal(to_host(pd), want, "encode on a side stream")
    want_a = cpu_taco_decode(
        want, n, np.float32, 128, "e4m3", True, True, acc=np.zeros(n, np.float32)
    )
    assert_values_equal(to_host(out), want_a, "accumulate on a side stream")


# ------------------------------------------------------------- through the codecs
@needs_cpu
@pytest.mark.parametrize("name", ["taco", "int8"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_codec_classes_gpu_match_cpu(name, dtype):
    import coccl  # noqa: PLC0415

    if name not in coccl.available_compressors():
        pytest.skip(f"codec {name!r} is not registered yet")
    codec = coccl.get_compressor(name)
    rng = np.random.default_rng(21)
    for n in (1, 1000, 100003):
        x = make_data(n, dtype, rng, 128)
        want = codec.encode(x)
        got = codec.encode(to_dev(x))
        assert isinstance(got, cupy.ndarray)
        assert_bytes_equal(to_host(got), want, f"{name} encode n={n}")
        want_d = codec.decode(want, count=n, dtype=dtype)
        got_d = codec.decode(got, count=n, dtype=dtype)
        assert_values_equal(to_host(got_d), want_d, f"{name} decode n={n}")
        acc = rng.standard_normal(n).astype(np.float32)
        want_a = codec.decode(want, acc.copy(), count=n, dtype=dtype, accumulate=True)
        got_a = codec.decode(got, to_dev(acc), count=n, dtype=dtype, accumulate=True)
        assert_values_equal(to_host(got_a), want_a, f"{name} accumulate n={n}")
