"""numba CPU kernels of the ``int`` codec (FORMAT.md's ``## int`` section, bit for bit).

The same conventions as ``cpu_kernels`` (whose array plumbing, Walsh-Hadamard transform
and float32 helpers this module reuses): flat numpy arrays, any float dtype in and out
(converted to float32 once on the way in, rounded once on the way out), ``@njit(nogil,
parallel, cache)`` kernels without fastmath, one launch at a time. The functions have the
same names and keyword arguments as their GPU twins in ``intq_gpu``.

Codes are packed little-endian: element ``i``'s ``bits``-bit two's complement code lies at
bits ``[i * bits, (i + 1) * bits)`` of the code bytes read as one little-endian integer.
Every group starts on a byte boundary (``G * bits`` is a multiple of 8), so the groups of
one payload are packed independently and in parallel.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import fp8
from .cpu_kernels import (
    _F0,
    _F1,
    _INF_BITS,
    _INT8_TINY_SCALE,
    _LAUNCH_LOCK,
    _NAN,
    _block_bounds,
    _check_out,
    _check_payload,
    _clamp,
    _decode_into,
    _fwht,
    _get_f32,
    _input_f32,
    _max_abs_bits,
    _nblocks,
    _next_down,
    _next_up,
    _put_f32,
    _saturate,
)
from .layout import int_layout

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S40 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(40)
_TWO_M24 = np.float32(2.0**-24)


@njit(inline="always")
def _mix64(z):
    # splitmix64's finalizer: a bijection of 64-bit integers (uint64 wraps around).
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(inline="always")
def _uniform(key, e):
    """FORMAT.md's u of element e: the top 24 bits of splitmix64's output e + 1 from state
    ``key``, times 2^-24 (exact)."""
    z = _mix64(key + np.uint64(e + 1) * _GAMMA)
    return np.float32(np.uint32(z >> _S40)) * _TWO_M24


@njit(inline="always")
def _round(y, stochastic, key, e, qmax):
    """The clamped code of a scaled value y: rint (half to even), or floor(y) + 1 where
    u < y - floor(y) (both exact in float32; compared on the bits, both non-negative)."""
    if stochastic:
        fl = np.floor(y)
        up = fp8.float32_bits(_uniform(key, e)) < fp8.float32_bits(y - fl)
        r = fl + _F1 if up else fl
    else:
        r = np.rint(y)
    return np.int64(_clamp(r, -qmax, qmax))


@njit(inline="always")
def _rotate(v, w, n, h, log2h):
    """FORMAT.md step 2: prescale a group whose unnormalised transform could overflow,
    then the transform of each block of h. Returns M, the step's factor H * P."""
    e = np.int64(_max_abs_bits(v.view(np.uint32), n) >> np.uint32(23))
    m = np.float32(h)
    if e + log2h > 253:
        p = fp8.float32_from_bits(np.uint32((127 - log2h) << 23))  # 2^-log2(h)
        for i in range(n):
            v[i] = v[i] * p
        m = _F1
    for b in range(0, n, h):
        t = _fwht(v[b : b + h], w[b : b + h], h)
        for i in range(h):  # the result may lie in either buffer
            v[b + i] = t[i]
    return m


@njit(inline="always")
def _scale(amax, qmax, m):
    """FORMAT.md steps 4-5: the stored scale D, the code step T = D * M, and whether the
    codes divide by T (tiny: 1 / T would overflow)."""
    d = amax / (qmax * m)
    t = d * m
    tiny = amax > _F0 and t <= _INT8_TINY_SCALE
    if tiny:
        if d == _F0 or amax / t > qmax:
            d = _next_up(d)
            t = d * m
    elif t * qmax == np.inf:
        d = _next_down(d)
        t = d * m
    return d, t, tiny


@njit(inline="always")
def _pack(q, n, codes, byte0, bits):
    # n codes q[:n] as bits-bit fields, little-endian, from byte byte0 on.
    mask = (1 << bits) - 1
    acc = 0
    nacc = 0
    j = byte0
    for i in range(n):
        acc |= (q[i] & mask) << nacc
        nacc += bits
        while nacc >= 8:
            codes[j] = np.uint8(acc & 0xFF)
            acc >>= 8
            nacc -= 8
            j += 1
    if nacc > 0:
        codes[j] = np.uint8(acc & 0xFF)


