"""The mx codec: microscaled FP4/FP6 elements with a shared scale per block (OCP MX, NVFP4).

Per block of ``B`` elements (16 or 32; the last one zero-padded) one scale byte and ``B``
element codes (FP4 E2M1, FP6 E3M2 or E2M3, round to nearest even, saturating):

* ``scale="e8m0"`` (OCP Microscaling Formats v1.0): the scale is the power of two
  ``X = 2^(floor(log2(amax)) - emax)``, ``emax`` the exponent of the element format's
  largest binade, clamped to E8M0's 2^-127..2^127; elements are ``x / X``. MXFP4 is
  ``element="e2m1", block=32``, MXFP6 ``element="e3m2"`` or ``"e2m3"``.
* ``scale="e4m3"`` (NVIDIA's NVFP4 with ``element="e2m1", block=16``): a float32 scale
  ``S`` per payload (the payload must be self-contained: it stands for NVFP4's per-tensor
  scale) and an E4M3 scale per block, ``sb = e4m3(amax / S / qmax)``; elements are
  ``x / (sb * S)``.

A block holding NaN or ±Inf gets the NaN scale code (E8M0 0xFF, E4M3 0x7F) and decodes
to NaN as a whole. FORMAT.md pins the arithmetic and the payload layout
(``[K*B packed codes][K scale bytes][float32 S, e4m3 only]``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _dispatch, minifloat
from .base import LOSSY_ABS_ERROR_FLOOR, Compressor, register_compressor
from .mx_layout import BLOCK_SIZES, mx_layout

SCALES = ("e8m0", "e4m3")


def check_element(element: Any) -> minifloat.ElementFormat:
    """The element format named by a codec's ``element`` option (TypeError/ValueError)."""
    if not isinstance(element, str):
        raise TypeError(f"element must be a string, got {element!r}")
    return minifloat.get_format(element)


