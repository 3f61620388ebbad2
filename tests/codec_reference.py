"""An independent float64 reference of the int8, int and taco codecs, for the tests.

Written from DESIGN.md's math, not from the kernels: explicit Sylvester Hadamard
matrices and matrix products, float64 arithmetic, and ml_dtypes for the FP8 rounding.
The kernels compute in float32 with FORMAT.md's operation order, so the two agree up to
float32 rounding: scales within a few float32 ulps, FP8 codes equal except, rarely, one
code step apart where a value lies within float32 rounding of a rounding boundary.

Also here: payload parsers (byte offsets from compressors/layout.py, whose formulas
test_codec_layout.py checks) and small helpers shared by the codec tests.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import cache

import ml_dtypes
import numpy as np

from coccl.compressors.layout import int8_layout, int_layout, taco_layout

FP8_DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
QMAX = {"e4m3": 448.0, "e5m2": 57344.0}
LAMBDA = 1e-6
NAN_CODE = 0x7F


# ------------------------------------------------------------------------- helpers
def seed_for(request) -> int:
    """A seed that differs per test (and per parameter set) but is stable across runs."""
    return zlib.crc32(request.node.nodeid.encode())


def rel_l2(approx: np.ndarray, exact: np.ndarray) -> float:
    """||approx - exact|| / ||exact|| in float64 (0 when both are zero)."""
    a = np.asarray(approx, dtype=np.float64)
    e = np.asarray(exact, dtype=np.float64)
    norm = np.linalg.norm(e)
    diff = np.linalg.norm(a - e)
    return float(diff / norm) if norm > 0 else float(diff)


def padded_groups(x: np.ndarray, group_size: int) -> np.ndarray:
    """x (converted to float32, then float64) as a (K, G) array, the last row zero-padded."""
    x = np.asarray(x).astype(np.float32).astype(np.float64)
    k = -(-x.size // group_size)
    out = np.zeros(k * group_size, dtype=np.float64)
    out[: x.size] = x
    return out.reshape(k, group_size)


@cache
def hadamard(n: int) -> np.ndarray:
    """The n x n Sylvester Hadamard matrix (entries ±1, H @ H = n I), n a power of two."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    h.setflags(write=False)
    return h


def fp8_values(codes: np.ndarray, fmt: str) -> np.ndarray:
    """The float64 values of fp8 codes, by ml_dtypes."""
    return np.asarray(codes, dtype=np.uint8).view(FP8_DTYPES[fmt]).astype(np.float64)


def fp8_ordinal(codes: np.ndarray) -> np.ndarray:
    """Signed position of each code on the fp8 number line (±0 both 0), so that codes one
    rounding step apart differ by exactly 1."""
    c = np.asarray(codes, dtype=np.int64)
    return np.where(c & 0x80, -(c & 0x7F), c & 0x7F)


