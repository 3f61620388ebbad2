"""numba CPU kernels of the tah codec (FORMAT.md's canonical arithmetic, section ``tah``).

``tah_encode`` and ``tah_decode`` take flat numpy arrays with the same conventions as the
other codecs' CPU kernels (``cpu_kernels``): any float dtype in, float32 arithmetic,
decoded values rounded once to ``out``'s dtype or added into it. Encoding is three steps,
the same on the GPU (``tah_gpu``): an integer entropy score per token, the choice of the
lowest-scoring full tokens (a sort of distinct ``score << 32 | token`` keys), then the
tiles. Every comparison that decides something (min, max, the pivot's top two) is done on
integers, so that no order of evaluation can change a bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import fp8
from .cpu_kernels import (
    _LAUNCH_LOCK,
    _block_bounds,
    _check_out,
    _check_payload,
    _decode_into,
    _fwht,
    _get_f32,
    _input_f32,
    _nblocks,
    _next_up,
    _put_f32,
    _saturate,
)
from .tah_format import (
    PIVOT_FLAG,
    PIVOT_MAX_BITS,
    PIVOT_MIN_BITS,
    SCORE_FRAC,
    SCORE_LEVELS,
    SCORE_W,
    SCORE_WL,
    TahLayout,
    tah_layout,
    windows,
)

_F0 = np.float32(0.0)
_HALF = np.float32(0.5)
_NAN = np.uint32(0x7FC00000).view(np.float32)
_MIN_NORMAL = np.float32(2.0**-126)  # steps below it are divided by (1 / step overflows)
_ABS = 0x7FFFFFFF
_INF = 0x7F800000


# ----------------------------------------------------------------------- helpers
@njit(inline="always")
def _key(bits):
    """An int64 whose order is the order of the float32 with these bits (-0 < +0)."""
    b = np.int64(bits)
    if b & 0x80000000:
        return -(b & _ABS) - 1
    return b


@njit(inline="always")
def _from_key(k):
    if k < 0:
        return fp8.float32_from_bits(np.uint32(0x80000000 | (-k - 1)))
    return fp8.float32_from_bits(np.uint32(k))


@njit(inline="always")
def _log2_fixed(s):
    """floor(log2(s) * 2^20) for an int64 s >= 1, by repeated squaring (integers only)."""
    n = 0
    while (s >> (n + 1)) != 0:
        n += 1
    x = s >> (n - 30) if n >= 30 else s << (30 - n)  # s / 2^n in [1, 2), 30 fraction bits
    frac = 0
    for _ in range(SCORE_FRAC):
        x = (x * x) >> 30
        frac <<= 1
        if x >= (1 << 31):
            x >>= 1
            frac |= 1
    return (n << SCORE_FRAC) | frac


@njit(nogil=True, parallel=True, cache=True)
def _score_kernel(xb, row, keys, w_tab, wl_tab):  # pragma: no cover - compiled by numba
    n = xb.size
    for t in prange(keys.size):
        s0 = t * row
        s1 = min(s0 + row, n)
        amax = 0
        for i in range(s0, s1):
            a = np.int64(xb[i]) & _ABS
            amax = a if a > amax else amax
        score = 0  # an all-zero or non-finite token
        if 0 < amax < _INF:
            s = 0
            m = 0
            for i in range(s0, s1):
                a = np.int64(xb[i]) & _ABS
                lev = min((amax - a) >> 19, SCORE_LEVELS) if a != 0 else SCORE_LEVELS
                s += w_tab[lev]
                m += wl_tab[lev]
            score = _log2_fixed(s) + (m << SCORE_FRAC) // s
        keys[t] = (score << 32) | t


@njit(inline="always")
def _quantize(v, m, codes, off, b):
    """FORMAT.md's asymmetric tile quantization of v[:m] at b bits, codes packed from byte
    ``off``; returns (c, step)."""
    vb = v.view(np.uint32)
    lo = np.int64(1) << 40
    hi = -lo
    for i in range(m):
        k = _key(vb[i])
        lo = k if k < lo else lo
        hi = k if k > hi else hi
    flo = _from_key(lo)
    fhi = _from_key(hi)
    c = fhi * _HALF + flo * _HALF
    r1 = fhi - c
    r2 = c - flo
    r = r1 if r1 > r2 else r2
    qmax = (1 << b) - 1
    qh = np.float32(qmax) * _HALF
    for i in range(-(-m * b // 8)):
        codes[off + i] = 0
    if r == _F0:
        return c, _F0
    step = r / qh
    if step == _F0 or r / step > qh:
        step = _next_up(step)
    divide = step < _MIN_NORMAL
    inv = np.float32(1.0) / step if not divide else _F0
    for i in range(m):
        d = v[i] - c
        u = d / step if divide else d * inv
        q = np.int64(np.rint(u + qh))
        q = min(max(q, 0), qmax)
        bit = i * b
        val = q << (bit & 7)
        codes[off + (bit >> 3)] |= np.uint8(val & 0xFF)
        if (bit & 7) + b > 8:
            codes[off + (bit >> 3) + 1] |= np.uint8(val >> 8)
    return c, step


@njit(inline="always")
def _tile_place(k, tile, row, count, lb, bh, bl, codes0):
    """Element base, element count, bit width and code byte offset of tile k."""
    base = k * tile
    m = min(tile, count - base)
    t = base // row
    low = lb[t + 1] - lb[t]
    b = bl if low else bh
    seg = ((t - lb[t]) * bh + lb[t] * bl) * row // 8
    return base, m, b, codes0 + seg + (base - t * row) * b // 8


@njit(nogil=True, parallel=True, cache=True)
def _encode_kernel(
    x, payload, lb, cs, steps, row, tile, bh, bl, codes0, piv0, pivot, ratio, nblocks
):  # pragma: no cover - compiled by numba
    count = x.size
    ntiles = cs.size
    for blk in prange(nblocks):
        v = np.empty(tile, dtype=np.float32)
        w = np.empty(tile, dtype=np.float32)
        vb = v.view(np.uint32)
        k0, k1 = _block_bounds(blk, nblocks, ntiles)
        for k in range(k0, k1):
            base, m, b, off = _tile_place(k, tile, row, count, lb, bh, bl, codes0)
            first = 0
            idx = 0
            second = 0
            for i in range(m):
                v[i] = x[base + i]
                a = np.int64(vb[i]) & _ABS
                if a > first:
                    second = first
                    first = a
                    idx = i
                elif a > second:
                    second = a
            payload[piv0 + k] = 0
            if first >= _INF:  # NaN or ±Inf: the tile decodes to NaN
                for i in range(-(-m * b // 8)):
                    payload[off + i] = 0
                cs[k] = _NAN
                steps[k] = _NAN
                continue
            t = v
            if (
                pivot
                and m == tile
                and PIVOT_MIN_BITS <= first < PIVOT_MAX_BITS
                and fp8.float32_from_bits(np.uint32(first))
                >= ratio * fp8.float32_from_bits(np.uint32(second))
            ):
                v[0], v[idx] = v[idx], v[0]
                t = _fwht(v, w, tile)
                payload[piv0 + k] = PIVOT_FLAG | idx
            cs[k], steps[k] = _quantize(t, m, payload, off, b)


@njit(nogil=True, parallel=True, cache=True)
def _decode_kernel(
    payload, lb, cs, steps, out, row, tile, bh, bl, codes0, piv0, inv_tile, accumulate, nblocks
):  # pragma: no cover - compiled by numba
    count = out.size
    ntiles = cs.size
    for blk in prange(nblocks):
        v = np.empty(tile, dtype=np.float32)
        w = np.empty(tile, dtype=np.float32)
        k0, k1 = _block_bounds(blk, nblocks, ntiles)
        for k in range(k0, k1):
            base, m, b, off = _tile_place(k, tile, row, count, lb, bh, bl, codes0)
            qmax = (1 << b) - 1
            qh = np.float32(qmax) * _HALF
            c = cs[k]
            step = steps[k]
            for i in range(m):
                bit = i * b
                val = np.int64(payload[off + (bit >> 3)])
                if (bit & 7) + b > 8:
                    val |= np.int64(payload[off + (bit >> 3) + 1]) << 8
                q = (val >> (bit & 7)) & qmax
                v[i] = _saturate(c + (np.float32(q) - qh) * step)
            t = v
            p = np.int64(payload[piv0 + k])
            if p & PIVOT_FLAG:
                t = _fwht(v, w, tile)
                for i in range(tile):
                    t[i] = t[i] * inv_tile
                j = p & (PIVOT_FLAG - 1)
                t[0], t[j] = t[j], t[0]
            if accumulate:
                for i in range(m):
                    out[base + i] = out[base + i] + t[i]
            else:
                for i in range(m):
                    out[base + i] = t[i]


# ------------------------------------------------------------------ entry points
def token_keys(x32: np.ndarray, row: int) -> np.ndarray:
    """Per token of ``row`` elements of float32 ``x32``: ``score << 32 | token`` (int64),
    the score FORMAT.md's fixed-point entropy proxy (lower: more concentrated)."""
    keys = np.empty(-(-x32.size // row), dtype=np.int64)
    if keys.size:
        with _LAUNCH_LOCK:
            _score_kernel(_input_f32(x32).view(np.uint32), row, keys, SCORE_W, SCORE_WL)
    return keys


def low_prefix(
    keys: np.ndarray, full_tokens: int, low_fraction: float, window: int = 0
) -> np.ndarray:
    """``lb`` (int64, tokens + 1): ``lb[t]`` low tokens before token t. The low ones are,
    in each window of ``window`` consecutive full tokens (``window`` 0: all of them, one
    window; ``tah_format.windows``), the window's low count with the smallest keys."""
    w = windows(full_tokens, low_fraction, window)
    flags = np.zeros(keys.size, dtype=np.int64)
    end = w.whole * w.size  # the whole windows' tokens, then the shorter last window's
    if w.whole and w.low:  # each row one window
        chosen = np.sort(keys[:end].reshape(w.whole, w.size), axis=1)[:, : w.low]
        flags[(chosen & 0xFFFFFFFF).ravel()] = 1
    if w.rest_low:
        flags[np.sort(keys[end : end + w.rest])[: w.rest_low] & 0xFFFFFFFF] = 1
    return np.concatenate([np.zeros(1, np.int64), np.cumsum(flags)])


def tah_encode(
    x: np.ndarray,
    payload: np.ndarray,
    *,
    row: int,
    tile: int,
    bits_high: int,
    bits_low: int,
    low_fraction: float,
    window: int,
    pivot: bool,
    pivot_ratio: float,
) -> None:
    """Encode ``x`` into ``payload`` with the tah codec (FORMAT.md)."""
    x32 = _input_f32(x)
    lay = tah_layout(x32.size, row, tile, bits_high, bits_low, low_fraction, window)
    _check_payload(payload, lay.nbytes)
    if lay.tiles == 0:
        return
    lb = low_prefix(token_keys(x32, row), lay.full_tokens, low_fraction, window)
    flags = (lb[1:] - lb[:-1]).astype(np.uint8)
    payload[lay.bitmap_offset :] = np.packbits(flags, bitorder="little")
    cs = np.empty(lay.tiles, dtype=np.float32)
    steps = np.empty(lay.tiles, dtype=np.float32)
    with _LAUNCH_LOCK:
        _encode_kernel(
            x32, payload, lb, cs, steps, row, tile, bits_high, bits_low, lay.codes_offset,
            lay.pivot_offset, bool(pivot), np.float32(pivot_ratio), _nblocks(lay.tiles),
        )  # fmt: skip
    _put_f32(payload, 0, cs)
    _put_f32(payload, lay.step_offset, steps)


def payload_prefix(payload: np.ndarray, tokens: int, bitmap_offset: int) -> np.ndarray:
    """``lb`` of an encoded payload, from its token bitmap."""
    flags = np.unpackbits(payload[bitmap_offset:], bitorder="little")[:tokens].astype(np.int64)
    return np.concatenate([np.zeros(1, np.int64), np.cumsum(flags)])


def _check_structure(payload: np.ndarray, lay: TahLayout, count: int, tile: int) -> None:
    """Refuse a payload whose bitmap or pivot bytes no encoder writes (FORMAT.md): the
    decode takes its codes' places from the bitmap and swaps at the pivot's index, and the
    kernel checks no bounds, so such bytes would have it read or write outside its arrays."""
    bits = np.unpackbits(payload[lay.bitmap_offset :], bitorder="little")
    low = int(np.count_nonzero(bits[: lay.full_tokens]))
    past = int(np.count_nonzero(bits[lay.full_tokens :]))
    if low != lay.low_tokens or past:
        raise ValueError(
            f"malformed tah payload: its bitmap marks {low} of its {lay.full_tokens} full"
            f" tokens low and {past} bits past them; the format marks {lay.low_tokens}, and"
            " none past them"
        )
    pivots = payload[lay.pivot_offset : lay.bitmap_offset]
    flagged = (pivots & PIVOT_FLAG) != 0
    bad = np.flatnonzero(np.where(flagged, (pivots & (PIVOT_FLAG - 1)) >= tile, pivots != 0))
    if count % tile and flagged[-1]:
        bad = np.append(bad, lay.tiles - 1)  # the short last tile never pivots
    if bad.size:
        k = int(bad[0])
        raise ValueError(
            f"malformed tah payload: tile {k}'s pivot byte is {int(pivots[k]):#04x}; the"
            f" format has 0 or 0x80 | p with p < tile = {tile} (a whole tile only)"
        )


def tah_decode(
    payload: np.ndarray,
    out: np.ndarray,
    *,
    row: int,
    tile: int,
    bits_high: int,
    bits_low: int,
    low_fraction: float,
    window: int,
    accumulate: bool,
) -> None:
    """Decode a tah ``payload`` of ``out.size`` elements into ``out`` (or add into it)."""
    _check_out(out)
    lay = tah_layout(out.size, row, tile, bits_high, bits_low, low_fraction, window)
    _check_payload(payload, lay.nbytes)
    if lay.tiles == 0:
        return
    _check_structure(payload, lay, out.size, tile)
    lb = payload_prefix(payload, lay.tokens, lay.bitmap_offset)
    cs = _get_f32(payload, 0, lay.tiles)
    steps = _get_f32(payload, lay.step_offset, lay.tiles)
    inv_tile = np.float32(1.0 / tile)

    def run(out32: np.ndarray, acc: bool) -> None:
        with _LAUNCH_LOCK:
            _decode_kernel(
                payload, lb, cs, steps, out32, row, tile, bits_high, bits_low,
                lay.codes_offset, lay.pivot_offset, inv_tile, acc, _nblocks(lay.tiles),
            )  # fmt: skip

    _decode_into(out, accumulate, run)
