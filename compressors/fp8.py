"""Bit-exact software FP8 (OCP E4M3FN and E5M2) conversions for the CPU kernels.

The GPU converts with ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` (sm_89+); these numba
functions reproduce it bit for bit so that CPU and GPU payloads are identical:
round to nearest, ties to even, and *saturating*: a finite value beyond ``±Qmax``
(including one that would round past it) becomes ``±Qmax``, ``±Inf`` becomes ``±Qmax``,
NaN becomes the code ``0x7F``. Signs are kept, so ``-0.0`` and negative values that
round to zero give ``0x80``. For every value in ``[-Qmax, Qmax]`` the result equals
``ml_dtypes``' conversion, which is the reference the tests hold it to.

Decoding uses 256-entry float32 tables (:data:`E4M3_TABLE`, :data:`E5M2_TABLE`) built
from the format definitions, not from ml_dtypes, so the tests compare two derivations.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


class Fp8Format(NamedTuple):
    """Parameters of one FP8 format (sign bit, ``ebits`` exponent bits, ``mbits`` mantissa
    bits, exponent ``bias``), and the saturation limit ``qmax`` with its code."""

    name: str
    ebits: int
    mbits: int
    bias: int
    qmax: float
    qmax_code: int


E4M3 = Fp8Format("e4m3", ebits=4, mbits=3, bias=7, qmax=448.0, qmax_code=0x7E)
E5M2 = Fp8Format("e5m2", ebits=5, mbits=2, bias=15, qmax=57344.0, qmax_code=0x7B)
FORMATS: dict[str, Fp8Format] = {"e4m3": E4M3, "e5m2": E5M2}

NAN_CODE = 0x7F  # a NaN in both formats (E4M3FN: S.1111.111; E5M2: S.11111.11)


def get_format(name: str) -> Fp8Format:
    """The :class:`Fp8Format` called ``name`` ("e4m3" or "e5m2")."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown fp8 format {name!r}; expected 'e4m3' or 'e5m2'") from None