def f32_from_bits(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


# ---------------------------------------------------------------------------- taco
@dataclass
class TacoParts:
    """The parts of a taco payload (or of the reference's encoding)."""

    codes: np.ndarray  # (K, G) uint8
    s: np.ndarray  # (K,) scales (ones when the payload has none)
    alpha: np.ndarray  # (K,) pre-rotation scales (ones when the payload has none)
    # (K,) groups that took the extended range (reference: where s would have clamped)
    extended: np.ndarray | None = None


FLT_MAX = float(np.finfo(np.float32).max)


def taco_encode_ref(
    x: np.ndarray,
    group_size: int,
    fp8_format: str,
    ash: bool,
    dual_scale: bool,
    coccl_clamps: bool = False,
    fitted_s: np.ndarray | None = None,
) -> TacoParts:
    """DESIGN.md's taco encoding in float64 (scales as float64, codes by ml_dtypes).

    Without ``coccl_clamps``, a group (with ``dual_scale``, not all zero) whose s would
    leave COCCL's clamps [1e-12, 1e6] takes the extended range: its s is not clamped, so
    its largest coefficient maps to Qmax as in any other group. The kernels then store a
    different (s, alpha) pair with the same ratio s / alpha (what decoding uses); with
    ``ash=False`` they store s rounded up to float32 (subnormal for tiny groups), and the
    codes follow that s: pass the payload's s as ``fitted_s`` to get those codes.
    """
    qmax = QMAX[fp8_format]
    g = group_size
    xg = padded_groups(x, g)
    bad = ~np.isfinite(xg).all(axis=1)
    xg[bad] = 0.0
    if ash:
        energy = np.mean(xg * xg, axis=1)
        alpha = np.clip(qmax / np.sqrt(energy + LAMBDA), 1e-3, 1e3)
        y = (alpha[:, None] * xg) @ hadamard(g) / np.sqrt(g)
    else:
        alpha = np.ones(xg.shape[0])
        y = xg
    extended = np.zeros(xg.shape[0], dtype=bool)
    if dual_scale:
        amax = np.abs(y).max(axis=1, initial=0.0)
        s_raw = np.maximum(amax, 1e-12) / qmax
        s = np.clip(s_raw, 1e-12, 1e6)
        if not coccl_clamps:
            extended = (amax > 0) & ((s_raw < 1e-12) | (s_raw > 1e6)) & ~bad
            s = np.where(extended, amax / qmax, s)
            if fitted_s is not None and not ash:
                s = np.where(extended, fitted_s, s)
    else:
        s = np.ones(xg.shape[0])
    scaled = np.clip(y / s[:, None], -qmax, qmax)
    codes = scaled.astype(FP8_DTYPES[fp8_format]).view(np.uint8)
    codes[bad] = NAN_CODE
    s = np.where(bad, np.nan, s)
    alpha = np.where(bad, np.nan, alpha)
    return TacoParts(codes, s, alpha, extended)


def extended_alpha(alpha: np.ndarray) -> np.ndarray:
    """FORMAT.md: a stored alpha outside [1e-3, 1e3] (positive) marks an extended group."""
    with np.errstate(invalid="ignore"):
        return (alpha > 0) & ((alpha < 1e-3) | (alpha > 1e3))


def taco_decode_ref(
    parts: TacoParts, count: int, group_size: int, fp8_format: str, ash: bool
) -> np.ndarray:
    """DESIGN.md's taco decoding in float64: H (q s) / sqrt(G) / max(alpha, 1e-12), or
    for an extended group (FORMAT.md) H (q s) / sqrt(G) / alpha within ±FLT_MAX."""
    w = fp8_values(parts.codes, fp8_format) * parts.s[:, None]
    if ash:
        with np.errstate(invalid="ignore"):
            w = w @ hadamard(group_size) / np.sqrt(group_size)
        ext = extended_alpha(parts.alpha)
        w = w / np.where(ext, parts.alpha, np.maximum(parts.alpha, 1e-12))[:, None]
        w[ext] = np.clip(w[ext], -FLT_MAX, FLT_MAX)
        # A NaN code must poison its whole group, which H @ does already; keep it explicit.
        w[np.isnan(parts.alpha)] = np.nan
    return w.reshape(-1)[:count]


def split_taco_payload(
    payload: np.ndarray, count: int, group_size: int, ash: bool, dual_scale: bool
) -> TacoParts:
    """Parse ``[K*G codes][K f32 s if dual_scale][K f32 alpha if ash]`` (FORMAT.md)."""
    layout = taco_layout(count, group_size, ash=ash, dual_scale=dual_scale)
    k = layout.groups
    assert payload.size == layout.nbytes, (payload.size, layout.nbytes)
    codes = payload[: k * group_size].reshape(k, group_size).copy()
    s = np.ones(k)
    alpha = np.ones(k)
    if layout.scale_offset is not None:
        s = _f32_at(payload, layout.scale_offset, k)
    if layout.alpha_offset is not None:
        alpha = _f32_at(payload, layout.alpha_offset, k)
    return TacoParts(codes, s, alpha)


def _f32_at(payload: np.ndarray, offset: int, n: int) -> np.ndarray:
    """``n`` little-endian float32 at byte ``offset``, as float64."""
    return payload[offset : offset + 4 * n].copy().view("<f4").astype(np.float64)


# ---------------------------------------------------------------------------- int8
@dataclass
class Int8Parts:
    q: np.ndarray  # (count,) int8
    scale: np.ndarray  # (K,) float32 values as float64


def int8_encode_ref(x: np.ndarray, group_size: int) -> Int8Parts:
    """DESIGN.md's int8 encoding: scale = f32(absmax / 127), q = rne(x / scale) in ±127.

    At the ends of float32's range FORMAT.md moves the scale by one float32 step: up where
    it is so small (at most 2^-128) that rounding it down would clamp codes, down where
    127 * scale would overflow; the reference takes the same float32 steps.
    """
    n = np.asarray(x).size
    xg = padded_groups(x, group_size)
    bad = ~np.isfinite(xg).all(axis=1)
    xg[bad] = 0.0
    amax = np.abs(xg).max(axis=1, initial=0.0)
    amax32, f127 = amax.astype(np.float32), np.float32(127)
    scale32 = amax32 / f127  # float32 division, as the kernels
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        tiny = (amax > 0) & (scale32 <= np.float32(2.0**-128))
        up = tiny & ((scale32 == 0) | (amax32 / scale32 > f127))
        scale32 = np.where(up, np.nextafter(scale32, np.float32(np.inf)), scale32)
        down = np.isinf(scale32 * f127)
    scale32 = np.where(down, np.nextafter(scale32, np.float32(0)), scale32)
    scale = scale32.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale[:, None] > 0, np.rint(xg / scale[:, None]), 0.0)
    q = np.clip(q, -127, 127).astype(np.int8)
    q[bad] = 0
    scale = np.where(bad, np.nan, scale)
    return Int8Parts(q.reshape(-1)[:n], scale)


