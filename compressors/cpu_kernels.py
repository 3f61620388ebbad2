"""numba CPU kernels of the int8 and taco codecs (FORMAT.md's canonical float32 arithmetic).

The public functions take flat numpy arrays and have the same names and keyword
arguments as their GPU twins in ``gpu_kernels``:

* ``x``: float32, float16, bfloat16 or float64. Non-float32 input is converted to float32
  here first (exact for float16/bfloat16; float64 rounds to nearest, and values beyond
  float32 become ±Inf, which makes their group non-finite), as FORMAT.md prescribes.
* ``payload``: flat uint8 of exactly the encoded size.
* ``out``: float32, float16, bfloat16 or float64, ``count = out.size``. Values are decoded
  in float32 and then rounded once to ``out``'s dtype. With ``accumulate=True`` they are
  added into ``out``: a float32 ``out`` is added to in float32 inside the kernel; a float16
  or bfloat16 ``out`` is widened to a float32 temporary, added to in float32 and rounded
  back once (RNE); a float64 ``out`` gets the (exact) float64 value of each decoded float32
  added in float64, since float64 data is reduced in float64 (DESIGN.md, Algorithms).

The kernels are ``@njit(nogil=True, parallel=True, cache=True)``: the GIL is released so
that they can run on a worker thread while MPI progresses, and the groups are spread over
numba's threads (the result does not depend on the thread count). ``fastmath`` stays off:
it would let LLVM contract ``a * b + c`` into FMAs and reassociate sums, which breaks the
bit-exactness with the GPU that FORMAT.md requires. The float32 scales are computed into a
small aligned temporary and copied into the payload bytewise, since inside a payload they
need not be 4-byte aligned (int8's start at byte ``count``; a payload can be a slice of a
larger buffer).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import numba
import numpy as np
from numba import njit, prange

from . import fp8
from .layout import int8_layout, taco_layout

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError(
        "coccl's CPU kernels assume a little-endian host (payloads are little-endian)"
    )

# FORMAT.md's constants, as float32 so that numba keeps every operation in float32.
_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_F127 = np.float32(127.0)
_LAMBDA = np.float32(1e-6)
_ALPHA_MIN = np.float32(1e-3)
_ALPHA_MAX = np.float32(1e3)
_S_MIN = np.float32(1e-12)
_S_MAX = np.float32(1e6)
_NAN = np.uint32(0x7FC00000).view(np.float32)  # the NaN scale of a non-finite group
_ABS_MASK = np.uint32(0x7FFFFFFF)
_INF_BITS = np.uint32(0x7F800000)
_FLT_MAX = np.float32(np.finfo(np.float32).max)
_INT8_TINY_SCALE = np.uint32(0x00200000).view(np.float32)  # 2^-128: 1/scale overflows
_EXT_SHIFT = 116  # extended taco groups are scaled by 2^p, |p| <= 116 (FORMAT.md)

# One kernel launch at a time: numba's workqueue threading layer (its fallback where
# neither TBB nor OpenMP is available) aborts the process when two Python threads launch
# parallel kernels at once, and under the other layers two launches would only compete
# for the same cores. Kernels still release the GIL, so MPI progresses meanwhile.
_LAUNCH_LOCK = threading.Lock()


# ------------------------------------------------------------------------- helpers
@njit(inline="always")
def _fmax(a, b):
    # C's fmaxf for the cases that occur here: a NaN first argument yields b.
    return a if a > b else b


@njit(inline="always")
def _clamp(a, lo, hi):
    if a < lo:
        return lo
    if a > hi:
        return hi
    return a


@njit(inline="always")
def _next_up(a):
    # The next float32 above a non-negative finite a (its bits + 1).
    return fp8.float32_from_bits(np.uint32(fp8.float32_bits(a) + np.uint32(1)))


@njit(inline="always")
def _next_down(a):
    # The next float32 below a positive finite a (its bits - 1).
    return fp8.float32_from_bits(np.uint32(fp8.float32_bits(a) - np.uint32(1)))


@njit(inline="always")
def _fit_scale(amax, qmax):
    """FORMAT.md's fitted scale of a group with absmax ``amax > 0``: ``amax / qmax``, one
    float32 step up if that rounding left ``amax / s`` above ``qmax`` (so no value
    saturates; also lifts an s that underflowed to 0), or one step down if ``qmax * s``
    overflows (so no decoded value does)."""
    s = amax / qmax
    if s == _F0 or amax / s > qmax:
        s = _next_up(s)
    elif s * qmax == np.inf:
        s = _next_down(s)
    return s


@njit(inline="always")
def _pow2_toward_one(amax_bits):
    """2^p with p = clamp(127 - E, -116, 116), E the biased exponent of a non-negative
    float32 with bits ``amax_bits``: the power of two that takes it to [1, 2) where it can
    (and alpha * 2^p, 1 / (alpha * 2^p) stay normal for alpha in [1e-3, 1e3])."""
    e = np.int64(amax_bits >> np.uint32(23))
    p = min(max(127 - e, -_EXT_SHIFT), _EXT_SHIFT)
    return fp8.float32_from_bits(np.uint32((127 + p) << 23))


@njit(inline="always")
def _extended_alpha(a):
    # FORMAT.md: a stored alpha outside [1e-3, 1e3] (positive, not NaN) marks a group that
    # the extended range encoded; it decodes as (w * (s * c)) * (1 / alpha).
    return a > _F0 and (a < _ALPHA_MIN or a > _ALPHA_MAX)


@njit(inline="always")
def _saturate(y):
    # ±Inf -> ±FLT_MAX (NaN stays NaN): a decoded value cannot lie beyond the float32
    # range that its input came from, so this only ever moves it toward the input.
    if y == np.inf:
        return _FLT_MAX
    if y == -np.inf:
        return -_FLT_MAX
    return y


@njit(inline="always")
def _wht_stage(src, dst, g, h, width):
    """One out-of-place stage h of the transform. The innermost loop runs over ``width``
    (a constant at each call site, dividing h) consecutive pairs, so that LLVM turns it
    into whole vector operations even when g and h are only known at run time."""
    for i0 in range(0, g, 2 * h):
        for i1 in range(i0, i0 + h, width):
            for j in range(width):
                a = src[i1 + j]
                b = src[i1 + h + j]
                dst[i1 + j] = a + b
                dst[i1 + h + j] = a - b


@njit(inline="always")
def _fwht(v, w, g):
    """Unnormalised Walsh-Hadamard transform of v[:g], stages h = 1, 2, ..., g/2.

    Each stage maps every pair (i, i + h) with bit h of i clear to (a + b, a - b). The
    first three stages are fused per block of 8 (the same operations in the same order,
    kept in registers); the later ones alternate between ``v`` and the scratch ``w``,
    because out-of-place loops vectorize where in-place ones (aliasing) do not. Returns
    whichever of the two holds the result. (The order in which independent pairs are
    computed does not change any result.)
    """
    for i in range(0, g, 8):
        a0, a1, a2, a3 = v[i], v[i + 1], v[i + 2], v[i + 3]
        a4, a5, a6, a7 = v[i + 4], v[i + 5], v[i + 6], v[i + 7]
        b0, b1, b2, b3 = a0 + a1, a0 - a1, a2 + a3, a2 - a3  # h = 1
        b4, b5, b6, b7 = a4 + a5, a4 - a5, a6 + a7, a6 - a7
        c0, c1, c2, c3 = b0 + b2, b1 + b3, b0 - b2, b1 - b3  # h = 2
        c4, c5, c6, c7 = b4 + b6, b5 + b7, b4 - b6, b5 - b7
        v[i], v[i + 1], v[i + 2], v[i + 3] = c0 + c4, c1 + c5, c2 + c6, c3 + c7  # h = 4
        v[i + 4], v[i + 5], v[i + 6], v[i + 7] = c0 - c4, c1 - c5, c2 - c6, c3 - c7
    src, dst = v, w
    if g > 8:
        _wht_stage(src, dst, g, 8, 8)
        src, dst = dst, src
    if g > 16:
        _wht_stage(src, dst, g, 16, 16)
        src, dst = dst, src
    h = 32
    while h < g:
        _wht_stage(src, dst, g, h, 32)
        src, dst = dst, src
        h *= 2
    return src


@njit(inline="always")
def _max_abs_bits(vb, n):
    """max over i < n of the bits of |v_i| (``vb`` = v viewed as uint32).

    For non-NaN floats the order of |v| and of its bits agree, so this is max|v| as bits;
    a result >= 0x7F800000 means some element is Inf or NaN. Integer max vectorizes,
    where a float max chain (without fastmath) does not.
    """
    m = np.uint32(0)
    for i in range(n):
        a = vb[i] & _ABS_MASK
        m = a if a > m else m
    return np.uint32(m)  # numba computes in 64 bits


@njit(inline="always")
def _block_bounds(b, nblocks, ngroups):
    # Contiguous, near-equal ranges of groups, one per prange iteration, so that each
    # iteration allocates its scratch once rather than once per group.
    return b * ngroups // nblocks, (b + 1) * ngroups // nblocks


# ---------------------------------------------------------------------------- taco
@njit(nogil=True, parallel=True, cache=True)
def _taco_encode_kernel(
    x, codes, scales, alphas, g, is_e4m3, ash, dual_scale, extend, qmax, inv_sqrt_g, nblocks
):  # pragma: no cover - compiled by numba
    count = x.size
    ngroups = scales.size
    nruns = g // 32
    for blk in prange(nblocks):
        v = np.empty(g, dtype=np.float32)
        w = np.empty(g, dtype=np.float32)
        vb = v.view(np.uint32)
        runs = np.empty(nruns, dtype=np.float32)
        k0, k1 = _block_bounds(blk, nblocks, ngroups)
        for k in range(k0, k1):
            base = k * g
            n = min(g, count - base)
            for i in range(n):
                v[i] = x[base + i]
            for i in range(n, g):
                v[i] = _F0
            amax_bits = _max_abs_bits(vb, g)
            if amax_bits >= _INF_BITS:
                # FORMAT.md step 6: NaN codes and NaN scales, so the group decodes to NaN.
                for i in range(g):
                    codes[base + i] = fp8.NAN_CODE
                scales[k] = _NAN
                alphas[k] = _NAN
                continue
            alpha = _F1
            c = _F1
            t = v
            if ash:
                # Energy: sequential sums over runs of 32, then a pairwise tree over runs.
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
                m = runs[0] / np.float32(g)
                alpha = _clamp(qmax / np.sqrt(m + _LAMBDA), _ALPHA_MIN, _ALPHA_MAX)
                for i in range(g):
                    v[i] = v[i] * alpha
                t = _fwht(v, w, g)
                c = inv_sqrt_g
                amax_bits = _max_abs_bits(t.view(np.uint32), g)
            divide = False
            if dual_scale:
                amax = fp8.float32_from_bits(amax_bits)
                s = _fmax(amax * c, _S_MIN) / qmax
                if extend and amax_bits != 0 and (s < _S_MIN or s > _S_MAX):
                    # FORMAT.md step 4b: s would clamp, so the group takes the extended
                    # range instead (its codes then reach Qmax like any other group's).
                    if ash:
                        two = _pow2_toward_one(amax_bits)
                        for i in range(g):
                            t[i] = t[i] * two
                        alpha = alpha * two
                        s = ((amax * two) * c) / qmax
                    else:
                        s = _fit_scale(amax, qmax)
                        divide = True  # 1 / s may overflow: divide by s instead
                else:
                    s = _clamp(s, _S_MIN, _S_MAX)
                kq = c / s
            else:
                s = _F1
                kq = c
            if divide:
                if is_e4m3:
                    for i in range(g):
                        codes[base + i] = fp8.f32_to_e4m3(t[i] / s)
                else:
                    for i in range(g):
                        codes[base + i] = fp8.f32_to_e5m2(t[i] / s)
            elif is_e4m3:
                for i in range(g):
                    codes[base + i] = fp8.f32_to_e4m3(t[i] * kq)
            else:
                for i in range(g):
                    codes[base + i] = fp8.f32_to_e5m2(t[i] * kq)
            scales[k] = s
            alphas[k] = alpha


@njit(nogil=True, parallel=True, cache=True)
def _taco_decode_kernel(
    codes, scales, alphas, out, g, table, ash, inv_sqrt_g, accumulate, nblocks
):  # pragma: no cover - compiled by numba
    # ``scales``/``alphas`` hold 1.0 where the payload has none, which gives FORMAT.md's
    # k' = (s * c) / fmaxf(alpha, 1e-12) for every combination of the switches.
    count = out.size
    ngroups = scales.size
    c = inv_sqrt_g if ash else _F1
    for blk in prange(nblocks):
        v = np.empty(g, dtype=np.float32)
        w = np.empty(g, dtype=np.float32)
        k0, k1 = _block_bounds(blk, nblocks, ngroups)
        for k in range(k0, k1):
            base = k * g
            n = min(g, count - base)
            kd = (scales[k] * c) / _fmax(alphas[k], _S_MIN)
            t = v
            if ash:
                for i in range(g):
                    v[i] = table[codes[base + i]]
                t = _fwht(v, w, g)
            else:
                for i in range(n):
                    v[i] = table[codes[base + i]]
            if _extended_alpha(alphas[k]):
                sc = scales[k] * c
                ia = _F1 / alphas[k]
                for i in range(n):
                    y = _saturate((t[i] * sc) * ia)
                    out[base + i] = out[base + i] + y if accumulate else y
            elif accumulate:
                for i in range(n):
                    out[base + i] = out[base + i] + t[i] * kd
            else:
                for i in range(n):
                    out[base + i] = t[i] * kd


def taco_encode(
    x: np.ndarray,
    payload: np.ndarray,
    *,
    group_size: int,
    fp8_format: str,
    ash: bool,
    dual_scale: bool,
    coccl_clamps: bool = False,
) -> None:
    """Encode ``x`` into ``payload`` with the taco codec (see FORMAT.md); with
    ``coccl_clamps`` COCCL's clamps of alpha and s apply to every group (no extended
    range)."""
    x32 = _input_f32(x)
    layout = taco_layout(x32.size, group_size, ash=ash, dual_scale=dual_scale)
    _check_payload(payload, layout.nbytes)
    k = layout.groups
    if k == 0:
        return
    fmt = fp8.get_format(fp8_format)
    scales = np.empty(k, dtype=np.float32)
    alphas = np.empty(k, dtype=np.float32)
    with _LAUNCH_LOCK:
        _taco_encode_kernel(
            x32,
            payload[: k * group_size],
            scales,
            alphas,
            group_size,
            fmt is fp8.E4M3,
            bool(ash),
            bool(dual_scale),
            not coccl_clamps,
            np.float32(fmt.qmax),
            _inv_sqrt(group_size),
            _nblocks(k),
        )
    if layout.scale_offset is not None:
        _put_f32(payload, layout.scale_offset, scales)
    if layout.alpha_offset is not None:
        _put_f32(payload, layout.alpha_offset, alphas)


def taco_decode(
    payload: np.ndarray,
    out: np.ndarray,
    *,
    group_size: int,
    fp8_format: str,
    ash: bool,
    dual_scale: bool,
    accumulate: bool,
) -> None:
    """Decode a taco ``payload`` of ``out.size`` elements into ``out`` (or add into it)."""
    _check_out(out)
    layout = taco_layout(out.size, group_size, ash=ash, dual_scale=dual_scale)
    _check_payload(payload, layout.nbytes)
    k = layout.groups
    if k == 0:
        return
    ones = np.ones(k, dtype=np.float32)
    scales = ones if layout.scale_offset is None else _get_f32(payload, layout.scale_offset, k)
    alphas = ones if layout.alpha_offset is None else _get_f32(payload, layout.alpha_offset, k)
    table = fp8.table_for(fp8_format)
    codes = payload[: k * group_size]
    inv_sqrt_g = _inv_sqrt(group_size)
    nblocks = _nblocks(k)

    def run(out32: np.ndarray, acc: bool) -> None:
        with _LAUNCH_LOCK:
            _taco_decode_kernel(
                codes, scales, alphas, out32, group_size, table, bool(ash), inv_sqrt_g, acc, nblocks
            )

    _decode_into(out, accumulate, run)


# ---------------------------------------------------------------------------- int8
@njit(nogil=True, parallel=True, cache=True)
def _int8_encode_kernel(x, q, scales, g):  # pragma: no cover - compiled by numba
    count = x.size
    xb = x.view(np.uint32)
    for k in prange(scales.size):
        base = k * g
        end = min(base + g, count)
        amax_bits = _max_abs_bits(xb[base:end], end - base)
        if amax_bits >= _INF_BITS:  # NaN or ±Inf in the group
            for i in range(base, end):
                q[i] = 0
            scales[k] = _NAN
        else:
            amax = fp8.float32_from_bits(amax_bits)
            scale = amax / _F127
            if amax_bits != 0 and scale <= _INT8_TINY_SCALE:
                # FORMAT.md step 4: 1 / scale would overflow; divide by a fitted scale.
                scale = _fit_scale(amax, _F127)
                for i in range(base, end):
                    q[i] = np.int8(_clamp(np.rint(x[i] / scale), -_F127, _F127))
            else:
                if scale * _F127 == np.inf:  # amax near FLT_MAX: keep 127 * scale finite
                    scale = _next_down(scale)
                inv = _F1 / scale if amax_bits != 0 else _F0
                for i in range(base, end):
                    q[i] = np.int8(_clamp(np.rint(x[i] * inv), -_F127, _F127))
            scales[k] = scale


@njit(nogil=True, parallel=True, cache=True)
def _int8_decode_kernel(q, scales, out, g, accumulate):  # pragma: no cover - compiled by numba
    count = out.size
    for k in prange(scales.size):
        base = k * g
        end = min(base + g, count)
        scale = scales[k]
        if accumulate:
            for i in range(base, end):
                out[i] = out[i] + np.float32(q[i]) * scale
        else:
            for i in range(base, end):
                out[i] = np.float32(q[i]) * scale


def int8_encode(x: np.ndarray, payload: np.ndarray, *, group_size: int) -> None:
    """Encode ``x`` into ``payload`` with the int8 codec (see FORMAT.md)."""
    x32 = _input_f32(x)
    layout = int8_layout(x32.size, group_size)
    _check_payload(payload, layout.nbytes)
    if layout.groups == 0:
        return
    scales = np.empty(layout.groups, dtype=np.float32)
    with _LAUNCH_LOCK:
        _int8_encode_kernel(x32, payload[: x32.size].view(np.int8), scales, group_size)
    _put_f32(payload, layout.scale_offset, scales)


def int8_decode(payload: np.ndarray, out: np.ndarray, *, group_size: int, accumulate: bool) -> None:
    """Decode an int8 ``payload`` of ``out.size`` elements into ``out`` (or add into it)."""
    _check_out(out)
    count = out.size
    layout = int8_layout(count, group_size)
    _check_payload(payload, layout.nbytes)
    if layout.groups == 0:
        return
    scales = _get_f32(payload, layout.scale_offset, layout.groups)
    q = payload[:count].view(np.int8)

    def run(out32: np.ndarray, acc: bool) -> None:
        with _LAUNCH_LOCK:
            _int8_decode_kernel(q, scales, out32, group_size, acc)

    _decode_into(out, accumulate, run)


# ------------------------------------------------------------------ array plumbing
def _input_f32(x: np.ndarray) -> np.ndarray:
    """``x`` as a flat contiguous float32 array (converted once, per FORMAT.md), read-only
    whatever the caller's flags: numba compiles a kernel once for a writable and again for
    a read-only input, and the kernels only read it, so every input is passed read-only."""
    _check_flat(x, "x")
    if x.dtype != np.float32:
        if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
            raise TypeError(f"x must be float32, float16, bfloat16 or float64, got {x.dtype}")
        with np.errstate(over="ignore"):  # float64 beyond float32 becomes ±Inf, on purpose
            x = x.astype(np.float32)
    view = x.view()
    view.flags.writeable = False
    return view


def _decode_into(
    out: np.ndarray, accumulate: bool, run: Callable[[np.ndarray, bool], None]
) -> None:
    """Run a decode kernel (which writes or adds float32) for any supported ``out`` dtype."""
    if out.dtype == np.float32:
        run(out, accumulate)
    elif out.dtype == np.float64:
        tmp = np.empty(out.size, dtype=np.float32)
        run(tmp, False)
        if accumulate:
            out += tmp  # float64 arithmetic on the exact float64 value of each float32
        else:
            out[...] = tmp
    else:  # float16 / bfloat16: float32 arithmetic, one rounding (RNE) at the end
        tmp = out.astype(np.float32) if accumulate else np.empty(out.size, dtype=np.float32)
        run(tmp, accumulate)
        out[...] = tmp.astype(out.dtype)


def _check_flat(a: np.ndarray, name: str) -> None:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.ndim != 1 or not a.flags.c_contiguous:
        raise ValueError(f"{name} must be a flat C-contiguous array")


def _check_out(out: np.ndarray) -> None:
    _check_flat(out, "out")
    if out.dtype not in (np.float32, np.float64, np.float16) and out.dtype.name != "bfloat16":
        raise TypeError(f"out must be float32, float16, bfloat16 or float64, got {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("out must be writeable")


def _check_payload(payload: np.ndarray, nbytes: int) -> None:
    # The kernels do no bounds checks, so a wrong size must never reach them.
    _check_flat(payload, "payload")
    if payload.dtype != np.uint8:
        raise TypeError(f"payload must be uint8, got {payload.dtype}")
    if payload.size != nbytes:
        raise ValueError(f"payload holds {payload.size} bytes; expected {nbytes}")


def _put_f32(payload: np.ndarray, offset: int, values: np.ndarray) -> None:
    payload[offset : offset + 4 * values.size] = values.astype("<f4", copy=False).view(np.uint8)


def _get_f32(payload: np.ndarray, offset: int, n: int) -> np.ndarray:
    values = np.empty(n, dtype="<f4")
    values.view(np.uint8)[...] = payload[offset : offset + 4 * n]
    return values


def _nblocks(ngroups: int) -> int:
    # One prange iteration per numba thread (numba's get_num_threads() inside a kernel
    # would keep it from being cached on disk).
    return max(1, min(ngroups, numba.get_num_threads()))


def _inv_sqrt(g: int) -> np.float32:
    # FORMAT.md: 1/sqrt(G) computed in double and rounded once to float32.
    return np.float32(1.0 / np.sqrt(np.float64(g)))
