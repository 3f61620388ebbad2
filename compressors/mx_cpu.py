"""numba CPU kernels of the ``mx`` codec (FORMAT.md's mx section), and the FP4/FP6 code
packing that ``taco_fp_cpu`` shares.

``mx_encode``/``mx_decode`` have the same names and keyword arguments as their GPU twins
in ``mx_gpu`` and follow ``cpu_kernels``' conventions: any float input is converted to
float32 once; values are decoded in float32 and rounded once to ``out``'s dtype, or added
(float32 into float32, float16/bfloat16 through a float32 temporary, float64 in float64).
``fastmath`` stays off, so every float operation is the IEEE float32 one FORMAT.md names.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import fp8, minifloat
from .cpu_kernels import (
    _LAUNCH_LOCK,
    _block_bounds,
    _check_out,
    _check_payload,
    _decode_into,
    _get_f32,
    _input_f32,
    _max_abs_bits,
    _nblocks,
    _put_f32,
    _saturate,
)
from .mx_layout import mx_layout

_INF_BITS = np.uint32(0x7F800000)
_F0 = np.float32(0.0)
_E8M0_NAN = np.uint8(0xFF)
_E4M3_NAN = np.uint8(fp8.NAN_CODE)
_MIN_NORMAL = np.uint32(0x00800000)  # 2^-126: the smallest per-payload scale S


# ------------------------------------------------------------------- code packing
@njit(inline="always")
def pack_codes(c, n, bits, out, base):
    """The ``n`` codes ``c[:n]`` (n a multiple of 4) packed into ``out[base:]``."""
    if bits == 4:
        for j in range(n // 2):
            out[base + j] = np.uint8(c[2 * j] | (c[2 * j + 1] << np.uint8(4)))
    else:
        for j in range(n // 4):
            w = (
                np.uint32(c[4 * j])
                | (np.uint32(c[4 * j + 1]) << np.uint32(6))
                | (np.uint32(c[4 * j + 2]) << np.uint32(12))
                | (np.uint32(c[4 * j + 3]) << np.uint32(18))
            )
            out[base + 3 * j] = np.uint8(w & np.uint32(0xFF))
            out[base + 3 * j + 1] = np.uint8((w >> np.uint32(8)) & np.uint32(0xFF))
            out[base + 3 * j + 2] = np.uint8(w >> np.uint32(16))


@njit(inline="always")
def unpack_values(p, base, n, bits, table, v):
    """The values (by ``table``) of the ``n`` codes packed at ``p[base:]``, into ``v``."""
    if bits == 4:
        for j in range(n // 2):
            byte = p[base + j]
            v[2 * j] = table[byte & np.uint8(0xF)]
            v[2 * j + 1] = table[byte >> np.uint8(4)]
    else:
        for j in range(n // 4):
            w = (
                np.uint32(p[base + 3 * j])
                | (np.uint32(p[base + 3 * j + 1]) << np.uint32(8))
                | (np.uint32(p[base + 3 * j + 2]) << np.uint32(16))
            )
            v[4 * j] = table[w & np.uint32(0x3F)]
            v[4 * j + 1] = table[(w >> np.uint32(6)) & np.uint32(0x3F)]
            v[4 * j + 2] = table[(w >> np.uint32(12)) & np.uint32(0x3F)]
            v[4 * j + 3] = table[w >> np.uint32(18)]


@njit(inline="always")
def floor_log2_bits(a):
    """floor(log2(a)) of a positive finite float32 with bits ``a`` (subnormals too)."""
    if a >= _MIN_NORMAL:
        return np.int64(a >> np.uint32(23)) - 127
    n = np.int64(0)
    while (a >> np.uint32(n + 1)) != np.uint32(0):
        n += 1
    return n - 149


@njit(inline="always")
def pow2(k):
    """2^k as float32 for -149 <= k <= 127 (exact; subnormal below -126)."""
    if k >= -126:
        return fp8.float32_from_bits(np.uint32((k + 127) << 23))
    return fp8.float32_from_bits(np.uint32(1 << (k + 149)))


# ----------------------------------------------------------------------- encode
@njit(nogil=True, parallel=True, cache=True)
def _finite_amax_kernel(x, b, part):  # pragma: no cover - compiled by numba
    # part[i] = the largest |x| (as bits) over range i's blocks that hold no NaN/Inf.
    xb = x.view(np.uint32)
    count = x.size
    nk = -(-count // b)
    nparts = part.size
    for blk in prange(nparts):
        k0, k1 = _block_bounds(blk, nparts, nk)
        best = np.uint32(0)
        for k in range(k0, k1):
            n = min(b, count - k * b)
            a = _max_abs_bits(xb[k * b : k * b + n], n)
            if a < _INF_BITS and a > best:
                best = a
        part[blk] = best


@njit(nogil=True, parallel=True, cache=True)
def _mx_encode_kernel(
    x, codes, scales, b, bits, ebits, mbits, bias, qmax_bits, emax, two_level, s_glob, nblocks
):  # pragma: no cover - compiled by numba
    count = x.size
    xb = x.view(np.uint32)
    nk = scales.size
    qmax = fp8.float32_from_bits(np.uint32(qmax_bits))
    bpb = b * bits // 8
    for blk in prange(nblocks):
        c = np.empty(b, dtype=np.uint8)
        k0, k1 = _block_bounds(blk, nblocks, nk)
        for k in range(k0, k1):
            base = k * b
            n = min(b, count - base)
            for i in range(n, b):
                c[i] = 0
            amax_bits = _max_abs_bits(xb[base : base + n], n)
            if amax_bits >= _INF_BITS:  # FORMAT.md: a NaN scale, zero codes
                for i in range(n):
                    c[i] = 0
                scales[k] = _E4M3_NAN if two_level else _E8M0_NAN
            elif two_level:
                amax = fp8.float32_from_bits(amax_bits)
                sc = fp8.bits_to_e4m3(fp8.float32_bits((amax / s_glob) / qmax))
                den = fp8.E4M3_TABLE[sc] * s_glob
                for i in range(n):
                    if sc == 0:
                        c[i] = 0
                    else:
                        v = fp8.float32_bits(x[base + i] / den)
                        c[i] = minifloat.bits_to_code(v, ebits, mbits, bias, qmax_bits)
                scales[k] = sc
            else:
                e = floor_log2_bits(amax_bits) - emax if amax_bits != 0 else -127
                e = min(max(e, -127), 127)
                inv = pow2(-e)  # -e <= 127, and >= -125 (amax < 2^128): a normal float
                for i in range(n):
                    v = fp8.float32_bits(x[base + i] * inv)
                    c[i] = minifloat.bits_to_code(v, ebits, mbits, bias, qmax_bits)
                scales[k] = np.uint8(e + 127)
            pack_codes(c, b, bits, codes, k * bpb)


def _tensor_scale(x32: np.ndarray, block: int, qmax: float) -> np.float32:
    """FORMAT.md's per-payload scale ``S = max(amax / (448 * qmax), 2^-126)``, ``amax``
    the largest ``|x|`` of the finite blocks (0 without one: an empty or all-NaN payload)."""
    part = np.zeros(_nblocks(-(-x32.size // block)), dtype=np.uint32)
    _finite_amax_kernel(x32, block, part)
    s = part.max().view(np.float32) / np.float32(448.0 * qmax)
    return s if s.view(np.uint32) >= _MIN_NORMAL else _MIN_NORMAL.view(np.float32)


def mx_encode(x: np.ndarray, payload: np.ndarray, *, element: str, block: int, scale: str) -> None:
    """Encode ``x`` into ``payload`` with the mx codec (see FORMAT.md)."""
    f = minifloat.get_format(element)
    x32 = _input_f32(x)
    two_level = scale == "e4m3"
    layout = mx_layout(x32.size, block, f.bits, two_level)
    _check_payload(payload, layout.nbytes)
    k = layout.blocks
    s_glob = np.float32(1.0)
    with _LAUNCH_LOCK:
        if two_level:  # count 0 too: no finite block, S = 2^-126 (the 4 bytes are the payload)
            s_glob = _tensor_scale(x32, block, f.qmax)
        if k:
            _mx_encode_kernel(
                x32,
                payload[: layout.scale_offset],
                payload[layout.scale_offset : layout.scale_offset + k],
                block,
                f.bits,
                f.ebits,
                f.mbits,
                f.bias,
                np.uint32(f.qmax_bits),
                f.emax,
                two_level,
                s_glob,
                _nblocks(k),
            )
    if two_level:
        _put_f32(payload, layout.tensor_offset, np.array([s_glob], np.float32))


# ----------------------------------------------------------------------- decode
@njit(nogil=True, parallel=True, cache=True)
def _mx_decode_kernel(
    codes, scales, out, b, bits, table, two_level, s_glob, accumulate, nblocks
):  # pragma: no cover - compiled by numba
    count = out.size
    nk = scales.size
    bpb = b * bits // 8
    for blk in prange(nblocks):
        v = np.empty(b, dtype=np.float32)
        k0, k1 = _block_bounds(blk, nblocks, nk)
        for k in range(k0, k1):
            base = k * b
            n = min(b, count - base)
            unpack_values(codes, k * bpb, b, bits, table, v)
            sc = scales[k]
            if two_level:
                # ±Inf -> ±FLT_MAX: S's rounding may take the largest value past FLT_MAX.
                d = fp8.E4M3_TABLE[sc] * s_glob  # NaN for the NaN code
                for i in range(n):
                    y = _saturate(v[i] * d)
                    out[base + i] = out[base + i] + y if accumulate else y
            else:
                d = np.float32(np.nan) if sc == _E8M0_NAN else pow2(np.int64(sc) - 127)
                for i in range(n):
                    y = v[i] * d
                    out[base + i] = out[base + i] + y if accumulate else y


def mx_decode(
    payload: np.ndarray, out: np.ndarray, *, element: str, block: int, scale: str, accumulate: bool
) -> None:
    """Decode an mx ``payload`` of ``out.size`` elements into ``out`` (or add into it)."""
    f = minifloat.get_format(element)
    _check_out(out)
    two_level = scale == "e4m3"
    layout = mx_layout(out.size, block, f.bits, two_level)
    _check_payload(payload, layout.nbytes)
    k = layout.blocks
    if k == 0:
        return
    s_glob = _get_f32(payload, layout.tensor_offset, 1)[0] if two_level else np.float32(1.0)
    codes = payload[: layout.scale_offset]
    scales = payload[layout.scale_offset : layout.scale_offset + k]
    table = minifloat.TABLES[f.name]
    nblocks = _nblocks(k)

    def run(out32: np.ndarray, acc: bool) -> None:
        with _LAUNCH_LOCK:
            _mx_decode_kernel(
                codes, scales, out32, block, f.bits, table, two_level, s_glob, acc, nblocks
            )

    _decode_into(out, accumulate, run)