def int8_decode_ref(parts: Int8Parts, count: int, group_size: int) -> np.ndarray:
    """q * scale, in float64 (exact: an 8-bit times a 24-bit significand)."""
    scale = np.repeat(parts.scale, group_size)[:count]
    return parts.q.astype(np.float64) * scale


def split_int8_payload(payload: np.ndarray, count: int, group_size: int) -> Int8Parts:
    """Parse ``[count int8 q][K float32 scale]`` (FORMAT.md)."""
    layout = int8_layout(count, group_size)
    assert payload.size == layout.nbytes, (payload.size, layout.nbytes)
    q = payload[:count].copy().view(np.int8)
    scale = _f32_at(payload, layout.scale_offset, layout.groups)
    return Int8Parts(q, scale)


# ----------------------------------------------------------------------------- int
@dataclass
class IntParts:
    q: np.ndarray  # (coded,) int64 codes
    scale: np.ndarray  # (K,) float32 scales D as float64


def split_int_payload(payload: np.ndarray, count: int, bits: int, g: int, h: int) -> IntParts:
    """Parse ``[packed codes][K float32 D]`` (FORMAT.md): ``bits``-bit two's complement
    fields of a little-endian bit stream."""
    layout = int_layout(count, bits, g, h)
    assert payload.size == layout.nbytes, (payload.size, layout.nbytes)
    n = layout.coded
    stream = np.unpackbits(payload[: layout.scale_offset], bitorder="little")
    assert not stream[n * bits :].any(), "unused bits of the last code byte must be 0"
    fields = stream[: n * bits].reshape(n, bits).astype(np.int64) << np.arange(bits)
    u = fields.sum(axis=1)
    q = np.where(u >= 1 << (bits - 1), u - (1 << bits), u)
    return IntParts(q, _f32_at(payload, layout.scale_offset, layout.groups))


