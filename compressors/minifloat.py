"""Bit-exact software FP4/FP6 element formats (OCP MX: E2M1, E3M2, E2M3) for the CPU kernels.

These formats have no Inf and no NaN ("fn"): every code is a finite value, the largest
(``S.1..1.1..1``) is the saturation limit ``qmax``. The conversion from float32 works on the
bits with integer arithmetic only, as ``fp8.py`` does for FP8 (the same algorithm in
``mx_kernels.cu``, so CPU and GPU codes are identical): round to nearest, ties to even,
*saturating* (a value beyond ``±qmax``, or one that rounds past it, becomes ``±qmax``; so
does ±Inf, which the codecs never convert: they mark a non-finite block by its scale).
Signs are kept: ``-0.0`` and negative values that round to zero give the code
``1 << (ebits + mbits)``. For every finite value the result equals ``ml_dtypes``'
``float4_e2m1fn`` / ``float6_e3m2fn`` / ``float6_e2m3fn`` conversion, which the tests hold
it to. Codes sit in the low 4 or 6 bits of a byte, sign highest, as in ml_dtypes.

Decoding uses tables built from the format definitions (:func:`decode_table`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

_U1 = np.uint32(1)
_ABS_MASK = np.uint32(0x7FFFFFFF)


class ElementFormat(NamedTuple):
    """One element format: ``ebits`` exponent bits, ``mbits`` mantissa bits, exponent
    ``bias``; ``qmax`` its largest value (the bits ``qmax_bits`` as float32), ``emax`` and
    ``emin`` the exponents of its largest and smallest normal binades."""

    name: str
    ebits: int
    mbits: int
    bias: int
    qmax: float
    qmax_bits: int

    @property
    def bits(self) -> int:
        """Bits per code (sign included)."""
        return 1 + self.ebits + self.mbits

    @property
    def emax(self) -> int:
        return (1 << self.ebits) - 1 - self.bias

    @property
    def emin(self) -> int:
        return 1 - self.bias


E2M1 = ElementFormat("e2m1", ebits=2, mbits=1, bias=1, qmax=6.0, qmax_bits=0x40C00000)
E3M2 = ElementFormat("e3m2", ebits=3, mbits=2, bias=3, qmax=28.0, qmax_bits=0x41E00000)
E2M3 = ElementFormat("e2m3", ebits=2, mbits=3, bias=1, qmax=7.5, qmax_bits=0x40F00000)
FORMATS: dict[str, ElementFormat] = {"e2m1": E2M1, "e3m2": E3M2, "e2m3": E2M3}


def get_format(name: str) -> ElementFormat:
    """The :class:`ElementFormat` called ``name`` ("e2m1", "e3m2" or "e2m3")."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown element format {name!r}; expected 'e2m1', 'e3m2' or 'e2m3'"
        ) from None


@njit(inline="always")
def bits_to_code(bits, ebits, mbits, bias, qmax_bits):
    """Saturating RNE conversion of float32 ``bits`` (uint32) to an element code (uint8).

    The normal range rounds the 23-bit mantissa to ``mbits`` (a carry runs into the
    exponent, as rounding up to the next binade needs) and re-biases the exponent; the
    subnormal range shifts the 24-bit significand right by ``151 - bias - mbits - e``
    (at least 22 there), capped at 31, which also covers float32 zeros and subnormals.
    """
    nbits = ebits + mbits
    sign = (bits >> np.uint32(31 - nbits)) & np.uint32(1 << nbits)
    a = bits & _ABS_MASK
    ac = a if a < qmax_bits else np.uint32(qmax_bits)
    shift = np.uint32(23 - mbits)
    half = (_U1 << (shift - _U1)) - _U1
    normal = ((ac + half + ((ac >> shift) & _U1)) >> shift) - np.uint32((127 - bias) << mbits)
    e = ac >> np.uint32(23)
    m = (ac & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
    sshift = np.uint32(151 - bias - mbits) - e  # wraps around for normals: unused there
    sshift = sshift if sshift < np.uint32(31) else np.uint32(31)
    shalf = ((_U1 << sshift) >> _U1) - _U1
    sub = (m + shalf + ((m >> sshift) & _U1)) >> sshift
    code = normal if ac >= np.uint32((128 - bias) << 23) else sub
    return np.uint8(code | sign)


@njit(nogil=True, cache=True)
def _encode_array(bits, ebits, mbits, bias, qmax_bits, out):
    for i in range(bits.size):
        out[i] = bits_to_code(bits[i], ebits, mbits, bias, qmax_bits)


def encode(x: np.ndarray, fmt: str) -> np.ndarray:
    """float32 values -> element codes (uint8), with the kernels' saturating RNE."""
    f = get_format(fmt)
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(x.size, dtype=np.uint8)
    _encode_array(x.view(np.uint32), f.ebits, f.mbits, f.bias, np.uint32(f.qmax_bits), out)
    return out


def decode_table(fmt: str | ElementFormat) -> np.ndarray:
    """The float32 value of each of the ``2^bits`` codes of ``fmt``, from its definition."""
    f = get_format(fmt) if isinstance(fmt, str) else fmt
    n = 1 << f.bits
    table = np.empty(n, dtype=np.float32)
    for code in range(n):
        sign = -1.0 if code >> (f.ebits + f.mbits) else 1.0
        e = (code >> f.mbits) & ((1 << f.ebits) - 1)
        m = code & ((1 << f.mbits) - 1)
        if e == 0:
            value = m * 2.0 ** (f.emin - f.mbits)
        else:
            value = (1.0 + m / 2.0**f.mbits) * 2.0 ** (e - f.bias)
        table[code] = sign * value
    table.setflags(write=False)
    return table


TABLES: dict[str, np.ndarray] = {name: decode_table(f) for name, f in FORMATS.items()}


def decode(codes: np.ndarray, fmt: str) -> np.ndarray:
    """Element codes (uint8) -> float32 (exact)."""
    return TABLES[get_format(fmt).name][np.asarray(codes, dtype=np.uint8)]