# --------------------------------------------------------------------------- encoding
@intrinsic
def float32_bits(typingctx, x):  # noqa: ARG001 (numba's intrinsic signature)
    """The IEEE bits of a float32 scalar as uint32 (a bitcast; usable in @njit code)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def float32_from_bits(typingctx, b):  # noqa: ARG001 (numba's intrinsic signature)
    """The float32 whose IEEE bits are the uint32 ``b`` (a bitcast; usable in @njit code)."""
    if b != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


_U1 = np.uint32(1)
_ABS_MASK = np.uint32(0x7FFFFFFF)
_INF_BITS = np.uint32(0x7F800000)


@njit(inline="always")
def _bits_to_fp8(bits, mbits, bias, qmax_bits):
    """Saturating RNE conversion of float32 ``bits`` to an fp8 code (generic in format).

    Pure integer arithmetic, so it is exact and independent of the FPU's modes; both
    roundings are computed and one is selected, without branches, so that LLVM can
    vectorize a loop of conversions. (numba widens the uint32 arithmetic to 64 bits;
    no intermediate exceeds 32 bits where its result is used.)
    """
    sign = (bits >> np.uint32(24)) & np.uint32(0x80)
    a = bits & _ABS_MASK
    ac = a if a < qmax_bits else qmax_bits  # saturate: beyond Qmax, Inf too, give Qmax
    # fp8 normal range: round the 23-bit mantissa to mbits, ties to even; a carry runs
    # into the exponent field, as rounding up to the next binade needs. Then re-bias the
    # exponent from 127 to ``bias``.
    shift = np.uint32(23 - mbits)
    half = (_U1 << (shift - _U1)) - _U1
    normal = ((ac + half + ((ac >> shift) & _U1)) >> shift) - np.uint32((127 - bias) << mbits)
    # fp8 subnormal range: the code is |x| / 2^(1-bias-mbits) rounded to nearest even:
    # the 24-bit significand m (|x| = m * 2^(e-150)) shifted right by 151-bias-mbits-e
    # (>= 21 there). Shifts of 25 or more give 0, so they are capped at 31 (which also
    # covers float32 zeros and subnormals, e = 0). A result of 2^mbits is the smallest
    # normal code, which is right too.
    e = ac >> np.uint32(23)
    m = (ac & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
    sshift = np.uint32(151 - bias - mbits) - e  # wraps around for normals: unused there
    sshift = sshift if sshift < np.uint32(31) else np.uint32(31)
    shalf = ((_U1 << sshift) >> _U1) - _U1  # 2^(sshift-1) - 1, with no shift out of range
    sub = (m + shalf + ((m >> sshift) & _U1)) >> sshift
    code = normal if ac >= np.uint32((128 - bias) << 23) else sub
    code = np.uint32(NAN_CODE) if a > _INF_BITS else code | sign
    return np.uint8(code)


_E4M3_QMAX_BITS = np.uint32(0x43E00000)  # 448.0f
_E5M2_QMAX_BITS = np.uint32(0x47600000)  # 57344.0f


@njit(inline="always")
def bits_to_e4m3(bits):
    """float32 bits (uint32) -> E4M3FN code (uint8), saturating round-to-nearest-even."""
    return _bits_to_fp8(bits, 3, 7, _E4M3_QMAX_BITS)


@njit(inline="always")
def bits_to_e5m2(bits):
    """float32 bits (uint32) -> E5M2 code (uint8), saturating round-to-nearest-even."""
    return _bits_to_fp8(bits, 2, 15, _E5M2_QMAX_BITS)


@njit(inline="always")
def f32_to_e4m3(x):
    """float32 -> E4M3FN code (uint8); see :func:`bits_to_e4m3`."""
    return bits_to_e4m3(float32_bits(x))


@njit(inline="always")
def f32_to_e5m2(x):
    """float32 -> E5M2 code (uint8); see :func:`bits_to_e5m2`."""
    return bits_to_e5m2(float32_bits(x))


@njit(nogil=True, cache=True)
def _encode_array(x, is_e4m3, out):
    bits = x.view(np.uint32)
    if is_e4m3:
        for i in range(bits.size):
            out[i] = bits_to_e4m3(bits[i])
    else:
        for i in range(bits.size):
            out[i] = bits_to_e5m2(bits[i])


def encode(x: np.ndarray, fmt: str = "e4m3") -> np.ndarray:
    """Encode a float32 array to fp8 codes (uint8) with the kernels' saturating RNE."""
    f = get_format(fmt)
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(x.size, dtype=np.uint8)
    _encode_array(x, f is E4M3, out)
    return out


# --------------------------------------------------------------------------- decoding
def decode_table(fmt: str | Fp8Format) -> np.ndarray:
    """The float32 value of each of the 256 codes of ``fmt`` (NaN codes -> NaN with the
    code's sign, E5M2's infinity codes -> ±Inf), from the format's definition."""
    f = get_format(fmt) if isinstance(fmt, str) else fmt
    table = np.empty(256, dtype=np.float32)
    emask = (1 << f.ebits) - 1
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> f.mbits) & emask
        m = code & ((1 << f.mbits) - 1)
        if e == emask and (f is E5M2 or m == (1 << f.mbits) - 1):
            # E5M2 keeps IEEE specials; E4M3FN has no Inf and one NaN per sign (S.1111.111).
            value = np.copysign(np.inf if (f is E5M2 and m == 0) else np.nan, sign)
        elif e == 0:
            value = sign * m * 2.0 ** (1 - f.bias - f.mbits)
        else:
            value = sign * (1.0 + m / 2.0**f.mbits) * 2.0 ** (e - f.bias)
        table[code] = value
    table.setflags(write=False)
    return table


E4M3_TABLE: np.ndarray = decode_table(E4M3)
E5M2_TABLE: np.ndarray = decode_table(E5M2)


def table_for(fmt: str) -> np.ndarray:
    """The decode table of format ``fmt``."""
    return E4M3_TABLE if get_format(fmt) is E4M3 else E5M2_TABLE


def decode(codes: np.ndarray, fmt: str = "e4m3") -> np.ndarray:
    """Decode fp8 codes (uint8) to float32 (exact)."""
    return table_for(fmt)[np.asarray(codes, dtype=np.uint8)]