@njit(nogil=True, parallel=True, cache=True)
def _int_encode_kernel(
    x, codes, scales, coded, g, h, log2h, bits, stochastic, key, nblocks
):  # pragma: no cover - compiled by numba
    count = x.size
    ngroups = scales.size
    qmax = np.float32((1 << (bits - 1)) - 1)
    for blk in prange(nblocks):
        v = np.empty(g, dtype=np.float32)
        w = np.empty(g, dtype=np.float32)
        q = np.empty(g, dtype=np.int64)
        k0, k1 = _block_bounds(blk, nblocks, ngroups)
        for k in range(k0, k1):
            base = k * g
            n = min(g, coded - base)
            real = min(g, count - base)
            for i in range(real):
                v[i] = x[base + i]
            for i in range(real, n):
                v[i] = _F0
            if _max_abs_bits(v.view(np.uint32), n) >= _INF_BITS:  # NaN or ±Inf
                q[:n] = 0
                _pack(q, n, codes, base * bits // 8, bits)
                scales[k] = _NAN
                continue
            m = _rotate(v, w, n, h, log2h) if h else _F1
            amax = fp8.float32_from_bits(_max_abs_bits(v.view(np.uint32), n))
            d, t, tiny = _scale(amax, qmax, m)
            inv = _F1 / t if amax > _F0 else _F0
            for i in range(n):
                y = v[i] / t if tiny else v[i] * inv
                q[i] = _round(y, stochastic, key, base + i, qmax)
            _pack(q, n, codes, base * bits // 8, bits)
            scales[k] = d


@njit(nogil=True, parallel=True, cache=True)
def _int_decode_kernel(
    codes, scales, out, coded, g, h, bits, accumulate, nblocks
):  # pragma: no cover - compiled by numba
    count = out.size
    ngroups = scales.size
    half = 1 << (bits - 1)
    for blk in prange(nblocks):
        v = np.empty(g, dtype=np.float32)
        w = np.empty(g, dtype=np.float32)
        k0, k1 = _block_bounds(blk, nblocks, ngroups)
        for k in range(k0, k1):
            base = k * g
            n = min(g, coded - base)
            real = min(g, count - base)
            acc = 0
            nacc = 0
            j = base * bits // 8
            for i in range(n):
                while nacc < bits:
                    acc |= np.int64(codes[j]) << nacc
                    nacc += 8
                    j += 1
                c = acc & ((1 << bits) - 1)
                acc >>= bits
                nacc -= bits
                v[i] = np.float32(c - 2 * half if c >= half else c)
            d = scales[k]
            if h:
                for b in range(0, n, h):  # exact: integers below 2^24
                    t = _fwht(v[b : b + h], w[b : b + h], h)
                    for i in range(h):
                        y = _saturate(t[i] * d)
                        if b + i < real:
                            out[base + b + i] = out[base + b + i] + y if accumulate else y
            elif accumulate:
                for i in range(real):
                    out[base + i] = out[base + i] + v[i] * d
            else:
                for i in range(real):
                    out[base + i] = v[i] * d


def int_encode(
    x: np.ndarray,
    payload: np.ndarray,
    *,
    bits: int,
    group_size: int,
    hadamard: int,
    stochastic: bool,
    key: int,
) -> None:
    """Encode ``x`` into ``payload`` with the ``int`` codec (FORMAT.md); ``key`` is the
    stochastic rounding's stream key (``intq.stream_key``), ignored when rounding to
    nearest."""
    x32 = _input_f32(x)
    layout = int_layout(x32.size, bits, group_size, hadamard)
    _check_payload(payload, layout.nbytes)
    if layout.groups == 0:
        return
    scales = np.empty(layout.groups, dtype=np.float32)
    log2h = int(hadamard).bit_length() - 1 if hadamard else 0
    with _LAUNCH_LOCK:
        _int_encode_kernel(
            x32,
            payload[: layout.scale_offset],
            scales,
            layout.coded,
            group_size,
            int(hadamard),
            log2h,
            int(bits),
            bool(stochastic),
            np.uint64(key),
            _nblocks(layout.groups),
        )
    _put_f32(payload, layout.scale_offset, scales)


def int_decode(
    payload: np.ndarray,
    out: np.ndarray,
    *,
    bits: int,
    group_size: int,
    hadamard: int,
    accumulate: bool,
) -> None:
    """Decode an ``int`` payload of ``out.size`` elements into ``out`` (or add into it)."""
    _check_out(out)
    layout = int_layout(out.size, bits, group_size, hadamard)
    _check_payload(payload, layout.nbytes)
    if layout.groups == 0:
        return
    scales = _get_f32(payload, layout.scale_offset, layout.groups)
    codes = payload[: layout.scale_offset]
    nblocks = _nblocks(layout.groups)

    def run(out32: np.ndarray, acc: bool) -> None:
        with _LAUNCH_LOCK:
            _int_decode_kernel(
                codes,
                scales,
                out32,
                layout.coded,
                group_size,
                int(hadamard),
                int(bits),
                acc,
                nblocks,
            )

    _decode_into(out, accumulate, run)
