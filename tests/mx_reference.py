"""Independent references of the mx and taco_fp codecs, for the tests.

Written from the OCP MX / NVFP4 definitions and DESIGN.md's TACO math, not from the
kernels: numpy unpacking of the payload, float64 exponents by ``np.frexp``, ml_dtypes for
every element and scale rounding (``float4_e2m1fn``, ``float6_e3m2fn``, ``float6_e2m3fn``,
``float8_e4m3fn``), explicit Hadamard matrices.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from coccl.compressors.layout import num_groups
from coccl.compressors.mx_layout import mx_layout, taco_fp_layout

from codec_reference import LAMBDA, hadamard, padded_groups

ELEMENT_DTYPES = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
}
QMAX = {"e2m1": 6.0, "e3m2": 28.0, "e2m3": 7.5}
EMAX = {"e2m1": 2, "e3m2": 4, "e2m3": 2}
BITS = {"e2m1": 4, "e3m2": 6, "e2m3": 6}
FLT_MAX = float(np.finfo(np.float32).max)


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """Packed little-endian codes (FORMAT.md) -> one code per uint8."""
    p = np.asarray(packed, dtype=np.uint8)
    if bits == 4:
        return np.stack([p & 0xF, p >> 4], axis=1).reshape(-1)
    w = p.reshape(-1, 3).astype(np.uint32)
    w = w[:, 0] | (w[:, 1] << 8) | (w[:, 2] << 16)
    return np.stack([(w >> s) & 0x3F for s in (0, 6, 12, 18)], axis=1).reshape(-1).astype(np.uint8)


def element_codes(v: np.ndarray, element: str) -> np.ndarray:
    """Saturating RNE codes of float values by ml_dtypes (clipped to ±qmax first)."""
    q = QMAX[element]
    return np.clip(np.asarray(v, np.float64), -q, q).astype(ELEMENT_DTYPES[element]).view(np.uint8)


def element_values(codes: np.ndarray, element: str) -> np.ndarray:
    return np.asarray(codes, np.uint8).view(ELEMENT_DTYPES[element]).astype(np.float64)


@dataclass
class MxParts:
    codes: np.ndarray  # (K, B) uint8
    scales: np.ndarray  # (K,) uint8
    tensor_scale: float | None


def split_mx_payload(payload: np.ndarray, count: int, element: str, block: int, scale: str):
    layout = mx_layout(count, block, BITS[element], scale == "e4m3")
    assert payload.size == layout.nbytes
    k = layout.blocks
    codes = unpack_codes(payload[: layout.scale_offset], BITS[element]).reshape(k, block)
    scales = payload[layout.scale_offset : layout.scale_offset + k].copy()
    s = None
    if scale == "e4m3":
        s = float(payload[layout.tensor_offset :].copy().view("<f4")[0])
    return MxParts(codes, scales, s)


def mx_encode_ref(x: np.ndarray, element: str, block: int, scale: str) -> MxParts:
    """OCP MX (E8M0: 2^(floor(log2 amax) - emax), clamped to 2^-127..2^127) or NVFP4-style
    (S per payload, E4M3 per block) encoding, element rounding by ml_dtypes."""
    xg = padded_groups(x, block)
    bad = ~np.isfinite(xg).all(axis=1)
    xg[bad] = 0.0
    amax = np.abs(xg).max(axis=1)
    if scale == "e8m0":
        _, e = np.frexp(amax)  # amax = f * 2^e, f in [0.5, 1): floor(log2 amax) = e - 1
        shared = np.where(amax > 0, e - 1 - EMAX[element], -127).clip(-127, 127)
        codes = element_codes(xg * 2.0 ** -shared[:, None], element)
        scales = np.where(bad, 0xFF, shared + 127).astype(np.uint8)
        s = None
    else:
        f32 = np.float32
        top = f32(amax[~bad].max(initial=0.0))
        s = max(top / f32(448.0 * QMAX[element]), f32(2.0**-126))
        target = (amax.astype(f32) / s) / f32(QMAX[element])
        e4m3 = np.minimum(target, 448.0).astype(ml_dtypes.float8_e4m3fn)
        den = e4m3.astype(f32) * s
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(den[:, None] > 0, xg.astype(f32) / den[:, None], 0.0)
        codes = element_codes(v, element)
        scales = np.where(bad, 0x7F, e4m3.view(np.uint8)).astype(np.uint8)
        s = float(s)
    codes[bad] = 0
    return MxParts(codes, scales, s)


def mx_decode_ref(parts: MxParts, count: int, element: str, block: int, scale: str) -> np.ndarray:
    """E8M0: code value * 2^(scale - 127), exact; E4M3: code value * f32(sb * S), rounded
    to float32 (within ±FLT_MAX)."""
    vals = element_values(parts.codes, element)
    if scale == "e8m0":
        d = np.where(parts.scales == 0xFF, np.nan, 2.0 ** (parts.scales.astype(np.float64) - 127))
        return (vals * d[:, None]).reshape(-1)[:count]
    sb = parts.scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    d = sb * np.float32(parts.tensor_scale)
    with np.errstate(over="ignore"):
        y = vals.astype(np.float32) * d[:, None]
    return np.clip(y, -FLT_MAX, FLT_MAX).astype(np.float64).reshape(-1)[:count]


def taco_fp_decode_ref(payload: np.ndarray, count: int, element: str, g: int) -> np.ndarray:
    """DESIGN.md's taco decoding in float64: H (q s) / sqrt(G) / alpha, from the payload."""
    layout = taco_fp_layout(count, g, BITS[element])
    k = layout.groups
    codes = unpack_codes(payload[: layout.scale_offset], BITS[element]).reshape(k, g)
    s = payload[layout.scale_offset : layout.alpha_offset].copy().view("<f4").astype(np.float64)
    alpha = payload[layout.alpha_offset :].copy().view("<f4").astype(np.float64)
    w = element_values(codes, element) * s[:, None]
    with np.errstate(invalid="ignore"):
        y = w @ hadamard(g) / np.sqrt(g) / alpha[:, None]
    return y.reshape(-1)[:count]