@register_compressor
class MxCompressor(Compressor):
    """Microscaled floating point: FP4/FP6 elements, a shared scale per 16 or 32 of them.

    With ``scale="e8m0"`` every block of finite float32 or bfloat16 values, from the
    smallest subnormal to ``FLT_MAX``, round-trips within ``rel_error_bound`` plus
    ``abs_error_floor`` per element (the floor is half an element step at E8M0's smallest
    scale 2^-127: blocks below about 2^-125 cannot get a smaller scale). float64 input is
    rounded to float32 first (beyond its range: ±Inf, a NaN block).

    With ``scale="e4m3"`` the bound holds for the blocks whose absmax is at least
    ``2^-6 / 448`` of the payload's largest finite ``|x|`` (E4M3's normal range); a smaller
    block beside a large one errs by at most ``rel_error_bound * ||x|| + sqrt(n) *
    2^-10 * S * qmax`` (:meth:`payload_floor`): NVFP4's two-level scale covers about
    2^15 within one payload, and blocks far below it lose precision or flush to zero.

    Args:
        element: ``"e2m1"`` (FP4, max 6), ``"e3m2"`` (FP6, max 28) or ``"e2m3"`` (FP6,
            max 7.5).
        block: elements per shared scale, 32 (MX) or 16 (NVFP4).
        scale: ``"e8m0"`` (MX: a power of two) or ``"e4m3"`` (NVFP4: E4M3 times a float32
            per-payload scale).

    Example:
        >>> import numpy as np
        >>> from coccl.compressors import MxCompressor
        >>> c = MxCompressor()  # MXFP4: e2m1, block 32, e8m0
        >>> x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
        >>> payload = c.encode(x)  # 32 blocks: 32 * 16 code bytes + 32 scale bytes
        >>> payload.size
        544
        >>> y = c.decode(payload, count=x.size, dtype=np.float32)
        >>> bool(np.linalg.norm(y - x) <= c.rel_error_bound * np.linalg.norm(x))
        True
        >>> nv = MxCompressor(element="e2m1", block=16, scale="e4m3")  # NVFP4
        >>> nv.encoded_nbytes(1000, np.float32)  # 63 * 8 code bytes, 63 scales, S
        571
    """

    codec_id = "mx"

    def __init__(self, *, element: str = "e2m1", block: int = 32, scale: str = "e8m0") -> None:
        self._format = check_element(element)
        self.element = element
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
            raise TypeError(f"block must be an int, got {block!r}")
        if int(block) not in BLOCK_SIZES:
            raise ValueError(f"block must be 16 or 32, got {block!r}")
        self.block = int(block)
        if not isinstance(scale, str):
            raise TypeError(f"scale must be a string, got {scale!r}")
        if scale not in SCALES:
            raise ValueError(f"scale must be 'e8m0' or 'e4m3', got {scale!r}")
        self.scale = scale

    def get_config(self) -> dict[str, Any]:
        return {
            "id": self.codec_id,
            "element": self.element,
            "block": self.block,
            "scale": self.scale,
        }

    @property
    def alignment(self) -> int:
        return self.block

    @property
    def payload_scoped(self) -> bool:  # type: ignore[override]
        """With ``scale="e4m3"`` a block's scale is relative to the payload's float32
        ``S``, from the largest block of the whole payload: where payloads are cut changes
        the result. E8M0 scales are per block alone."""
        return self.scale == "e4m3"

    @property
    def rel_error_bound(self) -> float:  # type: ignore[override]
        """Worst-case relative L2 error of one block's roundtrip.

        An element in the normal range errs by at most ``2^-(m+1)`` of itself (RNE with
        ``m`` mantissa bits; the clipping of values above ``qmax`` stays within that, since
        the largest scaled value is below ``2^(emax+1)`` (E8M0) or ``qmax / (1 - 2^-4)``
        (E4M3)), one below it by half the smallest subnormal step ``2^(emin-m-1)`` (in
        element units). The block's largest element is at least ``2^emax`` (E8M0) or
        ``qmax / (1 + 2^-4)`` (E4M3's rounding of the block scale), which bounds the
        second term by the block's norm. The factor covers the float32 arithmetic.
        """
        f = self._format
        lo = 2.0**f.emax if self.scale == "e8m0" else f.qmax / (1 + 2.0**-4)
        rel2 = 2.0 ** (-2 * (f.mbits + 1)) + self.block * (2.0 ** (f.emin - f.mbits - 1) / lo) ** 2
        return math.sqrt(rel2) * (1.0 + 1e-4)

    @property
    def abs_error_floor(self) -> float:  # type: ignore[override]
        """Per-element absolute floor: half an element step at the smallest block scale
        (E8M0's 2^-127; for E4M3, ``2^-10 * qmax * 2^-126`` at the smallest S), plus the
        float32 rounding of the input and the output (``LOSSY_ABS_ERROR_FLOOR``)."""
        f = self._format
        if self.scale == "e8m0":
            return 2.0 ** (f.emin - f.mbits - 1 - 127) + LOSSY_ABS_ERROR_FLOOR
        return f.qmax * 2.0**-136 + LOSSY_ABS_ERROR_FLOOR

    def payload_floor(self, payload_amax: float) -> float:
        """The per-element absolute floor of a block in a payload whose largest finite
        ``|x|`` is ``payload_amax`` (``scale="e4m3"``; with e8m0 it is ``abs_error_floor``)."""
        if self.scale == "e8m0":
            return self.abs_error_floor
        s = max(float(np.float32(payload_amax) / np.float32(448.0 * self._format.qmax)), 2.0**-126)
        return max(2.0**-10 * self._format.qmax * s * (1 + 1e-4), self.abs_error_floor)

    @property
    def rel_error_typical(self) -> float:  # type: ignore[override]
        """Relative L2 roundtrip error on Gaussian N(0, 1) data (measured: see _TYPICAL)."""
        return _TYPICAL[(self.element, self.block, self.scale)]

    def encoded_nbytes(self, count: int, dtype: Any) -> int:
        count, _ = self.size_args(count, dtype)
        f = self._format
        return mx_layout(count, self.block, f.bits, self.scale == "e4m3").nbytes

    def _options(self) -> dict[str, Any]:
        return {"element": self.element, "block": self.block, "scale": self.scale}

    def encode_into(self, x: Any, payload: Any, dtype: np.dtype) -> None:
        _dispatch.encode("mx:mx_encode", x, payload, **self._options())

    def decode_into(self, payload: Any, out: Any, dtype: np.dtype, accumulate: bool) -> None:
        _dispatch.decode("mx:mx_decode", payload, out, accumulate, **self._options())


# Relative L2 error of one roundtrip on Gaussian N(0, 1) data, 2^20 elements, seed 0,
# keyed by (element, block, scale).
_TYPICAL: dict[tuple[str, int, str], float] = {
    ("e2m1", 32, "e8m0"): 0.115,
    ("e2m1", 32, "e4m3"): 0.102,
    ("e2m1", 16, "e8m0"): 0.118,
    ("e2m1", 16, "e4m3"): 0.0950,
    ("e3m2", 32, "e8m0"): 0.0540,
    ("e3m2", 32, "e4m3"): 0.0491,
    ("e3m2", 16, "e8m0"): 0.0551,
    ("e3m2", 16, "e4m3"): 0.0467,
    ("e2m3", 32, "e8m0"): 0.0284,
    ("e2m3", 32, "e4m3"): 0.0262,
    ("e2m3", 16, "e8m0"): 0.0282,
    ("e2m3", 16, "e4m3"): 0.0258,
}
