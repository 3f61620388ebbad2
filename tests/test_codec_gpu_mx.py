"""The mx and taco_fp CUDA kernels (mx_gpu.MX_SOURCES) against the CPU kernels, bit
for bit: payload bytes identical, decoded values and accumulations identical (NaNs as
NaN-ness only: FORMAT.md fixes the NaN codes and scales stored in payloads, not the bits
of a decoded NaN).

On a GPU through CuPy (skipped without one); tests/test_codec_mx_emulated.py runs the same
CUDA source on the host through an emulation of the CUDA built-ins, where there is none.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from mx_reference import any_payloads, mx_encode_ref, quotient_edges

from coccl.compressors import get_compressor

from codec_reference import grouped_gaussian, magnitude_sweep, seed_for
from gpu import GPU

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
COUNTS = [0, 1, 31, 1000, 4097]
# Every mx variant with the E4M3 scale: its payload holds S even when it has no block.
E4M3_CONFIGS = [
    {"id": "mx", "element": e, "block": b, "scale": "e4m3"}
    for e in ("e2m1", "e3m2", "e2m3")
    for b in (16, 32)
]
# Poison for payloads before an encode, one per side: a byte an encode leaves unwritten
# differs between the two.
POISON_CPU, POISON_KERNEL = 0x5A, 0xA5


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


def _cpu_encode(cfg: dict, x: np.ndarray) -> np.ndarray:
    c = get_compressor(cfg)
    return c.encode(x, np.full(c.encoded_nbytes(x.size, x.dtype), POISON_CPU, np.uint8))


def _assert_same(got: np.ndarray, expect: np.ndarray, msg: str) -> None:
    g64, e64 = got.astype(np.float64), expect.astype(np.float64)
    nan = np.isnan(e64)
    np.testing.assert_array_equal(np.isnan(g64), nan, err_msg=msg)
    bits = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    np.testing.assert_array_equal(got[~nan].view(bits), expect[~nan].view(bits), err_msg=msg)


def _assert_tensor_scale(cfg: dict, x: np.ndarray, payload: np.ndarray, msg: str) -> None:
    """The payload's S is the independent reference's (2^-126 without a finite block)."""
    ref = mx_encode_ref(x.astype(np.float64), cfg["element"], cfg["block"], "e4m3")
    s = payload[-4:].copy().view("<f4")[0]
    assert s == np.float32(ref.tensor_scale), f"{msg}: S = {s!r}, expected {ref.tensor_scale!r}"


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
    for count in [*COUNTS, 1 << 20]:
        x = _data(rng, count, c.alignment, dtype)
        msg = f"{cfg} {dtype} count={count} seed={seed}"
        payload = _cpu_encode(cfg, x)
        d_payload = cp.full(payload.size, POISON_KERNEL, cp.uint8)
        c.encode(_dev(cp, x), d_payload)
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
    payload = _cpu_encode(cfg, x)
    raw = cp.full(payload.size + 3, POISON_KERNEL, cp.uint8)
    d_payload = raw[3:]  # payload offsets need not be aligned
    c.encode(cp.asarray(x), d_payload)
    np.testing.assert_array_equal(cp.asnumpy(d_payload), payload, err_msg=f"seed={seed}")
    got = cp.asnumpy(c.decode(d_payload, count=x.size, dtype=np.float32))
    _assert_same(got, c.decode(payload, count=x.size, dtype=np.float32), f"seed={seed}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c["id"] == "mx"], ids=_id)
def test_gpu_decode_any_payload(cfg: dict, dtype: np.dtype, request) -> None:
    # Decodes of payloads no encode writes (the bf16x2 E8M0 values, min.NaN and max.NaN,
    # prmt's sign mode on the hardware): random codes, every scale byte (E8M0 0 and 255;
    # E4M3 with the sign bit and the NaN codes), E4M3's S over ANY_S; whole warp spans and
    # partial ends, out aligned and one element past; 2^24 elements, so that every warp
    # takes several grid steps (the lean decode loop's loads one step ahead).
    import cupy as cp

    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    count = (1 << 24) + 3 * c.alignment + 5
    for s, payload in any_payloads(rng, c, count, dtype):
        msg = f"{cfg} {dtype} S={s} seed={seed}"
        want = c.decode(payload, count=count, dtype=dtype)
        d_payload = cp.asarray(payload)
        for offset in (0, 1):
            raw = cp.full(count + 1, 7, cp.float32).astype(dtype if dtype != BF16 else cp.uint16)
            d_out = raw[offset : offset + count]
            if dtype == BF16:
                d_out = d_out.view(BF16)
            c.decode(d_payload, d_out, count=count, dtype=dtype)
            _assert_same(_host(cp, d_out), want, f"{msg} offset={offset}")
        base = rng.standard_normal(count).astype(np.float32)
        d_acc = cp.asarray(base)
        c.decode(d_payload, d_acc, count=count, dtype=dtype, accumulate=True)
        expect = c.decode(payload, base.copy(), count=count, dtype=dtype, accumulate=True)
        _assert_same(cp.asnumpy(d_acc), expect, msg + " accumulate")


E8M0_CONFIGS = [
    {"id": "mx", "element": e, "block": b} for e in ("e2m1", "e3m2", "e2m3") for b in (16, 32)
]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg", E8M0_CONFIGS, ids=_id)
def test_gpu_bf16_e8m0_whole_range(cfg: dict, request) -> None:
    # The bfloat16 encode with E8M0 scales runs on bf16x2 instructions: bfloat16's whole
    # range (subnormal elements scaled up by 2^127 included) and Gaussian blocks.
    import cupy as cp

    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    sweep = magnitude_sweep(rng, c.alignment, BF16).astype(BF16)
    for x in (sweep, _data(rng, 1 << 16, c.alignment, BF16)):
        payload = _cpu_encode(cfg, x)
        d_payload = cp.full(payload.size, POISON_KERNEL, cp.uint8)
        c.encode(_dev(cp, x), d_payload)
        np.testing.assert_array_equal(cp.asnumpy(d_payload), payload, err_msg=f"seed={seed}")


# The payload's largest value: S in the E4M3 encode's float32 range (2.0**-73 and 2.0**98:
# at its ends), then below and above it (x / d in double there), and S at its floor 2^-126.
EDGE_TOPS = [3.0, 1.5e3, 2.0**-73, 2.0**98, 2.0**-100, 2.0**110, 1e-38]
EDGE_TOPS_F16 = [3.0, 1.5e3, 2.0**-10]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", E4M3_CONFIGS, ids=_id)
def test_gpu_e4m3_quotient_edges(cfg: dict, dtype: np.dtype, request) -> None:
    # The E4M3 encode's quotients without a division: reciprocals from the hardware's
    # rcp.approx refined in double (the emulation's approximation is the rounded 1 / b),
    # elements a few ulps around every code boundary times each block's divisor d, many d.
    import cupy as cp

    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    for top in EDGE_TOPS if dtype != np.float16 else EDGE_TOPS_F16:
        x = quotient_edges(rng, cfg["element"], cfg["block"], top, dtype, 512).astype(dtype)
        payload = _cpu_encode(cfg, x)
        d_payload = cp.full(payload.size, POISON_KERNEL, cp.uint8)
        c.encode(_dev(cp, x), d_payload)
        got = cp.asnumpy(d_payload)
        np.testing.assert_array_equal(got, payload, err_msg=f"top={top} seed={seed}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", list(_small_cases(16)))
@pytest.mark.parametrize("cfg", E4M3_CONFIGS, ids=_id)
def test_gpu_e4m3_small_payloads(cfg: dict, case: str) -> None:
    import cupy as cp

    c = get_compressor(cfg)
    x = np.array(_small_cases(cfg["block"])[case], np.float32)
    payload = _cpu_encode(cfg, x)
    d_payload = cp.full(payload.size, POISON_KERNEL, cp.uint8)
    c.encode(cp.asarray(x), d_payload)
    np.testing.assert_array_equal(cp.asnumpy(d_payload), payload, err_msg=f"{cfg} {case}")
    got = cp.asnumpy(c.decode(d_payload, count=x.size, dtype=np.float32))
    _assert_same(got, c.decode(payload, count=x.size, dtype=np.float32), f"{cfg} {case}")


def _kernels(cfg: dict):
    """mx_gpu's encode and decode of ``cfg``'s codec, and its options."""
    from coccl.compressors import mx_gpu

    opts = {k: v for k, v in get_compressor(cfg).get_config().items() if k != "id"}
    if cfg["id"] == "mx":
        return mx_gpu.mx_encode, mx_gpu.mx_decode, opts
    return mx_gpu.taco_fp_encode, mx_gpu.taco_fp_decode, opts


def _refuse(nbytes: int):
    raise AssertionError(f"a GPU kernel call allocated {nbytes} bytes")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_gpu_kernels_allocate_nothing_and_capture(cfg: dict, request) -> None:
    # Encode and decode captured into one CUDA graph (global mode, where an allocation or
    # a synchronising call breaks the capture) with every allocation refused; replayed on
    # new contents of the same buffers, the graph gives the CPU's payload and values.
    import cupy as cp

    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    enc, dec, opts = _kernels(cfg)
    stream = cp.cuda.Stream(non_blocking=True)
    for count in [0, 1, 4097]:
        msg = f"{cfg} count={count} seed={seed}"
        with stream:  # everything in this stream's order
            d_x = cp.asarray(_data(rng, count, c.alignment, np.float32))
            d_payload = cp.full(c.encoded_nbytes(count, np.float32), POISON_KERNEL, cp.uint8)
            d_out = cp.empty(count, cp.float32)
            enc(d_x, d_payload, **opts)  # compiles the variants outside the capture
            dec(d_payload, d_out, accumulate=False, **opts)
            d_payload.fill(POISON_KERNEL)
        stream.synchronize()
        if d_payload.size == 0:  # nothing to launch (mx e4m3 still writes S at count 0)
            with cp.cuda.using_allocator(_refuse), stream:
                enc(d_x, d_payload, **opts)
                dec(d_payload, d_out, accumulate=False, **opts)
            continue
        with cp.cuda.using_allocator(_refuse), stream:
            stream.begin_capture(cp.cuda.runtime.streamCaptureModeGlobal)
            try:
                enc(d_x, d_payload, **opts)
                dec(d_payload, d_out, accumulate=False, **opts)
            finally:
                graph = stream.end_capture()
        for _ in range(2):
            x = _data(rng, count, c.alignment, np.float32)
            d_x.set(x, stream=stream)
            graph.launch(stream)
            stream.synchronize()
            payload = _cpu_encode(cfg, x)
            np.testing.assert_array_equal(cp.asnumpy(d_payload), payload, err_msg=msg)
            got = cp.asnumpy(d_out)
            _assert_same(got, c.decode(payload, count=count, dtype=np.float32), msg)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg", E4M3_CONFIGS[:2], ids=_id)
def test_gpu_e4m3_encodes_on_concurrent_streams(cfg: dict, request) -> None:
    # Encodes on two streams at once, not synchronised with each other, share no memory.
    import cupy as cp

    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    c = get_compressor(cfg)
    xs = [_data(rng, 1 << 18, c.alignment, np.float32) * s for s in (1.0, 1e-3)]
    d_xs = [cp.asarray(x) for x in xs]
    n = c.encoded_nbytes(xs[0].size, np.float32)
    d_payloads = [cp.full(n, POISON_KERNEL, cp.uint8) for _ in xs]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in xs]
    cp.cuda.Device().synchronize()
    for _ in range(8):
        for d_x, d_payload, stream in zip(d_xs, d_payloads, streams, strict=True):
            with stream:
                c.encode(d_x, d_payload)
    cp.cuda.Device().synchronize()
    for x, d_payload in zip(xs, d_payloads, strict=True):
        np.testing.assert_array_equal(cp.asnumpy(d_payload), _cpu_encode(cfg, x), f"{seed}")


@pytest.mark.gpu
@needs_gpu
def test_gpu_mx_encode_refuses_overlap() -> None:
    # The e4m3 encode writes its partials into the payload before it has read all of x.
    import cupy as cp

    c = get_compressor({"id": "mx", "scale": "e4m3"})
    raw = cp.zeros(4 * 1000, cp.uint8)
    x = raw.view(cp.float32)
    with pytest.raises(ValueError, match="overlap"):
        c.encode(x, raw[: c.encoded_nbytes(1000, np.float32)])