def int_rotated_ref(x: np.ndarray, g: int, h: int) -> np.ndarray:
    """The (K, G) padded groups of x in float64, each block of h multiplied by the
    Sylvester Hadamard matrix (unnormalised; unchanged for h = 0)."""
    xg = padded_groups(x, g)
    if not h:
        return xg
    k = xg.shape[0]
    return (xg.reshape(k, g // h, h) @ hadamard(h)).reshape(k, g)


def int_uniform_ref(seed: int, salt: int, n: int) -> np.ndarray:
    """FORMAT.md's u_0 .. u_{n-1} (splitmix64 in numpy uint64 arithmetic), as float64."""
    gamma = np.uint64(0x9E3779B97F4A7C15)

    def mix(z: np.ndarray) -> np.ndarray:
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    with np.errstate(over="ignore"):
        key = mix(mix(np.array([seed], np.uint64) + gamma) ^ np.uint64(salt))
        z = mix(key + (np.arange(1, n + 1, dtype=np.uint64) * gamma))
    return (z >> np.uint64(40)).astype(np.float64) * 2.0**-24


def int_decode_ref(parts: IntParts, count: int, g: int, h: int) -> np.ndarray:
    """FORMAT.md's decode in float64, rounded once to float32 (exact: the transform of
    integer codes and its product with a float32 scale need no rounding in float64)."""
    w = parts.q.astype(np.float64)
    if h:
        w = (w.reshape(-1, h) @ hadamard(h)).reshape(-1)
    d = np.repeat(parts.scale, g)[: w.size]
    with np.errstate(over="ignore", invalid="ignore"):
        y = (w * d).astype(np.float32)
    if h:
        y = np.where(np.isinf(y), np.copysign(np.finfo(np.float32).max, y), y)
    return y[:count]


def grouped_gaussian(
    rng: np.random.Generator, count: int, group_size: int, lo: float = -3.0, hi: float = 3.0
) -> np.ndarray:
    """float32 Gaussian data whose groups have magnitudes log-uniform in 10^lo .. 10^hi,
    with a few outliers (x20) so that absmax and energy differ from group to group."""
    k = -(-count // group_size) if count else 0
    mags = np.repeat(10.0 ** rng.uniform(lo, hi, k), group_size)[:count]
    x = rng.standard_normal(count) * mags
    outliers = rng.random(count) < 0.01
    x[outliers] *= 20.0
    return x.astype(np.float32)


def group_max(values: np.ndarray, group_size: int) -> np.ndarray:
    """Per element, max |value| over its group (NaN-free input)."""
    g = padded_groups(values, group_size)
    return np.repeat(np.abs(g).max(axis=1), group_size)[: np.asarray(values).size]


# ------------------------------------------------------------- whole-range data
def magnitude_sweep(rng: np.random.Generator, group_size: int, dtype: np.dtype) -> np.ndarray:
    """Groups of ``group_size`` values of ``dtype`` whose magnitudes sweep the dtype's whole
    finite range, as float64 (exactly the dtype's values). Per power of ten from the
    smallest subnormal to the largest finite value: a Gaussian group scaled to that absmax,
    and a same-sign group (all negative) within a factor 2 of it. Then special groups: the
    largest finite value (constant, and alternating in sign), one smallest subnormal among
    zeros, all ± smallest subnormals, the smallest normal, a mix of every magnitude, one
    huge value among subnormals; and a partial last group. float64 sweeps float32's range
    (and below it: values that round to float32 zero or subnormals)."""
    dtype = np.dtype(dtype)
    g = group_size
    info = ml_dtypes.finfo(np.float32 if dtype == np.float64 else dtype)
    big = float(info.max)
    tiny = float(info.smallest_subnormal)
    lo = int(np.floor(np.log10(tiny))) - (5 if dtype == np.float64 else 0)
    hi = int(np.floor(np.log10(big)))
    groups = []
    for e in range(lo, hi + 1):
        amax = min(10.0**e, big)
        z = rng.standard_normal(g)
        groups.append(z / np.abs(z).max() * amax)
        groups.append(-rng.uniform(0.5, 1.0, g) * amax)
    groups.append(np.full(g, big))
    groups.append(np.where(np.arange(g) % 2 == 0, big, -big))
    one = np.zeros(g)
    one[g // 3] = tiny
    groups.append(one)
    groups.append(rng.choice([-tiny, tiny], g))
    groups.append(rng.uniform(1, 2, g) * float(info.smallest_normal))
    groups.append(rng.choice([-1, 1], g) * 10.0 ** rng.uniform(np.log10(tiny), np.log10(big), g))
    huge = rng.choice([-tiny, tiny], g) * rng.integers(1, 100, g)
    huge[g // 2] = big * 0.75
    groups.append(huge)
    z = rng.standard_normal(g // 2 + 3)
    groups.append(z / np.abs(z).max() * 1e-40 if dtype != np.float16 else z)  # partial
    x = np.concatenate(groups)
    with np.errstate(over="ignore", under="ignore"):
        return x.astype(dtype).astype(np.float64)


def group_errors(y: np.ndarray, x: np.ndarray, group_size: int) -> tuple[np.ndarray, ...]:
    """Per group: the error norm ||y - x||, the norm ||x|| and the element count, in
    float64 (x and y as float64; the last group may be partial)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y).astype(np.float64)
    k = -(-x.size // group_size)
    pad = k * group_size - x.size
    d = np.concatenate([y - x, np.zeros(pad)]).reshape(k, group_size)
    xs = np.concatenate([x, np.zeros(pad)]).reshape(k, group_size)
    n = np.full(k, group_size)
    n[-1] -= pad
    return np.linalg.norm(d, axis=1), np.linalg.norm(xs, axis=1), n


def assert_within_bound(
    y: np.ndarray, x: np.ndarray, group_size: int, rel: float, floor: float, msg: str
) -> None:
    """Every group: ||y - x|| <= rel * ||x|| + sqrt(n) * floor (the codecs' stated bound)."""
    err, norm, n = group_errors(y, x, group_size)
    limit = rel * norm + np.sqrt(n) * floor
    bad = ~(err <= limit)  # NaN fails too
    if bad.any():
        k = np.nonzero(bad)[0][:5]
        raise AssertionError(
            f"{msg}: {int(bad.sum())} groups beyond the bound, e.g. groups {k}: "
            f"err {err[k]}, norm {norm[k]}, limit {limit[k]}"
        )


def chunked_roundtrip(codec, x, elems):
    """What a pipelined message's receiver must hold: each chunk's decode(encode(chunk))
    on the CPU, chunks of ``elems`` elements."""
    out = np.empty_like(x)
    for a in range(0, x.size, elems):
        part = x[a : a + elems]
        out[a : a + part.size] = codec.decode(codec.encode(part), count=part.size, dtype=x.dtype)
    return out


def int_edge_payload(
    rng: np.random.Generator, count: int, bits: int, group_size: int, hadamard: int
) -> np.ndarray:
    """An ``int`` payload of random code bytes (every code; the first group all
    -2^(bits-1), the rotated values at the packed fields' limits) under scales at the
    decode's edges: products at and past FLT_MAX, NaN, ±Inf, zeros, subnormals and
    negative scales."""
    layout = int_layout(count, bits, group_size, hadamard)
    payload = rng.integers(0, 256, layout.nbytes, dtype=np.uint8)
    low = np.packbits(np.tile([0] * (bits - 1) + [1], group_size), bitorder="little")
    payload[: low.size] = low
    wbits = bits - 1 + max(hadamard, 1).bit_length() - 1  # |w| <= 2^wbits
    edge = [2.0 ** (127 - wbits + k) for k in range(-2, 3)]
    special = [np.finfo(np.float32).max, np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3.0]
    choices = np.array([*edge, *special, 1.0, 2.0**-100], np.float32)
    with np.errstate(over="ignore"):  # FLT_MAX * [1, 2): some +-Inf
        scales = rng.choice(choices, layout.groups) * rng.uniform(1, 2, layout.groups)
        payload[layout.scale_offset :] = scales.astype(np.float32).view(np.uint8)
    return payload
