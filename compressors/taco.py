"""The taco codec: FP8 with an Adaptive Scale-Hadamard transform and dual scales (TACO).

Per group of ``G`` elements (the last one zero-padded): a pre-rotation scale
``alpha = clamp(Qmax / sqrt(mean(x^2) + 1e-6), 1e-3, 1e3)`` (ASH), a Walsh-Hadamard
rotation that spreads outliers over the group, a post-rotation absmax scale ``s`` (DS), and
saturating round-to-nearest-even FP8 (E4M3 by default). The payload is
``[K*G fp8 codes][K float32 s][K float32 alpha]``, 1.0625 bytes per element at G = 128.
DESIGN.md gives the math and FORMAT.md the exact float32 arithmetic; a group holding NaN
or ±Inf decodes to NaN as a whole.

Range: COCCL's clamps of alpha and s fit groups whose absmax lies within about
1e-11 .. 4e11 (e4m3; e5m2 1e-9 .. 5e13); beyond, s would clamp, and the group would flush
toward zero or saturate. Such a group takes an extended range instead (FORMAT.md, taco
step 4b): its values are scaled by a power of two and s is left unclamped, so that every
finite float32 group round-trips within the codec's error bound. ``coccl_clamps=True``
keeps COCCL's arithmetic bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _dispatch, fp8, gpu_kernels
from .base import LOSSY_ABS_ERROR_FLOOR, Compressor, register_compressor
from .layout import check_group_size, taco_nbytes


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


@register_compressor
class TacoCompressor(Compressor):
    """TACO FP8 compression (COCCL's defaults: E4M3, G = 128, ASH and dual scales).

    With ``dual_scale`` (the default) every group of finite float32 or bfloat16 values, from
    the smallest subnormal to ``FLT_MAX``, round-trips within ``rel_error_bound`` (plus
    ``abs_error_floor`` per element, which only subnormal groups notice). float16 data
    converts to float32 exactly; float64 data is rounded to float32 first, so a value of
    magnitude ``2^128 - 2^103`` (about 3.4e38) or more becomes ±Inf and its whole group
    decodes to NaN, visibly. A decoded value beyond the output dtype's largest finite value
    (float16's 65504, bfloat16's ~3.39e38; only possible within the codec's error of that
    value) rounds to ±Inf there; float32 outputs saturate at ±FLT_MAX instead.

    Args:
        fp8_format: ``"e4m3"`` (Qmax 448, 3 mantissa bits) or ``"e5m2"`` (Qmax 57344).
        group_size: elements per group, a power of two from 32 to 512.
        ash: the Adaptive Scale-Hadamard pre-rotation (False: plain per-group FP8).
        dual_scale: the post-rotation absmax scale. False (an ablation, as in COCCL):
            ``s = 1``, only ``alpha``; values beyond ±Qmax saturate, and groups far from
            unit scale saturate or flush to zero (its bound, 1, allows both).
        coccl_clamps: True reproduces COCCL's clamps (alpha in [1e-3, 1e3], s in
            [1e-12, 1e6]) bit for bit: groups whose absmax lies outside about
            1e-11 .. 4e11 (e4m3) then flush toward zero or saturate near 1e12 instead of
            taking the extended range. For comparisons with COCCL; decoding is the same
            either way.

    Example:
        >>> import numpy as np
        >>> from coccl.compressors import TacoCompressor
        >>> c = TacoCompressor()  # e4m3, G = 128
        >>> x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
        >>> payload = c.encode(x)  # 8 groups: 1024 codes, 8 s and 8 alpha
        >>> payload.size
        1088
        >>> y = c.decode(payload, count=x.size, dtype=np.float32)
        >>> bool(np.linalg.norm(y - x) <= c.rel_error_bound * np.linalg.norm(x))
        True
        >>> tiny = x * np.float32(1e-40)  # subnormal float32: still within the bound
        >>> z = c.decode(c.encode(tiny), count=x.size, dtype=np.float32)
        >>> err = np.linalg.norm(z.astype(np.float64) - tiny)
        >>> bool(err <= c.rel_error_bound * np.linalg.norm(tiny.astype(np.float64))
        ...      + np.sqrt(x.size) * c.abs_error_floor)
        True
    """

    codec_id = "taco"
    abs_error_floor = LOSSY_ABS_ERROR_FLOOR

    def __init__(
        self,
        *,
        fp8_format: str = "e4m3",
        group_size: int = 128,
        ash: bool = True,
        dual_scale: bool = True,
        coccl_clamps: bool = False,
    ) -> None:
        if not isinstance(fp8_format, str):
            raise TypeError(f"fp8_format must be a string, got {fp8_format!r}")
        if fp8_format not in fp8.FORMATS:
            raise ValueError(f"fp8_format must be 'e4m3' or 'e5m2', got {fp8_format!r}")
        self.fp8_format = fp8_format
        self.group_size = check_group_size(group_size)
        self.ash = _check_bool("ash", ash)
        self.dual_scale = _check_bool("dual_scale", dual_scale)
        self.coccl_clamps = _check_bool("coccl_clamps", coccl_clamps)

    def get_config(self) -> dict[str, Any]:
        return {
            "id": self.codec_id,
            "fp8_format": self.fp8_format,
            "group_size": self.group_size,
            "ash": self.ash,
            "dual_scale": self.dual_scale,
            "coccl_clamps": self.coccl_clamps,
        }

    @property
    def alignment(self) -> int:
        return self.group_size

    @property
    def rel_error_bound(self) -> float:  # type: ignore[override]
        """Worst-case relative L2 error of one group's roundtrip.

        With ``dual_scale`` the group's largest coefficient maps to ``R = Qmax``. FP8
        rounding errs by at most ``2^-(mbits+1)`` relative in the normal range and by at
        most half the smallest subnormal ``2^-(bias+mbits)`` absolute below it, so the
        error norm is at most ``sqrt(2^-2(mbits+1) ||u||^2 + G 2^-2(bias+mbits))`` with
        ``||u|| >= R``; the rotation is orthonormal and ``alpha`` cancels, so the same holds
        for the group. The factor covers float32 arithmetic (~(log2 G + 6) 2^-24) and the
        rounding of float64 input to float32 (2^-24). It holds for every finite group (with
        ``abs_error_floor``), or with ``coccl_clamps`` for groups whose absmax lies within
        about 1e-11 .. 4e11 (e4m3; e5m2 1e-9 .. 5e13), where s stays inside COCCL's clamps.

        Without ``dual_scale`` values beyond ±Qmax saturate and groups far from unit
        scale flush to zero; each code errs by at most its own magnitude (zero is always
        representable), so the bound is only 1.
        """
        f = fp8.get_format(self.fp8_format)
        if not self.dual_scale:
            return 1.0 + 1e-4
        rel2 = (
            2.0 ** (-2 * (f.mbits + 1))
            + self.group_size * 2.0 ** (-2 * (f.bias + f.mbits)) / f.qmax**2
        )
        return math.sqrt(rel2) * (1.0 + 1e-4)

    @property
    def rel_error_typical(self) -> float:  # type: ignore[override]
        """Relative L2 roundtrip error on Gaussian N(0, 1) data (measured at G = 128;
        over G = 32..512 it varies by up to 7 % of itself)."""
        return _TYPICAL[(self.fp8_format, self.ash, self.dual_scale)]

    def encoded_nbytes(self, count: int, dtype: Any) -> int:
        count, _ = self.size_args(count, dtype)
        return taco_nbytes(count, self.group_size, self.ash, self.dual_scale)

    def _kernel_options(self) -> dict[str, Any]:
        # What decoding needs; encoding also takes coccl_clamps.
        return {
            "group_size": self.group_size,
            "fp8_format": self.fp8_format,
            "ash": self.ash,
            "dual_scale": self.dual_scale,
        }

    def reduce_encode_kernel(self, like: Any, dtype: np.dtype) -> Any:
        return gpu_kernels.ring_hop(
            like,
            dtype,
            gpu_kernels.taco_reduce_encode,
            **self._kernel_options(),
            coccl_clamps=self.coccl_clamps,
        )

    def encode_into(self, x: Any, payload: Any, dtype: np.dtype) -> None:
        _dispatch.encode(
            "taco_encode", x, payload, **self._kernel_options(), coccl_clamps=self.coccl_clamps
        )

    def decode_into(self, payload: Any, out: Any, dtype: np.dtype, accumulate: bool) -> None:
        _dispatch.decode("taco_decode", payload, out, accumulate, **self._kernel_options())


# Relative L2 error of one roundtrip on Gaussian N(0, 1) data, 2^22 elements, G = 128,
# seed 0, keyed by (fp8_format, ash, dual_scale).
_TYPICAL = {
    ("e4m3", True, True): 0.0257,
    ("e4m3", True, False): 0.386,  # alpha puts the RMS at Qmax: a third of values saturate
    ("e4m3", False, True): 0.0257,
    ("e4m3", False, False): 0.0265,
    ("e5m2", True, True): 0.0513,
    ("e5m2", True, False): 0.0528,
    ("e5m2", False, True): 0.0513,
    ("e5m2", False, False): 0.0529,
}
