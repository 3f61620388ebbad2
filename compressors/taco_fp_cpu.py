"""numba CPU kernels of the ``taco_fp`` codec (FORMAT.md's taco_fp section): TACO's ASH
pre-rotation scale, Walsh-Hadamard rotation and dual scale over FP4/FP6 elements.

The same conventions as ``cpu_kernels`` and ``mx_cpu`` (float32 in, float32 arithmetic
without fastmath, one rounding to the output dtype); the Hadamard transform is taco's
``_fwht`` and the energy taco's, so the two codecs rotate bitwise alike.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import fp8, minifloat
from .cpu_kernels import (
    _ALPHA_MAX,
    _ALPHA_MIN,
    _F0,
    _F1,
    _INF_BITS,
    _LAMBDA,
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
    _inv_sqrt,
    _max_abs_bits,
    _nblocks,
    _pow2_toward_one,
    _put_f32,
    _saturate,
)
from .mx_cpu import pack_codes, unpack_values
from .mx_layout import taco_fp_layout


@njit(inline="always")
def _energy(v, g, runs):
    # FORMAT.md (taco step 2): sequential sums over runs of 32, a pairwise tree over runs.
    nruns = g // 32
    for r in range(nruns):
        e = _F0
        for j in range(32):
            xj = v[32 * r + j]
            e = e + xj * xj
        runs[r] = e
    h = 1
    while h < nruns:
        for r in range(0, nruns, 2 * h):
            runs[r] = runs[r] + runs[r + h]
        h *= 2
    return runs[0]


@njit(nogil=True, parallel=True, cache=True)
def _taco_fp_encode_kernel(
    x, codes, scales, alphas, g, bits, ebits, mbits, bias, qmax_bits, inv_sqrt_g, nblocks
):  # pragma: no cover - compiled by numba
    count = x.size
    ngroups = scales.size
    qmax = fp8.float32_from_bits(np.uint32(qmax_bits))
    gb = g * bits // 8
    for blk in prange(nblocks):
        v = np.empty(g, dtype=np.float32)
        w = np.empty(g, dtype=np.float32)
        c = np.empty(g, dtype=np.uint8)
        runs = np.empty(g // 32, dtype=np.float32)
        k0, k1 = _block_bounds(blk, nblocks, ngroups)
        for k in range(k0, k1):
            base = k * g
            n = min(g, count - base)
            for i in range(n):
                v[i] = x[base + i]
            for i in range(n, g):
                v[i] = _F0
            if _max_abs_bits(v.view(np.uint32), g) >= _INF_BITS:
                # FORMAT.md step 6: zero codes, NaN scales: the group decodes to NaN.
                for i in range(g):
                    c[i] = 0
                pack_codes(c, g, bits, codes, k * gb)
                scales[k] = _NAN
                alphas[k] = _NAN
                continue
            m = _energy(v, g, runs) / np.float32(g)
            alpha = _clamp(qmax / np.sqrt(m + _LAMBDA), _ALPHA_MIN, _ALPHA_MAX)
            for i in range(g):
                v[i] = v[i] * alpha
            t = _fwht(v, w, g)
            amax_bits = _max_abs_bits(t.view(np.uint32), g)
            # Step 4: every group is brought to [1, 2) by a power of two before its scale
            # is taken, so s is a normal float over the whole float32 range.
            two = _pow2_toward_one(amax_bits)
            for i in range(g):
                t[i] = t[i] * two
            alpha = alpha * two
            amax = fp8.float32_from_bits(amax_bits) * two
            s = (amax * inv_sqrt_g) / qmax
            kq = inv_sqrt_g / s if amax_bits != 0 else _F0
            for i in range(g):
                vb = fp8.float32_bits(t[i] * kq)
                c[i] = minifloat.bits_to_code(vb, ebits, mbits, bias, qmax_bits)
            pack_codes(c, g, bits, codes, k * gb)
            scales[k] = s
            alphas[k] = alpha


@njit(nogil=True, parallel=True, cache=True)
def _taco_fp_decode_kernel(
    codes, scales, alphas, out, g, bits, table, inv_sqrt_g, accumulate, nblocks
):  # pragma: no cover - compiled by numba
    count = out.size
    ngroups = scales.size
    gb = g * bits // 8
    for blk in prange(nblocks):
        v = np.empty(g, dtype=np.float32)
        w = np.empty(g, dtype=np.float32)
        k0, k1 = _block_bounds(blk, nblocks, ngroups)
        for k in range(k0, k1):
            base = k * g
            n = min(g, count - base)
            unpack_values(codes, k * gb, g, bits, table, v)
            t = _fwht(v, w, g)
            sc = scales[k] * inv_sqrt_g
            ia = _F1 / alphas[k]
            for i in range(n):
                y = _saturate((t[i] * sc) * ia)
                out[base + i] = out[base + i] + y if accumulate else y


def taco_fp_encode(x: np.ndarray, payload: np.ndarray, *, group_size: int, element: str) -> None:
    """Encode ``x`` into ``payload`` with the taco_fp codec (see FORMAT.md)."""
    f = minifloat.get_format(element)
    x32 = _input_f32(x)
    layout = taco_fp_layout(x32.size, group_size, f.bits)
    _check_payload(payload, layout.nbytes)
    k = layout.groups
    if k == 0:
        return
    scales = np.empty(k, dtype=np.float32)
    alphas = np.empty(k, dtype=np.float32)
    with _LAUNCH_LOCK:
        _taco_fp_encode_kernel(
            x32,
            payload[: layout.scale_offset],
            scales,
            alphas,
            group_size,
            f.bits,
            f.ebits,
            f.mbits,
            f.bias,
            np.uint32(f.qmax_bits),
            _inv_sqrt(group_size),
            _nblocks(k),
        )
    _put_f32(payload, layout.scale_offset, scales)
    _put_f32(payload, layout.alpha_offset, alphas)


def taco_fp_decode(
    payload: np.ndarray, out: np.ndarray, *, group_size: int, element: str, accumulate: bool
) -> None:
    """Decode a taco_fp ``payload`` of ``out.size`` elements into ``out`` (or add into it)."""
    f = minifloat.get_format(element)
    _check_out(out)
    layout = taco_fp_layout(out.size, group_size, f.bits)
    _check_payload(payload, layout.nbytes)
    k = layout.groups
    if k == 0:
        return
    scales = _get_f32(payload, layout.scale_offset, k)
    alphas = _get_f32(payload, layout.alpha_offset, k)
    codes = payload[: layout.scale_offset]
    table = minifloat.TABLES[f.name]
    inv_sqrt_g = _inv_sqrt(group_size)
    nblocks = _nblocks(k)

    def run(out32: np.ndarray, acc: bool) -> None:
        with _LAUNCH_LOCK:
            _taco_fp_decode_kernel(
                codes, scales, alphas, out32, group_size, f.bits, table, inv_sqrt_g, acc, nblocks
            )

    _decode_into(out, accumulate, run)