def taco_fp_codes_ref(x: np.ndarray, element: str, g: int) -> tuple[np.ndarray, np.ndarray]:
    """The coefficients that taco_fp's codes round, in float64: y / s with y = H (alpha x)
    / sqrt(G) and s = max|y| / R (a scaled group's largest coefficient is R); and the
    non-finite groups. alpha cancels here, so this is alpha = R / sqrt(m + lambda) or
    any other pre-rotation scale."""
    xg = padded_groups(x, g)
    bad = ~np.isfinite(xg).all(axis=1)
    xg[bad] = 0.0
    alpha = QMAX[element] / np.sqrt(np.mean(xg * xg, axis=1) + LAMBDA)
    y = (np.clip(alpha, 1e-3, 1e3)[:, None] * xg) @ hadamard(g) / np.sqrt(g)
    amax = np.abs(y).max(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = np.where(amax[:, None] > 0, y / amax[:, None] * QMAX[element], 0.0)
    return u, bad


def quotient_edges(
    rng: np.random.Generator, element: str, block: int, top: float, dtype, blocks: int = 64
) -> np.ndarray:
    """x of ``dtype`` (as float64) for an E4M3-scaled mx encode whose element quotients
    ``x / d`` (FORMAT.md: ``d = value(sb) * S`` of the block) lie a few ulps of x around every
    rounding boundary of ``element`` (the midpoints between its codes, and qmax): where the
    last bit of the float32 quotient decides the code. Block 0 holds the payload's largest
    value ``top`` (so ``S = top / (448 qmax)``, at least 2^-126); then ``blocks`` groups of
    blocks, each with its own largest value (``top`` times 2^-15 .. 1, so many divisors d
    and E4M3 subnormal scales) and the edge values of that block's d, random signs."""
    dtype = np.dtype(dtype)
    bits = np.dtype(f"u{dtype.itemsize}")
    f32 = np.float32
    qmax = QMAX[element]
    s = max(f32(top) / f32(448.0 * qmax), f32(2.0**-126))
    codes = np.arange(1 << BITS[element], dtype=np.uint8)
    values = np.unique(np.abs(codes.view(ELEMENT_DTYPES[element]).astype(f32)))
    edges = np.concatenate([(values[:-1] + values[1:]) / f32(2), [f32(qmax)]]).astype(f32)

    def near(v: np.ndarray) -> np.ndarray:  # v in dtype, and 2 steps of dtype either side
        u = np.asarray(v, np.float64).astype(dtype).view(bits).astype(np.int64)
        u = (u[:, None] + np.arange(-2, 3)[None, :]).ravel()
        return u.clip(0, np.iinfo(bits).max).astype(bits).view(dtype).astype(np.float64)

    out = [np.array([top] + [0.0] * (block - 1))]
    with np.errstate(over="ignore", under="ignore"):
        for amax in (top * 2.0 ** -rng.uniform(0, 15, blocks)).astype(dtype).astype(np.float64):
            ratio = f32(f32(amax) / s) / f32(qmax)
            sb = np.clip(ratio, 0, 448).astype(ml_dtypes.float8_e4m3fn).astype(f32)
            if sb == 0:
                continue
            x = near(edges * (sb * s))
            x = x[(x > 0) & (x <= amax)]
            rng.shuffle(x)
            for i in range(0, x.size, block - 1):
                part = x[i : i + block - 1] * rng.choice([-1.0, 1.0], min(block - 1, x.size - i))
                out.append(np.concatenate([[amax], part, np.zeros(block - 1 - part.size)]))
    return np.concatenate(out).astype(dtype).astype(np.float64)


# S values for arbitrary E4M3 payloads: ordinary, the encode's floor, huge (products
# overflow), subnormal, negative, NaN and Inf.
ANY_S = [1.0, 2.0**-126, 3e38, 1e-45, -2.5, float("nan"), float("inf")]


def any_payloads(rng: np.random.Generator, codec, count: int, dtype: np.dtype):
    """Payloads no encode writes, for the decode tests: random code bytes, the scale
    bytes cycling over every value, and for an E4M3-scaled codec its trailing S over
    ``ANY_S``. Yields ``(S or None, payload)``."""
    size = codec.encoded_nbytes(count, dtype)
    k = num_groups(count, codec.alignment)
    tail = 4 if codec.scale == "e4m3" else 0
    for s in ANY_S if tail else [None]:
        payload = rng.integers(0, 256, size, dtype=np.uint8)
        payload[size - tail - k : size - tail] = np.arange(k) % 256
        if s is not None:
            payload[-4:] = np.array([s], "<f4").view(np.uint8)
        yield s, payload
